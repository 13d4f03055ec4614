/* hlo_extern.c: functions from outside the builder (hlo.h's "functions from
 * StableHLO text"): a StableHLO module written elsewhere (JAX's export, or by
 * hand) is parsed once into a tpu_hlo_fn, and a module being built calls its
 * @main through a generic "func.call", with the function's definitions
 * appended after the builder's @main.
 *
 * The text may be in pretty or generic form; it is not re-parsed as MLIR
 * here, only scanned as tokens:
 *   - `loc(...)` groups, `#locN = ...` alias lines and `//` comments go
 *     (locations name the writer's files, which would change the program's
 *     text, and so its cache key, from one checkout to another);
 *   - the module wrapper (its name and attributes) goes; its body may hold
 *     only func.func definitions, each kept as written;
 *   - every symbol a definition defines (never another, such as a custom
 *     call's target @tpu_custom_call) and every other top-level alias
 *     (#name = ..., !name = ...) is renamed with a prefix made from the hash
 *     of the text, so two functions never clash and the same text always gives
 *     the same program; string contents are never touched;
 *   - every definition becomes private, and @main's signature is written anew
 *     from its parsed types (its argument and result attributes, such as
 *     jax.result_info or shardings, go).
 * A variant for another target (the TPU form of a Pallas kernel, a Mosaic
 * custom call only the TPU compiler compiles) is parsed the same way with the
 * same prefix, and must have the same signature; tpu_hlo_retarget swaps it
 * into a finished program's text.
 */
#define _GNU_SOURCE /* memmem */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hlo_impl.h"

#define TPU_FN_MAX_SYMS 1024

typedef struct {
  char *text;    /* owned: the renamed private definitions */
  char *prelude; /* owned: the renamed aliases, one a line ("" if none) */
} tpu_fn_body;

struct tpu_hlo_fn {
  uint64_t hash;
  char prefix[24]; /* "x<16 hex digits>_" */
  int nargs, nres;
  tpu_hlo_type *args, *res; /* owned */
  tpu_fn_body main;
  char target[16]; /* the variant's target, "" if none */
  tpu_fn_body variant;
};

/* ---- scanning ----------------------------------------------------------------- */

typedef struct {
  const char *p;
  size_t n, i;
} tpu_scan;

static bool tpu_ident_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '$' || c == '.'; }

/* The end of the string literal opening at s[i] ('"'), or 0 if unterminated. */
static size_t tpu_string_end(const char *s, size_t n, size_t i) {
  for (size_t j = i + 1; j < n; j++) {
    if (s[j] == '\\') {
      j++;
      continue;
    }
    if (s[j] == '"') return j + 1;
  }
  return 0;
}

static tpu_status *tpu_unterminated(void) {
  return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: the text has an unterminated string");
}

/* Step 1: the text without locations, loc aliases and comments. */
static tpu_status *tpu_strip(const char *s, size_t n, tpu_buf *out, tpu_hlo *m) {
  size_t i = 0;
  bool line_start = true;
  while (i < n) {
    char c = s[i];
    if (line_start) {
      size_t j = i;
      while (j < n && (s[j] == ' ' || s[j] == '\t')) j++;
      if (j + 4 <= n && strncmp(s + j, "#loc", 4) == 0 &&
          (j + 4 == n || !tpu_ident_char(s[j + 4]) || isdigit((unsigned char)s[j + 4]))) {
        while (j < n && s[j] != '\n') {
          if (s[j] == '"') {
            size_t e = tpu_string_end(s, n, j);
            if (!e) return tpu_unterminated();
            j = e;
          } else {
            j++;
          }
        }
        i = j < n ? j + 1 : n;
        continue;
      }
      line_start = false;
    }
    if (c == '\n') line_start = true;
    if (c == '"') {
      size_t e = tpu_string_end(s, n, i);
      if (!e) return tpu_unterminated();
      tpu_hloi_buf_put(m, out, s + i, e - i);
      i = e;
      continue;
    }
    if (c == '/' && i + 1 < n && s[i + 1] == '/') {
      while (i < n && s[i] != '\n') i++;
      continue;
    }
    if (c == 'l' && i + 4 <= n && strncmp(s + i, "loc(", 4) == 0 && (i == 0 || !tpu_ident_char(s[i - 1]))) {
      size_t j = i + 4;
      int depth = 1;
      while (j < n && depth) {
        if (s[j] == '"') {
          size_t e = tpu_string_end(s, n, j);
          if (!e) return tpu_unterminated();
          j = e;
          continue;
        }
        depth += s[j] == '(' ? 1 : s[j] == ')' ? -1 : 0;
        j++;
      }
      if (depth) return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: unbalanced parentheses in a loc(...)");
      while (out->n && out->p[out->n - 1] == ' ') out->p[--out->n] = 0;
      i = j;
      continue;
    }
    tpu_hloi_buf_put(m, out, &c, 1);
    i++;
  }
  if (m->oom) return tpu_status_new(TPU_ERR_MEMORY, "out of memory reading StableHLO text");
  return NULL;
}

