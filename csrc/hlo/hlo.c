/* hlo.c: the StableHLO builder's module (see hlo.h): types and the text
 * helpers, values and their scopes, parameters, finish (the text of @main),
 * the generic primitive every op is emitted through, and regions. The ops
 * are in the other hlo_*.c files (listed in hlo_impl.h).
 *
 * Text is MLIR generic form, which changes least across StableHLO versions.
 * Every value (parameter, op result, region argument) gets the next id and
 * is printed as %vN, so identical call sequences give identical text. Open
 * regions form a stack of text buffers; the innermost one receives new ops.
 * A closed region's text waits in a table until the op that owns it is
 * emitted, which splices it in.
 *
 * Value records live in fixed-size chunks that never move, so the pointer
 * tpu_hlo_typeof returns stays valid while the module lives. Each value
 * remembers the scope (main body or one region) that defines it; an operand
 * whose scope is no longer open (a region value used after its region was
 * closed) is an error here rather than an obscure parse error in XLA. Closed
 * regions keep their signature, which the op consuming them checks.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hlo_impl.h"

static const tpu_hlo_type tpu_hlo_invalid_type = {TPU_INVALID, 0, {0}};

/* ---- small helpers ---------------------------------------------------------------- */

void tpu_hloi_buf_put(tpu_hlo *m, tpu_buf *b, const char *s, size_t n) {
  if (m->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->n + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      m->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void tpu_hloi_buf_printf(tpu_hlo *m, tpu_buf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    tpu_hloi_buf_put(m, b, tmp, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) {
    m->oom = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  tpu_hloi_buf_put(m, b, big, (size_t)n);
  free(big);
}

static tpu_buf *tpu_cur(tpu_hlo *m) { return m->depth ? &m->stack[m->depth - 1].text : &m->body; }
static int tpu_cur_scope(const tpu_hlo *m) { return m->depth ? m->stack[m->depth - 1].scope : 0; }

/* A type the text can express: a known dtype, rank 0..TPU_MAX_RANK, dims >= 0. */
bool tpu_hloi_type_valid(const tpu_hlo_type *t) {
  if (t->dtype <= TPU_INVALID || t->dtype >= TPU_NUM_DTYPES || t->rank < 0 || t->rank > TPU_MAX_RANK) return false;
  for (int i = 0; i < t->rank; i++)
    if (t->dims[i] < 0) return false;
  return true;
}

tpu_hlo_type tpu_hlo_type_make(tpu_dtype dt, int rank, const int64_t *dims) {
  tpu_hlo_type t;
  memset(&t, 0, sizeof t);
  t.dtype = rank > TPU_MAX_RANK ? TPU_INVALID : dt; /* a type no op takes (tpu_hloi_type_valid), never a cut one */
  t.rank = rank < 0 ? 0 : (rank > TPU_MAX_RANK ? 0 : rank);
  for (int i = 0; i < t.rank; i++) t.dims[i] = dims[i];
  return t;
}

int64_t tpu_hlo_type_numel(const tpu_hlo_type *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->dims[i];
  return n;
}

bool tpu_hlo_type_eq(const tpu_hlo_type *a, const tpu_hlo_type *b) {
  return a->dtype == b->dtype && a->rank == b->rank && memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) == 0;
}

int tpu_hlo_type_str(const tpu_hlo_type *t, char *buf, size_t n) {
  size_t k = 0;
  int w = snprintf(buf, n, "tensor<");
  k = w > 0 ? (size_t)w : 0;
  for (int i = 0; i < t->rank; i++) {
    w = snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, "%lldx", (long long)t->dims[i]);
    k += w > 0 ? (size_t)w : 0;
  }
  w = snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, "%s>", tpu_dtype_mlir(t->dtype));
  k += w > 0 ? (size_t)w : 0;
  return (int)k;
}

void tpu_hloi_put_type(tpu_hlo *m, tpu_buf *b, const tpu_hlo_type *t) {
  char s[TPU_HLO_TYPE_STR_MAX];
  int n = tpu_hlo_type_str(t, s, sizeof s);
  tpu_hloi_buf_put(m, b, s, (size_t)(n < (int)sizeof s ? n : (int)sizeof s - 1));
}