static void tpu_skip_ws(tpu_scan *sc) {
  while (sc->i < sc->n && isspace((unsigned char)sc->p[sc->i])) sc->i++;
}

static bool tpu_eat(tpu_scan *sc, const char *word) {
  tpu_skip_ws(sc);
  size_t k = strlen(word);
  if (sc->i + k > sc->n || strncmp(sc->p + sc->i, word, k) != 0) return false;
  if (tpu_ident_char(word[k - 1]) && sc->i + k < sc->n && tpu_ident_char(sc->p[sc->i + k])) return false;
  sc->i += k;
  return true;
}

/* Past the group opening at sc->i, strings skipped: any of ( [ { < nested
 * (braces_only false), or braces alone (a body holds other characters
 * unbalanced: comparisons, arrows). */
static bool tpu_skip_nested(tpu_scan *sc, bool braces_only) {
  int depth = 0;
  while (sc->i < sc->n) {
    char c = sc->p[sc->i];
    if (c == '"') {
      size_t e = tpu_string_end(sc->p, sc->n, sc->i);
      if (!e) return false;
      sc->i = e;
      continue;
    }
    if (braces_only) {
      depth += c == '{' ? 1 : c == '}' ? -1 : 0;
    } else {
      if (c == '(' || c == '[' || c == '{' || c == '<') depth++;
      if (c == ')' || c == ']' || c == '}' || (c == '>' && !(sc->i && sc->p[sc->i - 1] == '-'))) depth--;
    }
    sc->i++;
    if (depth == 0) return true;
  }
  return false;
}

static bool tpu_skip_group(tpu_scan *sc) { return tpu_skip_nested(sc, false); }
static bool tpu_skip_braces(tpu_scan *sc) { return tpu_skip_nested(sc, true); }

/* A symbol name after '@': its span, bare identifiers only. */
static bool tpu_symbol(tpu_scan *sc, size_t *b, size_t *e) {
  tpu_skip_ws(sc);
  if (sc->i >= sc->n || sc->p[sc->i] != '@') return false;
  size_t j = sc->i + 1;
  if (j >= sc->n || !(isalpha((unsigned char)sc->p[j]) || sc->p[j] == '_')) return false;
  while (j < sc->n && tpu_ident_char(sc->p[j])) j++;
  *b = sc->i + 1;
  *e = j;
  sc->i = j;
  return true;
}

/* ---- types ------------------------------------------------------------------------ */

static tpu_status *tpu_bad_type(const char *what, const char *s, size_t n) {
  return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: %s type %.*s is not supported (a tensor of static shape is)",
                        what, (int)(n > 120 ? 120 : n), s);
}