void tpu_hloi_put_i64s(tpu_hlo *m, tpu_buf *b, const int64_t *v, int n) {
  for (int i = 0; i < n; i++) tpu_hloi_buf_printf(m, b, "%s%lld", i ? ", " : "", (long long)v[i]);
}

/* "array<i64: 1, 2>" */
void tpu_hloi_put_array(tpu_hlo *m, tpu_buf *b, const char *name, const int64_t *v, int n) {
  tpu_hloi_buf_printf(m, b, "%s = array<i64%s", name, n ? ": " : "");
  tpu_hloi_put_i64s(m, b, v, n);
  tpu_hloi_buf_put(m, b, ">", 1);
}

void tpu_hloi_put_padding(tpu_hlo *m, tpu_buf *b, const int64_t *pad, int rank) {
  tpu_hloi_buf_put(m, b, "padding = dense<[", 17);
  for (int i = 0; i < rank; i++)
    tpu_hloi_buf_printf(m, b, "%s[%lld, %lld]", i ? ", " : "", (long long)(pad ? pad[2 * i] : 0),
                        (long long)(pad ? pad[2 * i + 1] : 0));
  tpu_hloi_buf_printf(m, b, "]> : tensor<%dx2xi64>", rank);
}

/* ---- module ------------------------------------------------------------------------ */

tpu_hlo *tpu_hlo_new(void) { return calloc(1, sizeof(tpu_hlo)); }

void tpu_hlo_free(tpu_hlo *m) {
  if (!m) return;
  tpu_status_free(m->err);
  for (int i = 0; i < m->nchunks; i++) free(m->chunks[i]);
  free(m->chunks);
  free(m->params);
  free(m->alias);
  free(m->body.p);
  for (int i = 0; i < TPU_HLO_MAX_DEPTH; i++) {
    free(m->stack[i].text.p);
    free(m->stack[i].args);
  }
  for (int i = 0; i < m->nregions; i++) {
    free(m->regions[i].text);
    free(m->regions[i].sig);
  }
  free(m->regions);
  free(m->shards);
  free(m->externs);
  free(m);
}

bool tpu_hlo_ok(const tpu_hlo *m) { return !m->err && !m->oom; }

void tpu_hlo_fail(tpu_hlo *m, tpu_code code, const char *fmt, ...) {
  if (m->err) return;
  va_list ap;
  va_start(ap, fmt);
  m->err = tpu_status_newv(code, fmt, ap);
  va_end(ap);
}

static tpu_hv tpu_new_value(tpu_hlo *m, const tpu_hlo_type *t) {
  if (m->oom) return TPU_HV_NONE;
  if (m->nvals == INT32_MAX) {
    tpu_hlo_fail(m, TPU_ERR_MEMORY, "hlo: too many values");
    return TPU_HV_NONE;
  }
  if (m->nvals == m->nchunks * TPU_HLO_CHUNK) {
    if (m->nchunks == m->capchunks) {
      int cap = m->capchunks ? m->capchunks * 2 : 8;
      tpu_val **q = realloc(m->chunks, sizeof *q * (size_t)cap);
      if (!q) {
        m->oom = true;
        return TPU_HV_NONE;
      }
      m->chunks = q;
      m->capchunks = cap;
    }
    tpu_val *c = malloc(sizeof *c * TPU_HLO_CHUNK);
    if (!c) {
      m->oom = true;
      return TPU_HV_NONE;
    }
    m->chunks[m->nchunks++] = c;
  }
  tpu_val *r = tpu_hloi_val_at(m, m->nvals);
  r->t = *t;
  r->scope = tpu_cur_scope(m);
  r->splat = false;
  return m->nvals++;
}

const tpu_hlo_type *tpu_hlo_typeof(const tpu_hlo *m, tpu_hv v) {
  if (v < 0 || v >= m->nvals) return &tpu_hlo_invalid_type;
  return &TY(v);
}

/* Operands must exist and be defined in a scope that is still open. A
 * TPU_HV_NONE after an error is the silent no-op case; without an earlier
 * error it is the caller's bug and becomes the error. */