/* "tensor<4x8xf32>" at sc->i into t. */
static tpu_status *tpu_parse_type(tpu_scan *sc, const char *what, tpu_hlo_type *t) {
  tpu_skip_ws(sc);
  size_t b = sc->i;
  if (!tpu_eat(sc, "tensor")) {
    size_t e = b;
    while (e < sc->n && !isspace((unsigned char)sc->p[e]) && sc->p[e] != ',' && sc->p[e] != ')') e++;
    return tpu_bad_type(what, sc->p + b, e - b);
  }
  size_t open = sc->i;
  if (open >= sc->n || sc->p[open] != '<' || !tpu_skip_group(sc)) return tpu_bad_type(what, sc->p + b, sc->i - b);
  const char *in = sc->p + open + 1;
  size_t len = sc->i - open - 2, k = 0;
  memset(t, 0, sizeof *t);
  for (;;) {
    size_t j = k;
    while (j < len && isdigit((unsigned char)in[j])) j++;
    if (j == k || j >= len || in[j] != 'x') break;
    if (t->rank == TPU_MAX_RANK) return tpu_bad_type(what, sc->p + b, sc->i - b);
    t->dims[t->rank++] = strtoll(in + k, NULL, 10);
    k = j + 1;
  }
  for (int d = TPU_INVALID + 1; d < TPU_NUM_DTYPES; d++) {
    const char *nm = tpu_dtype_mlir((tpu_dtype)d);
    if (strlen(nm) == len - k && strncmp(nm, in + k, len - k) == 0) {
      t->dtype = (tpu_dtype)d;
      return NULL;
    }
  }
  return tpu_bad_type(what, sc->p + b, sc->i - b);
}

/* "(%a: T {attrs}, ...)" or, for results, "T", "(T {attrs}, ...)", "()". */
static tpu_status *tpu_parse_list(tpu_scan *sc, bool named, const char *what, tpu_hlo_type **types, int *count,
                                  tpu_buf *names, tpu_hlo *m) {
  *types = NULL;
  *count = 0;
  int cap = 0;
  tpu_skip_ws(sc);
  bool paren = sc->i < sc->n && sc->p[sc->i] == '(';
  if (named && !paren) return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: expected '(' after the function's name");
  if (paren) sc->i++;
  tpu_skip_ws(sc);
  if (paren && sc->i < sc->n && sc->p[sc->i] == ')') {
    sc->i++;
    return NULL;
  }
  for (;;) {
    if (named) {
      tpu_skip_ws(sc);
      size_t b = sc->i;
      if (b >= sc->n || sc->p[b] != '%')
        return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: expected an argument name");
      while (sc->i < sc->n && sc->p[sc->i] != ':' && !isspace((unsigned char)sc->p[sc->i])) sc->i++;
      tpu_hloi_buf_put(m, names, sc->p + b, sc->i - b);
      tpu_hloi_buf_put(m, names, "", 1); /* NUL-separated */
      if (!tpu_eat(sc, ":")) return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: expected ':' after an argument name");
    }
    if (*count == cap) {
      cap = cap ? 2 * cap : 8;
      tpu_hlo_type *q = realloc(*types, sizeof *q * (size_t)cap);
      if (!q) return tpu_status_new(TPU_ERR_MEMORY, "out of memory reading StableHLO text");
      *types = q;
    }
    tpu_status *s = tpu_parse_type(sc, what, &(*types)[*count]);
    if (s) return s;
    ++*count;
    if (!paren) return NULL;
    tpu_skip_ws(sc);
    if (sc->i < sc->n && sc->p[sc->i] == '{' && !tpu_skip_braces(sc))
      return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: unbalanced attributes");
    if (tpu_eat(sc, ",")) continue;
    if (tpu_eat(sc, ")")) return NULL;
    return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: expected ',' or ')' in a function signature");
  }
}

/* ---- the module's structure -------------------------------------------------------- */

typedef struct {
  size_t b, e;           /* the definition's span: "func.func" ... its closing brace */
  size_t name_b, name_e; /* its name */
  size_t sig_e;          /* the end of its results */
  size_t body_b;         /* its body's '{' */
} tpu_fdef;

typedef struct {
  size_t name_b, name_e; /* the alias's name, its '#' or '!' included */
  size_t b, e;           /* the line */
} tpu_alias;

typedef struct {
  tpu_fdef defs[TPU_FN_MAX_SYMS];
  int ndefs;
  tpu_alias aliases[TPU_FN_MAX_SYMS];
  int naliases;
  int main_def;
} tpu_shape;

static tpu_status *tpu_find_structure(const char *s, size_t n, tpu_shape *sh) {
  tpu_scan sc = {s, n, 0};
  sh->ndefs = sh->naliases = 0;
  sh->main_def = -1;
  /* aliases, then "module [@name] [attributes {...}] {" or bare definitions */
  for (;;) {
    tpu_skip_ws(&sc);
    if (sc.i < n && (s[sc.i] == '#' || s[sc.i] == '!')) {
      if (sh->naliases == TPU_FN_MAX_SYMS) return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: too many aliases");
      tpu_alias *a = &sh->aliases[sh->naliases++];
      a->b = a->name_b = sc.i;
      sc.i++;
      while (sc.i < n && tpu_ident_char(s[sc.i])) sc.i++;
      a->name_e = sc.i;
      int depth = 0;
      while (sc.i < n && (depth || s[sc.i] != '\n')) {
        if (s[sc.i] == '"') {
          size_t e = tpu_string_end(s, n, sc.i);
          if (!e) return tpu_unterminated();
          sc.i = e;
          continue;
        }
        char c = s[sc.i];
        bool arrow = c == '>' && sc.i > 0 && s[sc.i - 1] == '-'; /* affine_map<(d0) -> (d0)> */
        if (c == '<' || c == '(' || c == '[' || c == '{') depth++;
        if ((c == '>' && !arrow) || c == ')' || c == ']' || c == '}') depth = depth > 0 ? depth - 1 : 0;
        sc.i++;
      }
      a->e = sc.i;
      continue;
    }
    break;
  }
  size_t body_e = n;
  if (tpu_eat(&sc, "module")) {
    size_t b, e;
    tpu_symbol(&sc, &b, &e);
    if (tpu_eat(&sc, "attributes")) {
      tpu_skip_ws(&sc);
      if (sc.i >= n || s[sc.i] != '{' || !tpu_skip_braces(&sc))
        return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: unbalanced module attributes");
    }
    tpu_skip_ws(&sc);
    size_t open = sc.i;
    if (open >= n || s[open] != '{' || !tpu_skip_braces(&sc))
      return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: expected the module's body in balanced braces");
    body_e = sc.i - 1;
    tpu_skip_ws(&sc);
    if (sc.i != n) return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: text after the module's closing brace");
    sc.i = open + 1;
  }
  for (;;) {
    tpu_skip_ws(&sc);
    if (sc.i >= body_e) break;
    size_t start = sc.i;
    if (!tpu_eat(&sc, "func.func")) {
      size_t e = start;
      while (e < body_e && !isspace((unsigned char)s[e])) e++;
      return tpu_status_new(TPU_ERR_VALUE,
                            "stablehlo_op: only func.func definitions may be at the top of the module, found '%.*s'",
                            (int)(e - start > 60 ? 60 : e - start), s + start);
    }
    if (sh->ndefs == TPU_FN_MAX_SYMS) return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: too many functions");
    tpu_fdef *d = &sh->defs[sh->ndefs];
    d->b = start;
    if (!tpu_eat(&sc, "public") && !tpu_eat(&sc, "private")) tpu_eat(&sc, "nested");
    if (!tpu_symbol(&sc, &d->name_b, &d->name_e))
      return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: expected a function name after func.func");
    /* the signature, the results, "attributes {...}", then the body */
    tpu_skip_ws(&sc);
    if (sc.i >= body_e || s[sc.i] != '(' || !tpu_skip_group(&sc))
      return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: unbalanced function signature");
    if (tpu_eat(&sc, "->")) {
      tpu_skip_ws(&sc);
      if (sc.i < body_e && s[sc.i] != '(') /* one result without attributes: an identifier and <...> */
        while (sc.i < body_e && tpu_ident_char(s[sc.i])) sc.i++;
      if (sc.i >= body_e || (s[sc.i] != '(' && s[sc.i] != '<') || !tpu_skip_group(&sc))
        return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: unbalanced function results");
    }
    tpu_skip_ws(&sc);
    d->sig_e = sc.i;
    if (tpu_eat(&sc, "attributes")) {
      tpu_skip_ws(&sc);
      if (sc.i >= body_e || s[sc.i] != '{' || !tpu_skip_braces(&sc))
        return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: unbalanced function attributes");
      tpu_skip_ws(&sc);
    }
    d->body_b = sc.i;
    if (sc.i >= body_e || s[sc.i] != '{' || !tpu_skip_braces(&sc) || sc.i > body_e)
      return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: function @%.*s has no body in balanced braces",
                            (int)(d->name_e - d->name_b), s + d->name_b);
    d->e = sc.i;
    for (int k = 0; k < sh->ndefs; k++)
      if (sh->defs[k].name_e - sh->defs[k].name_b == d->name_e - d->name_b &&
          memcmp(s + sh->defs[k].name_b, s + d->name_b, d->name_e - d->name_b) == 0)
        return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: function @%.*s is defined twice",
                              (int)(d->name_e - d->name_b), s + d->name_b);
    if (d->name_e - d->name_b == 4 && memcmp(s + d->name_b, "main", 4) == 0) sh->main_def = sh->ndefs;
    sh->ndefs++;
  }
  if (sh->main_def < 0) return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: the text defines no function @main");
  return NULL;
}