bool tpu_hloi_check(tpu_hlo *m, const tpu_hv *vs, int n) {
  if (!tpu_hlo_ok(m)) return false;
  for (int i = 0; i < n; i++) {
    if (vs[i] < 0 || vs[i] >= m->nvals) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: invalid value handle %d", vs[i]);
      return false;
    }
    int s = tpu_hloi_val_at(m, vs[i])->scope;
    bool open = s == 0;
    for (int d = 0; d < m->depth && !open; d++) open = m->stack[d].scope == s;
    if (!open) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: value %%v%d is used outside the region that defines it", vs[i]);
      return false;
    }
  }
  return true;
}

void tpu_hloi_fail_type(tpu_hlo *m, const char *what, const tpu_hlo_type *t) {
  char s[256];
  tpu_hlo_type_str(t, s, sizeof s);
  tpu_hlo_fail(m, TPU_ERR_VALUE, "%s: invalid type %s (dtype %d, rank %d)", what, s, (int)t->dtype, t->rank);
}

void tpu_hloi_fail_types(tpu_hlo *m, const char *op, tpu_hv a, tpu_hv b) {
  char sa[128], sb[128];
  tpu_hlo_type_str(&TY(a), sa, sizeof sa);
  tpu_hlo_type_str(&TY(b), sb, sizeof sb);
  tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: operand types %s and %s differ", op, sa, sb);
}

tpu_hv tpu_hlo_param(tpu_hlo *m, tpu_hlo_type t) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  if (m->depth) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: parameter declared inside a region");
    return TPU_HV_NONE;
  }
  if (!tpu_hloi_type_valid(&t)) {
    tpu_hloi_fail_type(m, "hlo: parameter", &t);
    return TPU_HV_NONE;
  }
  if (m->nparams == m->capparams) {
    int cap = m->capparams ? m->capparams * 2 : 16;
    tpu_hv *q = realloc(m->params, sizeof *q * (size_t)cap);
    int *a = realloc(m->alias, sizeof *a * (size_t)cap);
    if (q) m->params = q;
    if (a) m->alias = a;
    if (!q || !a) {
      m->oom = true;
      return TPU_HV_NONE;
    }
    m->capparams = cap;
  }
  tpu_hv v = tpu_new_value(m, &t);
  if (v == TPU_HV_NONE) return v;
  m->alias[m->nparams] = -1;
  m->params[m->nparams++] = v;
  return v;
}

void tpu_hlo_param_alias(tpu_hlo *m, tpu_hv p, int result_index) {
  if (!tpu_hlo_ok(m)) return;
  if (result_index < 0) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: alias to negative result index %d", result_index);
    return;
  }
  for (int i = 0; i < m->nparams; i++)
    if (m->params[i] == p) {
      m->alias[i] = result_index;
      return;
    }
  tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: alias of a value that is not a parameter");
}

uint64_t tpu_hlo_hash(const char *text, size_t len) { return tpu_fnv1a(TPU_FNV_BASIS, text, len); }

tpu_status *tpu_hlo_finish(tpu_hlo *m, const tpu_hv *results, int n, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  if (m->depth && tpu_hlo_ok(m)) tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: a region was left open");
  if (n < 0 && tpu_hlo_ok(m)) tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: negative result count");
  tpu_hloi_check(m, results, n);
  for (int i = 0; i < m->nregions && tpu_hlo_ok(m); i++)
    if (m->regions[i].text) tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: region %d was closed but never used", i);
  for (int i = 0; i < m->nparams && tpu_hlo_ok(m); i++) {
    if (m->alias[i] < 0) continue;
    if (m->alias[i] >= n || !tpu_hlo_type_eq(&TY(m->params[i]), &TY(results[m->alias[i]])))
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: parameter %d aliases result %d of another type", i, m->alias[i]);
    for (int j = 0; j < i && tpu_hlo_ok(m); j++)
      if (m->alias[j] == m->alias[i])
        tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: parameters %d and %d both alias result %d", j, i, m->alias[i]);
  }
  if (tpu_hlo_ok(m)) tpu_hloi_spmd_check(m, results, n);
  if (m->oom && !m->err) m->err = tpu_status_new(TPU_ERR_MEMORY, "out of memory building a program");
  if (m->err) {
    tpu_status *s = m->err;
    m->err = NULL;
    m->oom = false;
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: already finished with an error");
    return s;
  }
  tpu_buf out = {0};
  tpu_hloi_extern_put_prelude(m, &out);
  tpu_hloi_spmd_put_head(m, &out);
  tpu_hloi_buf_printf(m, &out, "  func.func public @main(");
  for (int i = 0; i < m->nparams; i++) {
    tpu_hloi_buf_printf(m, &out, "%s%%v%d: ", i ? ", " : "", m->params[i]);
    tpu_hloi_put_type(m, &out, &TY(m->params[i]));
    tpu_hloi_spmd_put_attrs(m, &out, false, i, m->alias[i]);
  }
  tpu_hloi_buf_printf(m, &out, ") -> (");
  for (int i = 0; i < n; i++) {
    if (i) tpu_hloi_buf_put(m, &out, ", ", 2);
    tpu_hloi_put_type(m, &out, &TY(results[i]));
    tpu_hloi_spmd_put_attrs(m, &out, true, i, -1);
  }
  tpu_hloi_buf_printf(m, &out, ") {\n");
  if (m->body.n) tpu_hloi_buf_put(m, &out, m->body.p, m->body.n);
  tpu_hloi_buf_printf(m, &out, "    \"func.return\"(");
  for (int i = 0; i < n; i++) tpu_hloi_buf_printf(m, &out, "%s%%v%d", i ? ", " : "", results[i]);
  tpu_hloi_buf_printf(m, &out, ") : (");
  for (int i = 0; i < n; i++) {
    if (i) tpu_hloi_buf_put(m, &out, ", ", 2);
    tpu_hloi_put_type(m, &out, &TY(results[i]));
  }
  tpu_hloi_buf_printf(m, &out, ") -> ()\n  }\n");
  tpu_hloi_extern_put(m, &out);
  tpu_hloi_buf_printf(m, &out, "}\n");
  if (m->oom) {
    free(out.p);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory building a program");
  }
  *text = out.p;
  *len = out.n;
  return NULL;
}

/* ---- the generic primitive --------------------------------------------------------- */

bool tpu_hlo_emit(tpu_hlo *m, const char *name, const tpu_hv *operands, int nops, const int *regions, int nregions,
                  const char *attrs, const tpu_hlo_type *result_types, int nres, tpu_hv *outs) {
  for (int i = 0; i < nres; i++) outs[i] = TPU_HV_NONE;
  if (!tpu_hloi_check(m, operands, nops)) return false;
  if (nops < 0 || nregions < 0 || nres < 0) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: negative count", name);
    return false;
  }
  for (int i = 0; i < nregions; i++) {
    if (regions[i] < 0 || regions[i] >= m->nregions || !m->regions[regions[i]].text) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: invalid or already used region %d", name, regions[i]);
      return false;
    }
    if (m->regions[regions[i]].scope != tpu_cur_scope(m)) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: region %d belongs to another block", name, regions[i]);
      return false;
    }
    for (int j = 0; j < i; j++)
      if (regions[j] == regions[i]) {
        tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: region %d passed twice", name, regions[i]);
        return false;
      }
  }
  for (int i = 0; i < nres; i++)
    if (!tpu_hloi_type_valid(&result_types[i])) {
      tpu_hloi_fail_type(m, name, &result_types[i]);
      return false;
    }
  tpu_buf *b = tpu_cur(m);
  int indent = 4 + 2 * m->depth;
  tpu_hloi_buf_printf(m, b, "%*s", indent, "");
  for (int i = 0; i < nres; i++) {
    outs[i] = tpu_new_value(m, &result_types[i]);
    tpu_hloi_buf_printf(m, b, "%s%%v%d", i ? ", " : "", outs[i]);
  }
  if (nres) tpu_hloi_buf_put(m, b, " = ", 3);
  tpu_hloi_buf_printf(m, b, "\"%s\"(", name);
  for (int i = 0; i < nops; i++) tpu_hloi_buf_printf(m, b, "%s%%v%d", i ? ", " : "", operands[i]);
  tpu_hloi_buf_put(m, b, ")", 1);
  if (nregions) {
    tpu_hloi_buf_put(m, b, " (", 2);
    for (int i = 0; i < nregions; i++) {
      if (i) tpu_hloi_buf_put(m, b, ", ", 2);
      tpu_region *r = &m->regions[regions[i]];
      tpu_hloi_buf_put(m, b, r->text, strlen(r->text));
      free(r->text);
      r->text = NULL;
    }
    tpu_hloi_buf_put(m, b, ")", 1);
  }
  if (attrs && attrs[0]) tpu_hloi_buf_printf(m, b, " {%s}", attrs);
  tpu_hloi_buf_put(m, b, " : (", 4);
  for (int i = 0; i < nops; i++) {
    if (i) tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_hloi_put_type(m, b, &TY(operands[i]));
  }
  tpu_hloi_buf_put(m, b, ") -> ", 5);
  if (nres != 1) tpu_hloi_buf_put(m, b, "(", 1);
  for (int i = 0; i < nres; i++) {
    if (i) tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_hloi_put_type(m, b, &result_types[i]);
  }
  if (nres != 1) tpu_hloi_buf_put(m, b, ")", 1);
  tpu_hloi_buf_put(m, b, "\n", 1);
  /* What XLA's simplifier may turn into a broadcast or a constant: a
   * constant, and any result of operands that all may be (a broadcast sunk
   * below an elementwise op, reshaped, sliced, reduced). A barrier or a
   * custom call or a function call hides its operands. */
  bool splat = strcmp(name, "stablehlo.constant") == 0 || strcmp(name, "stablehlo.broadcast_in_dim") == 0;
  if (!splat && nops > 0 && strcmp(name, "stablehlo.optimization_barrier") != 0 &&
      strcmp(name, "stablehlo.custom_call") != 0 && strcmp(name, "func.call") != 0) {
    splat = true;
    for (int i = 0; i < nops && splat; i++) splat = tpu_hloi_val_at(m, operands[i])->splat;
  }
  for (int i = 0; i < nres; i++)
    if (outs[i] != TPU_HV_NONE) tpu_hloi_val_at(m, outs[i])->splat = splat;
  return tpu_hlo_ok(m);
}