/* s[b, e) with the module's own symbols and aliases renamed. */
static void tpu_put_renamed(tpu_hlo *m, tpu_buf *out, const char *s, size_t b, size_t e, const tpu_shape *sh,
                            const char *prefix) {
  size_t i = b, run = b;
  while (i < e) {
    char c = s[i];
    if (c == '"') {
      size_t j = tpu_string_end(s, e, i);
      i = j ? j : e;
      continue;
    }
    if ((c == '@' || c == '#' || c == '!') && i + 1 < e && (isalpha((unsigned char)s[i + 1]) || s[i + 1] == '_') &&
        (i == 0 || !tpu_ident_char(s[i - 1]))) {
      size_t j = i + 1;
      while (j < e && tpu_ident_char(s[j])) j++;
      bool ours = false;
      if (c == '@') {
        for (int k = 0; k < sh->ndefs && !ours; k++)
          ours = sh->defs[k].name_e - sh->defs[k].name_b == j - i - 1 &&
                 memcmp(s + sh->defs[k].name_b, s + i + 1, j - i - 1) == 0;
      } else {
        for (int k = 0; k < sh->naliases && !ours; k++)
          ours = sh->aliases[k].name_e - sh->aliases[k].name_b == j - i &&
                 memcmp(s + sh->aliases[k].name_b, s + i, j - i) == 0;
      }
      if (ours) {
        tpu_hloi_buf_put(m, out, s + run, i + 1 - run);
        tpu_hloi_buf_put(m, out, prefix, strlen(prefix));
        run = i + 1;
      }
      i = j;
      continue;
    }
    i++;
  }
  tpu_hloi_buf_put(m, out, s + run, e - run);
}

/* Parse one text into body (renamed with prefix; an empty prefix: the
 * hash of the stripped text makes it, written to prefix) and @main's types. */