tpu_hv tpu_hlo_emit1(tpu_hlo *m, const char *name, const tpu_hv *operands, int nops, const char *attrs,
                     tpu_hlo_type result) {
  tpu_hv out = TPU_HV_NONE;
  tpu_hlo_emit(m, name, operands, nops, NULL, 0, attrs, &result, 1, &out);
  return out;
}

/* ---- regions ------------------------------------------------------------------------- */

void tpu_hlo_region_begin(tpu_hlo *m, const tpu_hlo_type *arg_types, int n, tpu_hv *args) {
  for (int i = 0; i < n; i++) args[i] = TPU_HV_NONE;
  /* The depth still counts after an error, so that begin/end pairs stay
   * balanced and an unbalanced end is still reported. */
  if (m->depth >= TPU_HLO_MAX_DEPTH) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: regions nested deeper than %d", TPU_HLO_MAX_DEPTH);
    return;
  }
  tpu_frame *f = &m->stack[m->depth++];
  f->text.n = 0;
  f->scope = ++m->nscopes;
  f->nargs = 0;
  free(f->args);
  f->args = NULL;
  if (!tpu_hlo_ok(m)) return;
  if (n < 0) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: negative region argument count");
    return;
  }
  for (int i = 0; i < n; i++)
    if (!tpu_hloi_type_valid(&arg_types[i])) {
      tpu_hloi_fail_type(m, "hlo: region argument", &arg_types[i]);
      return;
    }
  if (n) {
    f->args = malloc(sizeof *f->args * (size_t)n);
    if (!f->args) {
      m->oom = true;
      return;
    }
    memcpy(f->args, arg_types, sizeof *f->args * (size_t)n);
    f->nargs = n;
  }
  tpu_hloi_buf_printf(m, &f->text, "{\n%*s^bb0(", 2 + 2 * m->depth, "");
  for (int i = 0; i < n; i++) {
    args[i] = tpu_new_value(m, &arg_types[i]);
    tpu_hloi_buf_printf(m, &f->text, "%s%%v%d: ", i ? ", " : "", args[i]);
    tpu_hloi_put_type(m, &f->text, &arg_types[i]);
  }
  tpu_hloi_buf_put(m, &f->text, "):\n", 3);
}