static tpu_status *tpu_fn_read(const char *text, size_t len, char prefix[24], uint64_t *hash, tpu_fn_body *body,
                               tpu_hlo_type **args, int *nargs, tpu_hlo_type **res, int *nres) {
  tpu_hlo *m = tpu_hlo_new(); /* only for its out-of-memory flag */
  tpu_shape *sh = malloc(sizeof *sh);
  tpu_buf clean = {0}, names = {0}, out = {0}, pre = {0};
  tpu_status *s = NULL;
  *args = *res = NULL;
  if (!m || !sh) {
    s = tpu_status_new(TPU_ERR_MEMORY, "out of memory reading StableHLO text");
    goto done;
  }
  if ((s = tpu_strip(text, len, &clean, m))) goto done;
  if (!clean.p) {
    s = tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: the text is empty");
    goto done;
  }
  if ((s = tpu_find_structure(clean.p, clean.n, sh))) goto done;
  if (!prefix[0]) {
    *hash = tpu_fnv1a(TPU_FNV_BASIS, clean.p, clean.n);
    snprintf(prefix, 24, "x%016llx_", (unsigned long long)*hash);
  }
  const tpu_fdef *md = &sh->defs[sh->main_def];
  tpu_scan sc = {clean.p, md->sig_e, md->name_e};
  if ((s = tpu_parse_list(&sc, true, "argument", args, nargs, &names, m))) goto done;
  *nres = 0;
  if (tpu_eat(&sc, "->") && (s = tpu_parse_list(&sc, false, "result", res, nres, NULL, m))) goto done;
  for (int k = 0; k < sh->naliases; k++) {
    const tpu_alias *a = &sh->aliases[k];
    tpu_put_renamed(m, &pre, clean.p, a->b, a->e, sh, prefix);
    tpu_hloi_buf_put(m, &pre, "\n", 1);
  }
  for (int k = 0; k < sh->ndefs; k++) {
    const tpu_fdef *d = &sh->defs[k];
    tpu_hloi_buf_printf(m, &out, "  func.func private @%s%.*s", prefix, (int)(d->name_e - d->name_b),
                        clean.p + d->name_b);
    if (k != sh->main_def) {
      tpu_put_renamed(m, &out, clean.p, d->name_e, d->e, sh, prefix);
    } else {
      const char *nm = names.p;
      tpu_hloi_buf_put(m, &out, "(", 1);
      for (int i = 0; i < *nargs; i++) {
        tpu_hloi_buf_printf(m, &out, "%s%s: ", i ? ", " : "", nm);
        tpu_hloi_put_type(m, &out, &(*args)[i]);
        nm += strlen(nm) + 1;
      }
      tpu_hloi_buf_put(m, &out, ") -> (", 6);
      for (int i = 0; i < *nres; i++) {
        if (i) tpu_hloi_buf_put(m, &out, ", ", 2);
        tpu_hloi_put_type(m, &out, &(*res)[i]);
      }
      tpu_hloi_buf_put(m, &out, ") ", 2);
      size_t body_b = md->body_b;
      tpu_put_renamed(m, &out, clean.p, body_b, md->e, sh, prefix);
    }
    tpu_hloi_buf_put(m, &out, "\n", 1);
  }
  if (m->oom) {
    s = tpu_status_new(TPU_ERR_MEMORY, "out of memory reading StableHLO text");
    goto done;
  }
  body->text = out.p;
  body->prelude = pre.p ? pre.p : calloc(1, 1);
  out.p = pre.p = NULL;
  if (!body->prelude) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory reading StableHLO text");
done:
  if (s) {
    free(*args);
    free(*res);
    *args = *res = NULL;
  }
  free(clean.p);
  free(names.p);
  free(out.p);
  free(pre.p);
  free(sh);
  tpu_hlo_free(m);
  return s;
}

static void tpu_body_free(tpu_fn_body *b) {
  free(b->text);
  free(b->prelude);
  b->text = b->prelude = NULL;
}

tpu_status *tpu_hlo_fn_parse(const char *text, size_t len, tpu_hlo_fn **out) {
  *out = NULL;
  tpu_hlo_fn *f = calloc(1, sizeof *f);
  if (!f) return tpu_status_new(TPU_ERR_MEMORY, "out of memory reading StableHLO text");
  tpu_status *s = tpu_fn_read(text, len, f->prefix, &f->hash, &f->main, &f->args, &f->nargs, &f->res, &f->nres);
  for (int i = 0; !s && i < f->nargs + f->nres; i++) {
    const tpu_hlo_type *t = i < f->nargs ? &f->args[i] : &f->res[i - f->nargs];
    if (!tpu_hloi_type_valid(t))
      s = tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: an invalid type in @main's signature");
  }
  if (s) {
    tpu_hlo_fn_free(f);
    return s;
  }
  *out = f;
  return NULL;
}

static bool tpu_types_eq(const tpu_hlo_type *a, const tpu_hlo_type *b, int n) {
  for (int i = 0; i < n; i++)
    if (!tpu_hlo_type_eq(&a[i], &b[i])) return false;
  return true;
}

tpu_status *tpu_hlo_fn_add_variant(tpu_hlo_fn *f, const char *target, const char *text, size_t len) {
  if (!target || !target[0] || strlen(target) >= sizeof f->target)
    return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: a variant's target must be a short name such as \"tpu\"");
  tpu_fn_body b = {0};
  tpu_hlo_type *args = NULL, *res = NULL;
  int nargs = 0, nres = 0;
  uint64_t h = 0;
  tpu_status *s = tpu_fn_read(text, len, f->prefix, &h, &b, &args, &nargs, &res, &nres);
  if (!s &&
      (nargs != f->nargs || nres != f->nres || !tpu_types_eq(args, f->args, nargs) || !tpu_types_eq(res, f->res, nres)))
    s = tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: the %s variant's @main has another signature", target);
  free(args);
  free(res);
  if (s) {
    tpu_body_free(&b);
    return s;
  }
  tpu_body_free(&f->variant);
  f->variant = b;
  snprintf(f->target, sizeof f->target, "%s", target);
  return NULL;
}

void tpu_hlo_fn_free(tpu_hlo_fn *f) {
  if (!f) return;
  free(f->args);
  free(f->res);
  tpu_body_free(&f->main);
  tpu_body_free(&f->variant);
  free(f);
}

int tpu_hlo_fn_nargs(const tpu_hlo_fn *f) { return f->nargs; }
int tpu_hlo_fn_nresults(const tpu_hlo_fn *f) { return f->nres; }
const tpu_hlo_type *tpu_hlo_fn_arg(const tpu_hlo_fn *f, int i) { return &f->args[i]; }
const tpu_hlo_type *tpu_hlo_fn_result(const tpu_hlo_fn *f, int i) { return &f->res[i]; }
uint64_t tpu_hlo_fn_hash(const tpu_hlo_fn *f) { return f->hash; }
const char *tpu_hlo_fn_text(const tpu_hlo_fn *f) { return f->main.text; }
bool tpu_hlo_fn_has_variant(const tpu_hlo_fn *f, const char *target) {
  return f->target[0] && target && strcmp(f->target, target) == 0;
}

/* ---- calls in a module being built ---------------------------------------------------- */

bool tpu_hlo_call(tpu_hlo *m, const tpu_hlo_fn *f, const tpu_hv *args, int n, tpu_hv *outs) {
  for (int i = 0; i < (f ? f->nres : 0); i++) outs[i] = TPU_HV_NONE;
  if (!tpu_hloi_check(m, args, n)) return false;
  if (!f || n != f->nargs) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "func.call: %d operands for a function of %d arguments", n, f ? f->nargs : -1);
    return false;
  }
  for (int i = 0; i < n; i++)
    if (!tpu_hlo_type_eq(&TY(args[i]), &f->args[i])) {
      char a[128], b[128];
      tpu_hlo_type_str(&TY(args[i]), a, sizeof a);
      tpu_hlo_type_str(&f->args[i], b, sizeof b);
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "func.call: operand %d is %s, the function takes %s", i, a, b);
      return false;
    }
  bool have = false;
  for (int i = 0; i < m->nexterns && !have; i++) have = m->externs[i] == f;
  if (!have) {
    if (m->nexterns == m->capexterns) {
      int cap = m->capexterns ? 2 * m->capexterns : 4;
      const tpu_hlo_fn **q = realloc(m->externs, sizeof *q * (size_t)cap);
      if (!q) {
        m->oom = true;
        return false;
      }
      m->externs = q;
      m->capexterns = cap;
    }
    m->externs[m->nexterns++] = f;
  }
  char attrs[64];
  snprintf(attrs, sizeof attrs, "callee = @%smain", f->prefix);
  return tpu_hlo_emit(m, "func.call", args, n, NULL, 0, attrs, f->res, f->nres, outs);
}