int tpu_hlo_region_end(tpu_hlo *m, const tpu_hv *results, int n) {
  if (!m->depth) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: region_end without region_begin");
    return -1;
  }
  tpu_frame *f = &m->stack[m->depth - 1];
  if (n < 0 || !tpu_hloi_check(m, results, n)) {
    if (n < 0) tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: negative region result count");
    m->depth--;
    return -1;
  }
  tpu_buf *b = &f->text;
  tpu_hloi_buf_printf(m, b, "%*s\"stablehlo.return\"(", 4 + 2 * m->depth, "");
  for (int i = 0; i < n; i++) tpu_hloi_buf_printf(m, b, "%s%%v%d", i ? ", " : "", results[i]);
  tpu_hloi_buf_put(m, b, ") : (", 5);
  for (int i = 0; i < n; i++) {
    if (i) tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_hloi_put_type(m, b, &TY(results[i]));
  }
  tpu_hloi_buf_printf(m, b, ") -> ()\n%*s}", 2 + 2 * m->depth, "");
  m->depth--;
  if (m->oom) return -1;
  if (m->nregions == m->capregions) {
    int cap = m->capregions ? m->capregions * 2 : 8;
    tpu_region *q = realloc(m->regions, sizeof *q * (size_t)cap);
    if (!q) {
      m->oom = true;
      return -1;
    }
    m->regions = q;
    m->capregions = cap;
  }
  tpu_region r = {NULL, tpu_cur_scope(m), f->nargs, n, NULL};
  r.text = malloc(b->n + 1);
  r.sig = malloc(sizeof *r.sig * (size_t)(f->nargs + n + 1));
  if (!r.text || !r.sig) {
    free(r.text);
    free(r.sig);
    m->oom = true;
    return -1;
  }
  memcpy(r.text, b->p, b->n + 1);
  if (f->nargs) memcpy(r.sig, f->args, sizeof *r.sig * (size_t)f->nargs);
  for (int i = 0; i < n; i++) r.sig[f->nargs + i] = TY(results[i]);
  m->regions[m->nregions] = r;
  return m->nregions++;
}

/* "(tensor<f32>, tensor<f32>) -> (tensor<i1>)" */
static void tpu_put_sig(tpu_hlo *m, tpu_buf *b, const tpu_hlo_type *args, int nargs, const tpu_hlo_type *res,
                        int nres) {
  tpu_hloi_buf_put(m, b, "(", 1);
  for (int i = 0; i < nargs; i++) {
    if (i) tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_hloi_put_type(m, b, &args[i]);
  }
  tpu_hloi_buf_put(m, b, ") -> (", 6);
  for (int i = 0; i < nres; i++) {
    if (i) tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_hloi_put_type(m, b, &res[i]);
  }
  tpu_hloi_buf_put(m, b, ")", 1);
}

/* Check that region `region` takes args[0..nargs) and returns res[0..nres)
 * before `op` consumes it. */
bool tpu_hloi_region_sig(tpu_hlo *m, const char *op, int region, const tpu_hlo_type *args, int nargs,
                         const tpu_hlo_type *res, int nres) {
  if (!tpu_hlo_ok(m)) return false;
  if (region < 0 || region >= m->nregions || !m->regions[region].text) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: invalid or already used region %d", op, region);
    return false;
  }
  const tpu_region *r = &m->regions[region];
  bool ok = r->nargs == nargs && r->nres == nres;
  for (int i = 0; ok && i < nargs; i++) ok = tpu_hlo_type_eq(&r->sig[i], &args[i]);
  for (int i = 0; ok && i < nres; i++) ok = tpu_hlo_type_eq(&r->sig[nargs + i], &res[i]);
  if (!ok) {
    tpu_buf want = {0}, got = {0};
    tpu_put_sig(m, &want, args, nargs, res, nres);
    tpu_put_sig(m, &got, r->sig, r->nargs, r->sig + r->nargs, r->nres);
    if (!m->oom) tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: region %d has signature %s, want %s", op, region, got.p, want.p);
    free(want.p);
    free(got.p);
    return false;
  }
  return true;
}