void tpu_hloi_extern_put_prelude(tpu_hlo *m, tpu_buf *b) {
  for (int i = 0; i < m->nexterns; i++)
    tpu_hloi_buf_put(m, b, m->externs[i]->main.prelude, strlen(m->externs[i]->main.prelude));
}

void tpu_hloi_extern_put(tpu_hlo *m, tpu_buf *b) {
  for (int i = 0; i < m->nexterns; i++)
    tpu_hloi_buf_put(m, b, m->externs[i]->main.text, strlen(m->externs[i]->main.text));
}

/* ---- retargeting a finished program ------------------------------------------------------ */

static bool tpu_replace(char **text, size_t *len, const char *old, const char *rep, bool prepend) {
  size_t ko = strlen(old), kr = strlen(rep);
  char *at = ko ? memmem(*text, *len, old, ko) : NULL;
  if (ko && !at) return true; /* not in this program */
  size_t pos = at ? (size_t)(at - *text) : 0;
  if (!at && !prepend) return true;
  char *q = malloc(*len - ko + kr + 1);
  if (!q) return false;
  memcpy(q, *text, pos);
  memcpy(q + pos, rep, kr);
  memcpy(q + pos + kr, *text + pos + ko, *len - pos - ko);
  *len = *len - ko + kr;
  q[*len] = 0;
  free(*text);
  *text = q;
  return true;
}

/* Each `"stablehlo.optimization_barrier"(x) {torchtpu.cpu_exact} : (T) -> T`
 * line becomes `"stablehlo.reshape"(x) : (T) -> T`, an identity XLA removes
 * (in place: the text only shrinks). */
static void tpu_drop_cpu_barriers(char *text, size_t *len) {
  static const char bar[] = "\"stablehlo.optimization_barrier\"(", rep[] = "\"stablehlo.reshape\"(",
                    attr[] = " {" TPU_HLO_CPU_EXACT "}";
  size_t r = 0, w = 0, n = *len, kb = sizeof bar - 1, ka = sizeof attr - 1;
  while (r < n) {
    char *nl = memchr(text + r, '\n', n - r);
    size_t end = nl ? (size_t)(nl - text) + 1 : n, ll = end - r;
    char *a = memmem(text + r, ll, attr, ka), *b = a ? memmem(text + r, ll, bar, kb) : NULL;
    if (a && b && b < a) {
      size_t pb = (size_t)(b - text), pa = (size_t)(a - text);
      memmove(text + w, text + r, pb - r); /* up to the op's name */
      w += pb - r;
      memcpy(text + w, rep, sizeof rep - 1);
      w += sizeof rep - 1;
      memmove(text + w, text + pb + kb, pa - pb - kb); /* its operands */
      w += pa - pb - kb;
      memmove(text + w, text + pa + ka, end - pa - ka); /* its types */
      w += end - pa - ka;
    } else {
      memmove(text + w, text + r, ll);
      w += ll;
    }
    r = end;
  }
  text[w] = 0;
  *len = w;
}

tpu_status *tpu_hlo_retarget(const char *text, size_t len, const tpu_hlo_fn *const *fns, int nfns, const char *target,
                             char **out, size_t *outlen) {
  *out = malloc(len + 1);
  *outlen = len;
  if (!*out) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  memcpy(*out, text, len);
  (*out)[len] = 0;
  if (target && strcmp(target, "tpu") == 0) tpu_drop_cpu_barriers(*out, outlen);
  for (int i = 0; i < nfns; i++) {
    const tpu_hlo_fn *f = fns[i];
    if (!f || !tpu_hlo_fn_has_variant(f, target) || !memmem(*out, *outlen, f->main.text, strlen(f->main.text)))
      continue;
    bool ok = tpu_replace(out, outlen, f->main.text, f->variant.text, false);
    if (ok && f->main.prelude[0]) ok = tpu_replace(out, outlen, f->main.prelude, "", false);
    if (ok && f->variant.prelude[0]) ok = tpu_replace(out, outlen, "", f->variant.prelude, true);
    if (!ok) {
      free(*out);
      *out = NULL;
      return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    }
  }
  return NULL;
}
