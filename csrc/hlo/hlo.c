/* hlo.c: the StableHLO builder (see hlo.h).
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
#include <math.h>
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
  t.dtype = dt;
  t.rank = rank < 0 ? 0 : (rank > TPU_MAX_RANK ? TPU_MAX_RANK : rank);
  for (int i = 0; i < t.rank; i++) t.dims[i] = dims[i];
  return t;
}

int64_t tpu_hlo_type_numel(const tpu_hlo_type *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->dims[i];
  return n;
}

bool tpu_hlo_type_eq(const tpu_hlo_type *a, const tpu_hlo_type *b) {
  return a->dtype == b->dtype && a->rank == b->rank &&
         memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) == 0;
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
  char s[256];
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
  if (m->oom && !m->err) m->err = tpu_status_new(TPU_ERR_MEMORY, "out of memory building a program");
  if (m->err) {
    tpu_status *s = m->err;
    m->err = NULL;
    m->oom = false;
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: already finished with an error");
    return s;
  }
  tpu_buf out = {0};
  tpu_hloi_buf_printf(m, &out,
                      "module @torchtpu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
                      "  func.func public @main(");
  for (int i = 0; i < m->nparams; i++) {
    tpu_hloi_buf_printf(m, &out, "%s%%v%d: ", i ? ", " : "", m->params[i]);
    tpu_hloi_put_type(m, &out, &TY(m->params[i]));
    if (m->alias[i] >= 0) tpu_hloi_buf_printf(m, &out, " {tf.aliasing_output = %d : i32}", m->alias[i]);
  }
  tpu_hloi_buf_printf(m, &out, ") -> (");
  for (int i = 0; i < n; i++) {
    if (i) tpu_hloi_buf_put(m, &out, ", ", 2);
    tpu_hloi_put_type(m, &out, &TY(results[i]));
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
  tpu_hloi_buf_printf(m, &out, ") -> ()\n  }\n}\n");
  if (m->oom) {
    free(out.p);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory building a program");
  }
  *text = out.p;
  *len = out.n;
  return NULL;
}

/* ---- the generic primitive --------------------------------------------------------- */

bool tpu_hlo_emit(tpu_hlo *m, const char *name, const tpu_hv *operands, int nops, const int *regions,
                  int nregions, const char *attrs, const tpu_hlo_type *result_types, int nres, tpu_hv *outs) {
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
   * custom call hides its operands. */
  bool splat = strcmp(name, "stablehlo.constant") == 0 || strcmp(name, "stablehlo.broadcast_in_dim") == 0;
  if (!splat && nops > 0 && strcmp(name, "stablehlo.optimization_barrier") != 0 &&
      strcmp(name, "stablehlo.custom_call") != 0) {
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
    if (!m->oom)
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: region %d has signature %s, want %s", op, region, got.p, want.p);
    free(want.p);
    free(got.p);
    return false;
  }
  return true;
}

/* ---- constants ------------------------------------------------------------------------ */

/* v rounded to nearest-even in a binary format with p significand bits and
 * normal exponents emin..emax (inf past the largest finite value). Done in
 * double arithmetic, so there is no double rounding through f32 and no
 * out-of-range float conversion. */
static double tpu_round_format(double v, int p, int emin, int emax) {
  if (v == 0 || !isfinite(v)) return v;
  int e;
  frexp(v, &e);
  int exp = e - 1 < emin ? emin : e - 1; /* subnormals share emin's quantum */
  double r = ldexp(nearbyint(ldexp(v, p - 1 - exp)), exp - (p - 1));
  double maxf = ldexp(2.0 - ldexp(1.0, 1 - p), emax);
  if (fabs(r) > maxf) return copysign(INFINITY, v);
  return r;
}

static void tpu_put_float(tpu_hlo *m, tpu_buf *b, tpu_dtype dt, double v) {
  if (dt == TPU_F32) v = tpu_round_format(v, 24, -126, 127);
  else if (dt == TPU_BF16) v = tpu_round_format(v, 8, -126, 127);
  else if (dt == TPU_F16) v = tpu_round_format(v, 11, -14, 15);
  if (!isfinite(v)) {
    /* MLIR takes hex literals in a float dense attribute as bit patterns. */
    bool neg = signbit(v);
    const char *s;
    if (isnan(v)) {
      s = dt == TPU_F64 ? "0x7FF8000000000000" : dt == TPU_F16 ? "0x7E00" : dt == TPU_BF16 ? "0x7FC0" : "0x7FC00000";
    } else if (dt == TPU_F64) {
      s = neg ? "0xFFF0000000000000" : "0x7FF0000000000000";
    } else if (dt == TPU_F16) {
      s = neg ? "0xFC00" : "0x7C00";
    } else if (dt == TPU_BF16) {
      s = neg ? "0xFF80" : "0x7F80";
    } else {
      s = neg ? "0xFF800000" : "0x7F800000";
    }
    tpu_hloi_buf_put(m, b, s, strlen(s));
    return;
  }
  /* v is now exactly representable in dt; 9 significant digits identify any
   * f32 (hence f16/bf16) value, 17 any f64. */
  char tmp[64];
  snprintf(tmp, sizeof tmp, dt == TPU_F64 ? "%.17g" : "%.9g", v);
  if (!strpbrk(tmp, ".n")) {
    /* MLIR wants a '.' in a float literal: "1e-30" -> "1.0e-30" */
    char *e = strpbrk(tmp, "eE");
    if (e) {
      memmove(e + 2, e, strlen(e) + 1);
      e[0] = '.';
      e[1] = '0';
    } else {
      strcat(tmp, ".0");
    }
  }
  tpu_hloi_buf_put(m, b, tmp, strlen(tmp));
}

static void tpu_put_scalar_literal(tpu_hlo *m, tpu_buf *b, tpu_dtype dt, double f, int64_t i) {
  if (dt == TPU_PRED) tpu_hloi_buf_printf(m, b, "%s", i ? "true" : "false");
  else if (tpu_dtype_is_float(dt)) tpu_put_float(m, b, dt, f);
  else if (dt == TPU_C64 || dt == TPU_C128) {
    tpu_dtype part = dt == TPU_C64 ? TPU_F32 : TPU_F64;
    tpu_hloi_buf_put(m, b, "(", 1);
    tpu_put_float(m, b, part, f);
    tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_put_float(m, b, part, 0.0);
    tpu_hloi_buf_put(m, b, ")", 1);
  } else if (tpu_dtype_is_unsigned_int(dt)) {
    uint64_t u = (uint64_t)i;
    if (tpu_dtype_size(dt) < 8) u &= ((uint64_t)1 << (8 * tpu_dtype_size(dt))) - 1;
    tpu_hloi_buf_printf(m, b, "%llu", (unsigned long long)u);
  } else {
    int bits = (int)tpu_dtype_size(dt) * 8;
    int64_t v = i;
    if (bits < 64) {
      int64_t lo = -((int64_t)1 << (bits - 1)), hi = ((int64_t)1 << (bits - 1)) - 1;
      uint64_t mask = ((uint64_t)1 << bits) - 1;
      if (v < lo || v > hi) { /* wrap like a C cast */
        uint64_t u = (uint64_t)v & mask;
        v = (u & ((uint64_t)1 << (bits - 1))) ? (int64_t)(u | ~mask) : (int64_t)u;
      }
    }
    tpu_hloi_buf_printf(m, b, "%lld", (long long)v);
  }
}

static tpu_hv tpu_constant(tpu_hlo *m, tpu_dtype dt, double f, int64_t i) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  tpu_hlo_type t = tpu_hlo_type_make(dt, 0, NULL);
  if (!tpu_hloi_type_valid(&t)) {
    tpu_hloi_fail_type(m, "stablehlo.constant", &t);
    return TPU_HV_NONE;
  }
  tpu_attrs a = {0};
  tpu_hloi_buf_put(m, &a.b, "value = dense<", strlen("value = dense<"));
  tpu_put_scalar_literal(m, &a.b, dt, f, i);
  tpu_hloi_buf_put(m, &a.b, "> : ", strlen("> : "));
  tpu_hloi_put_type(m, &a.b, &t);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.constant", NULL, 0, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_constant(tpu_hlo *m, tpu_dtype dt, double v) {
  /* The integer form for integer dtypes: truncated toward zero, saturated
   * to the 64-bit range (a plain cast would be undefined out of range). */
  int64_t i = 0;
  if (isnan(v)) i = 0;
  else if (v >= 18446744073709551616.0) i = dt == TPU_U64 ? -1 : INT64_MAX;
  else if (v >= 9223372036854775808.0) i = dt == TPU_U64 ? (int64_t)(uint64_t)v : INT64_MAX;
  else if (v < -9223372036854775808.0) i = INT64_MIN;
  else i = (int64_t)v;
  return tpu_constant(m, dt, v, i);
}

tpu_hv tpu_hlo_constant_int(tpu_hlo *m, tpu_dtype dt, int64_t v) { return tpu_constant(m, dt, (double)v, v); }

static void tpu_put_nested(tpu_hlo *m, tpu_buf *b, const tpu_hlo_type *t, int d, const int64_t *vals, int64_t *k) {
  if (d == t->rank) {
    tpu_put_scalar_literal(m, b, t->dtype, (double)vals[*k], vals[*k]);
    (*k)++;
    return;
  }
  tpu_hloi_buf_put(m, b, "[", 1);
  for (int64_t i = 0; i < t->dims[d]; i++) {
    if (i) tpu_hloi_buf_put(m, b, ", ", 2);
    tpu_put_nested(m, b, t, d + 1, vals, k);
  }
  tpu_hloi_buf_put(m, b, "]", 1);
}

tpu_hv tpu_hlo_constant_ints(tpu_hlo *m, tpu_hlo_type t, const int64_t *vals) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  if (!tpu_hloi_type_valid(&t) || !(tpu_dtype_is_int(t.dtype) || t.dtype == TPU_PRED)) {
    tpu_hloi_fail_type(m, "stablehlo.constant (integer values)", &t);
    return TPU_HV_NONE;
  }
  tpu_attrs a = {0};
  int64_t k = 0;
  tpu_hloi_buf_put(m, &a.b, "value = dense<", strlen("value = dense<"));
  tpu_put_nested(m, &a.b, &t, 0, vals, &k);
  tpu_hloi_buf_put(m, &a.b, "> : ", strlen("> : "));
  tpu_hloi_put_type(m, &a.b, &t);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.constant", NULL, 0, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_iota(tpu_hlo *m, tpu_hlo_type t, int dim) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  if (dim < 0 || dim >= t.rank) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.iota: dimension %d out of range for rank %d", dim, t.rank);
    return TPU_HV_NONE;
  }
  if (!tpu_dtype_is_int(t.dtype) && !tpu_dtype_is_float(t.dtype) && !tpu_dtype_is_complex(t.dtype)) {
    tpu_hloi_fail_type(m, "stablehlo.iota", &t);
    return TPU_HV_NONE;
  }
  char attrs[64];
  snprintf(attrs, sizeof attrs, "iota_dimension = %d : i64", dim);
  return tpu_hlo_emit1(m, "stablehlo.iota", NULL, 0, attrs, t);
}

/* ---- elementwise ------------------------------------------------------------------------ */

static const char *const tpu_op_names[TPU_HLO_NUM_OPS] = {
    [TPU_HLO_ABS] = "abs", [TPU_HLO_NEG] = "negate", [TPU_HLO_EXP] = "exponential",
    [TPU_HLO_EXPM1] = "exponential_minus_one", [TPU_HLO_LOG] = "log", [TPU_HLO_LOG1P] = "log_plus_one",
    [TPU_HLO_SQRT] = "sqrt", [TPU_HLO_RSQRT] = "rsqrt", [TPU_HLO_CBRT] = "cbrt", [TPU_HLO_TANH] = "tanh",
    [TPU_HLO_LOGISTIC] = "logistic", [TPU_HLO_SIN] = "sine", [TPU_HLO_COS] = "cosine", [TPU_HLO_TAN] = "tan",
    [TPU_HLO_FLOOR] = "floor", [TPU_HLO_CEIL] = "ceil", [TPU_HLO_ROUND_EVEN] = "round_nearest_even",
    [TPU_HLO_ROUND_AWAY] = "round_nearest_afz", [TPU_HLO_SIGN] = "sign", [TPU_HLO_NOT] = "not",
    [TPU_HLO_IS_FINITE] = "is_finite", [TPU_HLO_POPCNT] = "popcnt", [TPU_HLO_CLZ] = "count_leading_zeros",
    [TPU_HLO_REAL] = "real", [TPU_HLO_IMAG] = "imag", [TPU_HLO_ADD] = "add", [TPU_HLO_SUB] = "subtract",
    [TPU_HLO_MUL] = "multiply", [TPU_HLO_DIV] = "divide", [TPU_HLO_REM] = "remainder", [TPU_HLO_POW] = "power",
    [TPU_HLO_MAX] = "maximum", [TPU_HLO_MIN] = "minimum", [TPU_HLO_AND] = "and", [TPU_HLO_OR] = "or",
    [TPU_HLO_XOR] = "xor", [TPU_HLO_ATAN2] = "atan2", [TPU_HLO_SHL] = "shift_left",
    [TPU_HLO_SHR_A] = "shift_right_arithmetic", [TPU_HLO_SHR_L] = "shift_right_logical",
    [TPU_HLO_COMPLEX] = "complex",
};

static void tpu_opname(char *buf, size_t n, tpu_hlo_op op) {
  snprintf(buf, n, "stablehlo.%s", (op >= 0 && op < TPU_HLO_NUM_OPS && tpu_op_names[op]) ? tpu_op_names[op] : "?");
}

/* Element-type classes an op accepts: those XLA's CPU plugin compiles (each
 * checked against it). Some others do worse than fail: remainder of complex
 * values, and a complex -> real convert, crash the plugin while it lowers
 * the program, so they must never reach it. */
enum { K_PRED = 1, K_SINT = 2, K_UINT = 4, K_FLOAT = 8, K_COMPLEX = 16 };
#define K_INT (K_SINT | K_UINT)
#define K_NUM (K_INT | K_FLOAT | K_COMPLEX)
#define K_ANY (K_PRED | K_NUM)

static const unsigned char tpu_op_kinds[TPU_HLO_NUM_OPS] = {
    [TPU_HLO_ABS] = K_SINT | K_FLOAT | K_COMPLEX, [TPU_HLO_NEG] = K_NUM,
    [TPU_HLO_EXP] = K_FLOAT | K_COMPLEX, [TPU_HLO_EXPM1] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_LOG] = K_FLOAT | K_COMPLEX, [TPU_HLO_LOG1P] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_SQRT] = K_FLOAT | K_COMPLEX, [TPU_HLO_RSQRT] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_CBRT] = K_FLOAT, [TPU_HLO_TANH] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_LOGISTIC] = K_FLOAT | K_COMPLEX, [TPU_HLO_SIN] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_COS] = K_FLOAT | K_COMPLEX, [TPU_HLO_TAN] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_FLOOR] = K_FLOAT, [TPU_HLO_CEIL] = K_FLOAT, [TPU_HLO_ROUND_EVEN] = K_FLOAT,
    [TPU_HLO_ROUND_AWAY] = K_FLOAT, [TPU_HLO_SIGN] = K_SINT | K_FLOAT | K_COMPLEX,
    [TPU_HLO_NOT] = K_PRED | K_INT, [TPU_HLO_IS_FINITE] = K_FLOAT, [TPU_HLO_POPCNT] = K_INT,
    [TPU_HLO_CLZ] = K_INT, [TPU_HLO_REAL] = K_FLOAT | K_COMPLEX, [TPU_HLO_IMAG] = K_FLOAT | K_COMPLEX,
    [TPU_HLO_ADD] = K_ANY, [TPU_HLO_SUB] = K_NUM, [TPU_HLO_MUL] = K_ANY, [TPU_HLO_DIV] = K_NUM,
    [TPU_HLO_REM] = K_INT | K_FLOAT, [TPU_HLO_POW] = K_NUM, [TPU_HLO_MAX] = K_ANY, [TPU_HLO_MIN] = K_ANY,
    [TPU_HLO_AND] = K_PRED | K_INT, [TPU_HLO_OR] = K_PRED | K_INT, [TPU_HLO_XOR] = K_PRED | K_INT,
    [TPU_HLO_ATAN2] = K_FLOAT | K_COMPLEX, [TPU_HLO_SHL] = K_INT, [TPU_HLO_SHR_A] = K_INT,
    [TPU_HLO_SHR_L] = K_INT, [TPU_HLO_COMPLEX] = 0, /* f32/f64 only: checked by hand */
};

static unsigned tpu_kind(tpu_dtype dt) {
  return dt == TPU_PRED                  ? K_PRED
         : tpu_dtype_is_signed_int(dt)   ? K_SINT
         : tpu_dtype_is_unsigned_int(dt) ? K_UINT
         : tpu_dtype_is_float(dt)        ? K_FLOAT
         : tpu_dtype_is_complex(dt)      ? K_COMPLEX
                                         : 0;
}

static bool tpu_op_accepts(tpu_hlo *m, const char *name, tpu_hlo_op op, tpu_hv x) {
  tpu_dtype dt = TY(x).dtype;
  bool ok = op == TPU_HLO_COMPLEX ? (dt == TPU_F32 || dt == TPU_F64) : (tpu_op_kinds[op] & tpu_kind(dt)) != 0;
  if (!ok) {
    char s[128];
    tpu_hlo_type_str(&TY(x), s, sizeof s);
    tpu_hlo_fail(m, TPU_ERR_TYPE, "%s: operand type %s has an unsupported element type", name, s);
  }
  return ok;
}

tpu_hv tpu_hlo_unary(tpu_hlo *m, tpu_hlo_op op, tpu_hv x) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (op < 0 || op >= TPU_HLO_ADD) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: op %d is not unary", (int)op);
    return TPU_HV_NONE;
  }
  char name[64];
  tpu_opname(name, sizeof name, op);
  if (!tpu_op_accepts(m, name, op, x)) return TPU_HV_NONE;
  tpu_hlo_type t = TY(x);
  if (op == TPU_HLO_RSQRT && m->exact_div &&
      (t.dtype == TPU_F32 || t.dtype == TPU_F16 || t.dtype == TPU_BF16 || t.dtype == TPU_F64)) {
    /* XLA's CPU rsqrt is approximate (up to 2 ulp); torch's kernel divides 1
     * by the (correctly rounded) sqrt in f32. The barrier keeps XLA from
     * turning 1 / sqrt(x) back into rsqrt(x). */
    tpu_hlo_type t32 = t;
    t32.dtype = t.dtype == TPU_F64 ? TPU_F64 : TPU_F32;
    tpu_hv x32 = tpu_hlo_convert(m, x, t32.dtype);
    tpu_hv r = tpu_hlo_emit1(m, "stablehlo.sqrt", &x32, 1, NULL, t32);
    r = tpu_hlo_emit1(m, "stablehlo.optimization_barrier", &r, 1, NULL, t32);
    tpu_hv one = tpu_hlo_constant(m, t32.dtype, 1);
    if (t.rank) one = tpu_hlo_broadcast_in_dim(m, one, t.rank, t.dims, NULL);
    return tpu_hlo_convert(m, tpu_hlo_binary(m, TPU_HLO_DIV, one, r), t.dtype);
  }
  if (op == TPU_HLO_IS_FINITE) t.dtype = TPU_PRED;
  if ((op == TPU_HLO_REAL || op == TPU_HLO_IMAG || op == TPU_HLO_ABS) && tpu_dtype_is_complex(t.dtype))
    t.dtype = t.dtype == TPU_C64 ? TPU_F32 : TPU_F64;
  return tpu_hlo_emit1(m, name, &x, 1, NULL, t);
}

void tpu_hloi_fail_types(tpu_hlo *m, const char *op, tpu_hv a, tpu_hv b) {
  char sa[128], sb[128];
  tpu_hlo_type_str(&TY(a), sa, sizeof sa);
  tpu_hlo_type_str(&TY(b), sb, sizeof sb);
  tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: operand types %s and %s differ", op, sa, sb);
}

void tpu_hlo_set_exact_division(tpu_hlo *m, bool on) { m->exact_div = on; }

tpu_hv tpu_hlo_binary(tpu_hlo *m, tpu_hlo_op op, tpu_hv x, tpu_hv y) {
  tpu_hv ops[2] = {x, y};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  /* XLA's CPU simplifier rewrites A / broadcast(B) into A * broadcast(1 / B)
   * and A / constant into A * (1 / constant): not the correctly rounded
   * quotient that torch computes (1 ulp off in ~1/4 of elements; 0 * inf
   * for 0 / 0 of booleans); and atan2(A, 1) into atan(A), which the newer
   * CPU plugin computes wrongly for 64 elements and more. A barrier keeps
   * such a divisor opaque. */
  if ((op == TPU_HLO_DIV || op == TPU_HLO_ATAN2) && m->exact_div && tpu_hloi_val_at(m, y)->splat &&
      (tpu_dtype_is_float(TY(y).dtype) || tpu_dtype_is_complex(TY(y).dtype))) {
    ops[1] = y = tpu_hlo_emit1(m, "stablehlo.optimization_barrier", &y, 1, NULL, TY(y));
    if (y == TPU_HV_NONE) return TPU_HV_NONE;
  }
  char name[64];
  tpu_opname(name, sizeof name, op);
  if (op < TPU_HLO_ADD || op >= TPU_HLO_NUM_OPS) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: op %s is not binary", name);
    return TPU_HV_NONE;
  }
  if (!tpu_hlo_type_eq(&TY(x), &TY(y))) {
    tpu_hloi_fail_types(m, name, x, y);
    return TPU_HV_NONE;
  }
  if (!tpu_op_accepts(m, name, op, x)) return TPU_HV_NONE;
  tpu_hlo_type t = TY(x);
  if (op == TPU_HLO_COMPLEX) t.dtype = t.dtype == TPU_F64 ? TPU_C128 : TPU_C64;
  return tpu_hlo_emit1(m, name, ops, 2, NULL, t);
}

tpu_hv tpu_hlo_compare(tpu_hlo *m, tpu_hlo_cmp dir, tpu_hv x, tpu_hv y) {
  tpu_hv ops[2] = {x, y};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  if (!tpu_hlo_type_eq(&TY(x), &TY(y))) {
    tpu_hloi_fail_types(m, "stablehlo.compare", x, y);
    return TPU_HV_NONE;
  }
  static const char *dirs[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  tpu_dtype dt = TY(x).dtype;
  if ((int)dir < 0 || dir > TPU_HLO_GE || (tpu_dtype_is_complex(dt) && dir != TPU_HLO_EQ && dir != TPU_HLO_NE)) {
    tpu_hlo_fail(m, TPU_ERR_TYPE, "stablehlo.compare: direction %d is not defined for %s", (int)dir,
                 tpu_dtype_mlir(dt));
    return TPU_HV_NONE;
  }
  const char *ct = (tpu_dtype_is_float(dt) || tpu_dtype_is_complex(dt)) ? "FLOAT"
                   : tpu_dtype_is_signed_int(dt)                         ? "SIGNED"
                                                                         : "UNSIGNED";
  char attrs[160];
  snprintf(attrs, sizeof attrs,
           "comparison_direction = #stablehlo<comparison_direction %s>, compare_type = #stablehlo<comparison_type %s>",
           dirs[dir], ct);
  tpu_hlo_type t = TY(x);
  t.dtype = TPU_PRED;
  return tpu_hlo_emit1(m, "stablehlo.compare", ops, 2, attrs, t);
}

tpu_hv tpu_hlo_select(tpu_hlo *m, tpu_hv pred, tpu_hv on_true, tpu_hv on_false) {
  tpu_hv ops[3] = {pred, on_true, on_false};
  if (!tpu_hloi_check(m, ops, 3)) return TPU_HV_NONE;
  if (!tpu_hlo_type_eq(&TY(on_true), &TY(on_false))) {
    tpu_hloi_fail_types(m, "stablehlo.select", on_true, on_false);
    return TPU_HV_NONE;
  }
  const tpu_hlo_type *p = &TY(pred);
  tpu_hlo_type want = TY(on_true);
  want.dtype = TPU_PRED;
  if (p->dtype != TPU_PRED || (p->rank != 0 && !tpu_hlo_type_eq(p, &want))) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.select: predicate must be i1 of the operands' shape or 0-d");
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.select", ops, 3, NULL, TY(on_true));
}

tpu_hv tpu_hlo_clamp(tpu_hlo *m, tpu_hv lo, tpu_hv x, tpu_hv hi) {
  tpu_hv ops[3] = {lo, x, hi};
  if (!tpu_hloi_check(m, ops, 3)) return TPU_HV_NONE;
  for (int i = 0; i < 3; i += 2) {
    const tpu_hlo_type *t = &TY(ops[i]);
    if (t->dtype != TY(x).dtype || (t->rank != 0 && !tpu_hlo_type_eq(t, &TY(x)))) {
      tpu_hloi_fail_types(m, "stablehlo.clamp", ops[i], x);
      return TPU_HV_NONE;
    }
  }
  return tpu_hlo_emit1(m, "stablehlo.clamp", ops, 3, NULL, TY(x));
}

tpu_hv tpu_hlo_convert(tpu_hlo *m, tpu_hv x, tpu_dtype dt) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (TY(x).dtype == dt) return x;
  tpu_hlo_type t = TY(x);
  t.dtype = dt;
  if (tpu_dtype_is_complex(TY(x).dtype) && !tpu_dtype_is_complex(dt)) {
    /* XLA rejects complex -> real converts; callers take REAL first. */
    tpu_hlo_fail(m, TPU_ERR_TYPE, "stablehlo.convert: %s to %s drops the imaginary part; take REAL first",
                 tpu_dtype_mlir(TY(x).dtype), tpu_dtype_mlir(dt));
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.convert", &x, 1, NULL, t);
}

tpu_hv tpu_hlo_bitcast_convert(tpu_hlo *m, tpu_hv x, tpu_dtype dt) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (tpu_dtype_size(TY(x).dtype) != tpu_dtype_size(dt)) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.bitcast_convert: element sizes differ");
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = TY(x);
  t.dtype = dt;
  return tpu_hlo_emit1(m, "stablehlo.bitcast_convert", &x, 1, NULL, t);
}

/* ---- shapes ----------------------------------------------------------------------------- */

tpu_hv tpu_hlo_reshape(tpu_hlo *m, tpu_hv x, int rank, const int64_t *dims) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (rank < 0 || rank > TPU_MAX_RANK || (rank && !dims)) {
    tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.reshape: bad rank %d", rank);
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = tpu_hlo_type_make(TY(x).dtype, rank, dims);
  if (!tpu_hloi_type_valid(&t)) {
    tpu_hloi_fail_type(m, "stablehlo.reshape", &t);
    return TPU_HV_NONE;
  }
  if (tpu_hlo_type_eq(&t, &TY(x))) return x;
  if (tpu_hlo_type_numel(&t) != tpu_hlo_type_numel(&TY(x))) {
    char a[128], b[128];
    tpu_hlo_type_str(&TY(x), a, sizeof a);
    tpu_hlo_type_str(&t, b, sizeof b);
    tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.reshape: cannot reshape %s to %s", a, b);
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.reshape", &x, 1, NULL, t);
}

tpu_hv tpu_hlo_broadcast_in_dim(tpu_hlo *m, tpu_hv x, int rank, const int64_t *dims, const int64_t *bdims) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  if (xt->rank > rank || rank > TPU_MAX_RANK || (xt->rank && !bdims) || (rank && !dims)) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.broadcast_in_dim: bad rank %d for an operand of rank %d", rank,
                 xt->rank);
    return TPU_HV_NONE;
  }
  bool used[TPU_MAX_RANK] = {0};
  for (int i = 0; i < xt->rank; i++) {
    if (bdims[i] < 0 || bdims[i] >= rank || used[bdims[i]] || (xt->dims[i] != 1 && xt->dims[i] != dims[bdims[i]])) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.broadcast_in_dim: dimension %d does not fit", i);
      return TPU_HV_NONE;
    }
    used[bdims[i]] = true;
  }
  tpu_hlo_type t = tpu_hlo_type_make(xt->dtype, rank, dims);
  if (tpu_hlo_type_eq(&t, xt)) {
    bool ident = true;
    for (int i = 0; i < rank; i++) ident = ident && bdims[i] == i;
    if (ident) return x;
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "broadcast_dimensions", bdims, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.broadcast_in_dim", &x, 1, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_transpose(tpu_hlo *m, tpu_hv x, const int64_t *perm) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  tpu_hlo_type t = *xt;
  bool ident = true, seen[TPU_MAX_RANK] = {0};
  for (int i = 0; i < xt->rank; i++) {
    if (perm[i] < 0 || perm[i] >= xt->rank || seen[perm[i]]) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.transpose: not a permutation");
      return TPU_HV_NONE;
    }
    seen[perm[i]] = true;
    t.dims[i] = xt->dims[perm[i]];
    ident = ident && perm[i] == i;
  }
  if (ident) return x;
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "permutation", perm, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.transpose", &x, 1, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_slice(tpu_hlo *m, tpu_hv x, const int64_t *start, const int64_t *limit, const int64_t *strides) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  tpu_hlo_type t = *xt;
  int64_t ones[TPU_MAX_RANK];
  for (int i = 0; i < xt->rank; i++) {
    ones[i] = strides ? strides[i] : 1;
    if (start[i] < 0 || limit[i] > xt->dims[i] || start[i] > limit[i] || ones[i] < 1) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.slice: bad bounds in dimension %d", i);
      return TPU_HV_NONE;
    }
    t.dims[i] = (limit[i] - start[i] + ones[i] - 1) / ones[i];
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "start_indices", start, xt->rank);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "limit_indices", limit, xt->rank);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "strides", ones, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.slice", &x, 1, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

/* Start indices: one 0-d integer per dimension, all of one dtype. */
static bool tpu_starts_ok(tpu_hlo *m, const char *op, const tpu_hv *starts, int n) {
  for (int i = 0; i < n; i++) {
    const tpu_hlo_type *t = &TY(starts[i]);
    if (t->rank != 0 || !tpu_dtype_is_int(t->dtype) || t->dtype != TY(starts[0]).dtype) {
      char a[128];
      tpu_hlo_type_str(t, a, sizeof a);
      tpu_hlo_fail(m, TPU_ERR_TYPE, "%s: start index %d has type %s; want 0-d integers of one dtype", op, i, a);
      return false;
    }
  }
  return true;
}

tpu_hv tpu_hlo_dynamic_slice(tpu_hlo *m, tpu_hv x, const tpu_hv *starts, const int64_t *sizes) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  tpu_hv ops[1 + TPU_MAX_RANK];
  ops[0] = x;
  for (int i = 0; i < xt->rank; i++) ops[1 + i] = starts[i];
  if (!tpu_hloi_check(m, ops, 1 + xt->rank)) return TPU_HV_NONE;
  if (!tpu_starts_ok(m, "stablehlo.dynamic_slice", starts, xt->rank)) return TPU_HV_NONE;
  for (int i = 0; i < xt->rank; i++)
    if (sizes[i] < 0 || sizes[i] > xt->dims[i]) {
      tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.dynamic_slice: size %lld out of range in dimension %d",
                   (long long)sizes[i], i);
      return TPU_HV_NONE;
    }
  tpu_hlo_type t = tpu_hlo_type_make(xt->dtype, xt->rank, sizes);
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "slice_sizes", sizes, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.dynamic_slice", ops, 1 + xt->rank, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_dynamic_update_slice(tpu_hlo *m, tpu_hv x, tpu_hv update, const tpu_hv *starts) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &TY(x);
  tpu_hv ops[2 + TPU_MAX_RANK];
  ops[0] = x;
  ops[1] = update;
  for (int i = 0; i < xt->rank; i++) ops[2 + i] = starts[i];
  if (!tpu_hloi_check(m, ops, 2 + xt->rank)) return TPU_HV_NONE;
  bool fits = TY(update).dtype == xt->dtype && TY(update).rank == xt->rank;
  for (int i = 0; fits && i < xt->rank; i++) fits = TY(update).dims[i] <= xt->dims[i];
  if (!fits) {
    tpu_hloi_fail_types(m, "stablehlo.dynamic_update_slice", x, update);
    return TPU_HV_NONE;
  }
  if (!tpu_starts_ok(m, "stablehlo.dynamic_update_slice", starts, xt->rank)) return TPU_HV_NONE;
  return tpu_hlo_emit1(m, "stablehlo.dynamic_update_slice", ops, 2 + xt->rank, NULL, *xt);
}

tpu_hv tpu_hlo_concat(tpu_hlo *m, const tpu_hv *xs, int n, int dim) {
  if (n < 1 || !tpu_hloi_check(m, xs, n)) {
    if (n < 1) tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.concatenate: no operands");
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = TY(xs[0]);
  if (dim < 0 || dim >= t.rank) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.concatenate: bad dimension %d", dim);
    return TPU_HV_NONE;
  }
  t.dims[dim] = 0;
  for (int i = 0; i < n; i++) {
    const tpu_hlo_type *u = &TY(xs[i]);
    bool ok = u->dtype == t.dtype && u->rank == t.rank;
    for (int d = 0; ok && d < t.rank; d++) ok = d == dim || u->dims[d] == t.dims[d];
    if (!ok) {
      tpu_hloi_fail_types(m, "stablehlo.concatenate", xs[0], xs[i]);
      return TPU_HV_NONE;
    }
    t.dims[dim] += u->dims[dim];
  }
  if (n == 1) return xs[0];
  char attrs[48];
  snprintf(attrs, sizeof attrs, "dimension = %d : i64", dim);
  return tpu_hlo_emit1(m, "stablehlo.concatenate", xs, n, attrs, t);
}

tpu_hv tpu_hlo_pad(tpu_hlo *m, tpu_hv x, tpu_hv padval, const int64_t *lo, const int64_t *hi,
                   const int64_t *interior) {
  tpu_hv ops[2] = {x, padval};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  tpu_hlo_type t = TY(x);
  if (TY(padval).rank != 0 || TY(padval).dtype != t.dtype) {
    tpu_hloi_fail_types(m, "stablehlo.pad", x, padval);
    return TPU_HV_NONE;
  }
  int64_t zeros[TPU_MAX_RANK] = {0};
  const int64_t *in = interior ? interior : zeros;
  for (int i = 0; i < t.rank; i++) {
    int64_t d = t.dims[i];
    t.dims[i] = lo[i] + hi[i] + d + (d > 0 ? (d - 1) * in[i] : 0);
    if (t.dims[i] < 0 || in[i] < 0) {
      tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.pad: negative result size in dimension %d", i);
      return TPU_HV_NONE;
    }
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "edge_padding_low", lo, t.rank);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "edge_padding_high", hi, t.rank);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "interior_padding", in, t.rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.pad", ops, 2, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_reverse(tpu_hlo *m, tpu_hv x, const int64_t *dims, int ndims) {
  if (!tpu_hloi_check(m, &x, 1)) return TPU_HV_NONE;
  if (ndims == 0) return x;
  bool seen[TPU_MAX_RANK] = {0};
  for (int i = 0; i < ndims; i++) {
    if (ndims > TY(x).rank || dims[i] < 0 || dims[i] >= TY(x).rank || seen[dims[i]]) {
      tpu_hlo_fail(m, TPU_ERR_INDEX, "stablehlo.reverse: bad dimension list");
      return TPU_HV_NONE;
    }
    seen[dims[i]] = true;
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "dimensions", dims, ndims);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.reverse", &x, 1, tpu_hloi_attrs_str(&a), TY(x));
  tpu_hloi_attrs_free(&a);
  return r;
}

/* ---- reductions ----------------------------------------------------------------------- */

static int tpu_scalar_body(tpu_hlo *m, tpu_dtype dt, tpu_hlo_op op) {
  tpu_hlo_type st = tpu_hlo_type_make(dt, 0, NULL);
  tpu_hlo_type sts[2] = {st, st};
  tpu_hv args[2];
  tpu_hlo_region_begin(m, sts, 2, args);
  tpu_hv r = tpu_hlo_binary(m, op, args[0], args[1]);
  return tpu_hlo_region_end(m, &r, 1);
}

/* Variadic reductions: n inputs of one shape, n 0-d inits of their dtypes,
 * and a body (acc..., elem...) -> acc... over those scalars. */
static bool tpu_reduce_operands(tpu_hlo *m, const char *op, const tpu_hv *xs, const tpu_hv *inits, int n,
                                int region, tpu_hv *ops) {
  if (n < 1 || n > 8) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: %d operands (1 to 8 supported)", op, n);
    return false;
  }
  for (int i = 0; i < n; i++) {
    ops[i] = xs[i];
    ops[n + i] = inits[i];
  }
  if (!tpu_hloi_check(m, ops, 2 * n)) return false;
  tpu_hlo_type st[16];
  for (int i = 0; i < n; i++) {
    const tpu_hlo_type *x = &TY(xs[i]), *x0 = &TY(xs[0]);
    bool same = x->rank == x0->rank && memcmp(x->dims, x0->dims, sizeof(int64_t) * (size_t)x->rank) == 0;
    if (!same) {
      tpu_hloi_fail_types(m, op, xs[0], xs[i]);
      return false;
    }
    st[i] = st[n + i] = tpu_hlo_type_make(x->dtype, 0, NULL);
    if (!tpu_hlo_type_eq(&TY(inits[i]), &st[i])) {
      tpu_hloi_fail_types(m, op, xs[i], inits[i]);
      return false;
    }
  }
  return tpu_hloi_region_sig(m, op, region, st, 2 * n, st, n);
}

bool tpu_hlo_reduce_region(tpu_hlo *m, const tpu_hv *xs, const tpu_hv *inits, int n, const int64_t *dims, int ndims,
                           int region, tpu_hv *outs) {
  for (int i = 0; i < n && i < 8; i++) outs[i] = TPU_HV_NONE;
  tpu_hv ops[16];
  if (!tpu_reduce_operands(m, "stablehlo.reduce", xs, inits, n, region, ops)) return false;
  const tpu_hlo_type *xt = &TY(xs[0]);
  bool red[TPU_MAX_RANK] = {0};
  if (ndims < 0 || ndims > xt->rank) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.reduce: %d dimensions for rank %d", ndims, xt->rank);
    return false;
  }
  for (int i = 0; i < ndims; i++) {
    if (dims[i] < 0 || dims[i] >= xt->rank || red[dims[i]]) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.reduce: bad dimension %lld", (long long)dims[i]);
      return false;
    }
    red[dims[i]] = true;
  }
  tpu_hlo_type rt[8];
  for (int k = 0; k < n; k++) {
    rt[k] = tpu_hlo_type_make(TY(xs[k]).dtype, 0, NULL);
    for (int i = 0; i < xt->rank; i++)
      if (!red[i]) rt[k].dims[rt[k].rank++] = xt->dims[i];
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "dimensions", dims, ndims);
  bool ok = tpu_hlo_emit(m, "stablehlo.reduce", ops, 2 * n, &region, 1, tpu_hloi_attrs_str(&a), rt, n, outs);
  tpu_hloi_attrs_free(&a);
  return ok;
}

tpu_hv tpu_hlo_reduce(tpu_hlo *m, tpu_hv x, tpu_hv init, const int64_t *dims, int ndims, tpu_hlo_op op) {
  tpu_hv ops[2] = {x, init};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  int region = tpu_scalar_body(m, TY(x).dtype, op);
  tpu_hv out = TPU_HV_NONE;
  tpu_hlo_reduce_region(m, &x, &init, 1, dims, ndims, region, &out);
  return out;
}

void tpu_hloi_put_padding(tpu_hlo *m, tpu_buf *b, const int64_t *pad, int rank) {
  tpu_hloi_buf_put(m, b, "padding = dense<[", 17);
  for (int i = 0; i < rank; i++)
    tpu_hloi_buf_printf(m, b, "%s[%lld, %lld]", i ? ", " : "", (long long)(pad ? pad[2 * i] : 0),
                        (long long)(pad ? pad[2 * i + 1] : 0));
  tpu_hloi_buf_printf(m, b, "]> : tensor<%dx2xi64>", rank);
}

bool tpu_hlo_reduce_window(tpu_hlo *m, const tpu_hv *xs, const tpu_hv *inits, int n, const int64_t *window,
                           const int64_t *strides, const int64_t *base_dil, const int64_t *win_dil, const int64_t *pad,
                           int region, tpu_hv *outs) {
  for (int i = 0; i < n && i < 8; i++) outs[i] = TPU_HV_NONE;
  tpu_hv ops[16];
  if (!tpu_reduce_operands(m, "stablehlo.reduce_window", xs, inits, n, region, ops)) return false;
  const tpu_hlo_type *xt = &TY(xs[0]);
  int r = xt->rank;
  int64_t ones[TPU_MAX_RANK];
  for (int i = 0; i < r; i++) ones[i] = 1;
  const int64_t *st = strides ? strides : ones, *bd = base_dil ? base_dil : ones, *wd = win_dil ? win_dil : ones;
  for (int i = 0; i < r; i++)
    if (!window || window[i] < 1 || st[i] < 1 || bd[i] < 1 || wd[i] < 1) {
      tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.reduce_window: window, strides and dilations must be >= 1 (dim %d)",
                   i);
      return false;
    }
  tpu_hlo_type rt[8];
  for (int k = 0; k < n; k++) {
    rt[k] = TY(xs[k]);
    for (int i = 0; i < r; i++) {
      int64_t dil = xt->dims[i] ? (xt->dims[i] - 1) * bd[i] + 1 : 0;
      int64_t padded = dil + (pad ? pad[2 * i] + pad[2 * i + 1] : 0);
      int64_t wspan = (window[i] - 1) * wd[i] + 1;
      rt[k].dims[i] = padded < wspan ? 0 : (padded - wspan) / st[i] + 1;
    }
  }
  tpu_attrs a = {0};
  tpu_hloi_put_array(m, &a.b, "window_dimensions", window, r);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "window_strides", st, r);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "base_dilations", bd, r);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "window_dilations", wd, r);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_padding(m, &a.b, pad, r);
  bool ok = tpu_hlo_emit(m, "stablehlo.reduce_window", ops, 2 * n, &region, 1, tpu_hloi_attrs_str(&a), rt, n, outs);
  tpu_hloi_attrs_free(&a);
  return ok;
}

/* ---- matmul, gather, scatter, sort, rng, convolution ------------------------------------- */

static void tpu_put_list(tpu_hlo *m, tpu_buf *b, const char *name, const int64_t *v, int n, bool *first) {
  if (n == 0) return;
  tpu_hloi_buf_printf(m, b, "%s%s = [", *first ? "" : ", ", name);
  tpu_hloi_put_i64s(m, b, v, n);
  tpu_hloi_buf_put(m, b, "]", 1);
  *first = false;
}

tpu_hv tpu_hlo_dot_general(tpu_hlo *m, tpu_hv lhs, tpu_hv rhs, int nbatch, const int64_t *lhs_batch,
                           const int64_t *rhs_batch, int ncontract, const int64_t *lhs_contract,
                           const int64_t *rhs_contract, tpu_hlo_precision p, tpu_dtype out_dt) {
  tpu_hv ops[2] = {lhs, rhs};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  const tpu_hlo_type *lt = &TY(lhs), *rt = &TY(rhs);
  bool lused[TPU_MAX_RANK] = {0}, rused[TPU_MAX_RANK] = {0};
  tpu_hlo_type t = tpu_hlo_type_make(out_dt == TPU_INVALID ? lt->dtype : out_dt, 0, NULL);
  if (lt->dtype != rt->dtype || nbatch < 0 || ncontract < 0 || nbatch + ncontract > lt->rank ||
      nbatch + ncontract > rt->rank || (int)p < 0 || p > TPU_HLO_PREC_HIGHEST)
    goto bad;
  /* Every listed dimension in range and used once; sizes pair up. */
  for (int i = 0; i < nbatch + ncontract; i++) {
    int64_t l = i < nbatch ? lhs_batch[i] : lhs_contract[i - nbatch];
    int64_t r = i < nbatch ? rhs_batch[i] : rhs_contract[i - nbatch];
    if (l < 0 || l >= lt->rank || r < 0 || r >= rt->rank || lused[l] || rused[r] || lt->dims[l] != rt->dims[r])
      goto bad;
    lused[l] = rused[r] = true;
    if (i < nbatch) t.dims[t.rank++] = lt->dims[l];
  }
  for (int i = 0; i < lt->rank; i++)
    if (!lused[i]) {
      if (t.rank == TPU_MAX_RANK) goto bad;
      t.dims[t.rank++] = lt->dims[i];
    }
  for (int i = 0; i < rt->rank; i++)
    if (!rused[i]) {
      if (t.rank == TPU_MAX_RANK) goto bad;
      t.dims[t.rank++] = rt->dims[i];
    }
  {
    static const char *prec[] = {"DEFAULT", "HIGH", "HIGHEST"};
    tpu_attrs a = {0};
    bool first = true;
    tpu_hloi_buf_put(m, &a.b, "dot_dimension_numbers = #stablehlo.dot<",
                     strlen("dot_dimension_numbers = #stablehlo.dot<"));
    tpu_put_list(m, &a.b, "lhs_batching_dimensions", lhs_batch, nbatch, &first);
    tpu_put_list(m, &a.b, "rhs_batching_dimensions", rhs_batch, nbatch, &first);
    tpu_put_list(m, &a.b, "lhs_contracting_dimensions", lhs_contract, ncontract, &first);
    tpu_put_list(m, &a.b, "rhs_contracting_dimensions", rhs_contract, ncontract, &first);
    tpu_hloi_buf_printf(m, &a.b, ">, precision_config = [#stablehlo<precision %s>, #stablehlo<precision %s>]", prec[p],
                        prec[p]);
    tpu_hv r = tpu_hlo_emit1(m, "stablehlo.dot_general", ops, 2, tpu_hloi_attrs_str(&a), t);
    tpu_hloi_attrs_free(&a);
    return r;
  }
bad:
  tpu_hloi_fail_types(m, "stablehlo.dot_general", lhs, rhs);
  return TPU_HV_NONE;
}

/* A dimension list: at most TPU_MAX_RANK entries, each in [0, rank). */
static bool tpu_dims_ok(const int64_t *v, int n, int rank) {
  if (n < 0 || n > TPU_MAX_RANK) return false;
  for (int i = 0; i < n; i++)
    if (v[i] < 0 || v[i] >= rank) return false;
  return true;
}

tpu_hv tpu_hlo_gather(tpu_hlo *m, tpu_hv operand, tpu_hv indices, const tpu_hlo_gather_dims *d,
                      const int64_t *slice_sizes, tpu_hlo_type result) {
  tpu_hv ops[2] = {operand, indices};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  const tpu_hlo_type *ot = &TY(operand), *it = &TY(indices);
  bool ok = tpu_dims_ok(d->offset_dims, d->n_offset, result.rank) &&
            tpu_dims_ok(d->collapsed_slice_dims, d->n_collapsed, ot->rank) &&
            tpu_dims_ok(d->operand_batching_dims, d->n_operand_batching, ot->rank) &&
            tpu_dims_ok(d->start_indices_batching_dims, d->n_operand_batching, it->rank) &&
            tpu_dims_ok(d->start_index_map, d->n_start_index_map, ot->rank) && d->index_vector_dim >= 0 &&
            d->index_vector_dim <= it->rank && tpu_dtype_is_int(it->dtype) && result.dtype == ot->dtype;
  for (int i = 0; ok && i < ot->rank; i++) ok = slice_sizes[i] >= 0 && slice_sizes[i] <= ot->dims[i];
  if (!ok) {
    tpu_hloi_fail_types(m, "stablehlo.gather: bad dimension numbers, slice sizes or types for", operand, indices);
    return TPU_HV_NONE;
  }
  tpu_attrs a = {0};
  bool first = true;
  tpu_hloi_buf_put(m, &a.b, "dimension_numbers = #stablehlo.gather<", strlen("dimension_numbers = #stablehlo.gather<"));
  tpu_put_list(m, &a.b, "offset_dims", d->offset_dims, d->n_offset, &first);
  tpu_put_list(m, &a.b, "collapsed_slice_dims", d->collapsed_slice_dims, d->n_collapsed, &first);
  tpu_put_list(m, &a.b, "operand_batching_dims", d->operand_batching_dims, d->n_operand_batching, &first);
  tpu_put_list(m, &a.b, "start_indices_batching_dims", d->start_indices_batching_dims, d->n_operand_batching, &first);
  tpu_put_list(m, &a.b, "start_index_map", d->start_index_map, d->n_start_index_map, &first);
  tpu_hloi_buf_printf(m, &a.b, "%sindex_vector_dim = %lld>, indices_are_sorted = false, ", first ? "" : ", ",
                      (long long)d->index_vector_dim);
  tpu_hloi_put_array(m, &a.b, "slice_sizes", slice_sizes, TY(operand).rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.gather", ops, 2, tpu_hloi_attrs_str(&a), result);
  tpu_hloi_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_scatter(tpu_hlo *m, tpu_hv operand, tpu_hv indices, tpu_hv updates, const tpu_hlo_scatter_dims *d,
                       int region) {
  tpu_hv ops[3] = {operand, indices, updates};
  if (!tpu_hloi_check(m, ops, 3)) return TPU_HV_NONE;
  const tpu_hlo_type *ot = &TY(operand), *it = &TY(indices), *ut = &TY(updates);
  bool ok = tpu_dims_ok(d->update_window_dims, d->n_update_window, ut->rank) &&
            tpu_dims_ok(d->inserted_window_dims, d->n_inserted, ot->rank) &&
            tpu_dims_ok(d->input_batching_dims, d->n_input_batching, ot->rank) &&
            tpu_dims_ok(d->scatter_indices_batching_dims, d->n_input_batching, it->rank) &&
            tpu_dims_ok(d->scatter_dims_to_operand_dims, d->n_scatter_to_operand, ot->rank) &&
            d->index_vector_dim >= 0 && d->index_vector_dim <= it->rank && tpu_dtype_is_int(it->dtype) &&
            ut->dtype == ot->dtype;
  if (!ok) {
    tpu_hloi_fail_types(m, "stablehlo.scatter: bad dimension numbers or types for", operand, updates);
    return TPU_HV_NONE;
  }
  tpu_hlo_type st = tpu_hlo_type_make(ot->dtype, 0, NULL);
  tpu_hlo_type sts[2] = {st, st};
  if (region < 0) {
    tpu_hv args[2];
    tpu_hlo_region_begin(m, sts, 2, args);
    region = tpu_hlo_region_end(m, &args[1], 1);
    if (region < 0) return TPU_HV_NONE;
  }
  if (!tpu_hloi_region_sig(m, "stablehlo.scatter", region, sts, 2, &st, 1)) return TPU_HV_NONE;
  tpu_attrs a = {0};
  bool first = true;
  tpu_hloi_buf_put(m, &a.b, "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<",
                   strlen("indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<"));
  tpu_put_list(m, &a.b, "update_window_dims", d->update_window_dims, d->n_update_window, &first);
  tpu_put_list(m, &a.b, "inserted_window_dims", d->inserted_window_dims, d->n_inserted, &first);
  tpu_put_list(m, &a.b, "input_batching_dims", d->input_batching_dims, d->n_input_batching, &first);
  tpu_put_list(m, &a.b, "scatter_indices_batching_dims", d->scatter_indices_batching_dims, d->n_input_batching, &first);
  tpu_put_list(m, &a.b, "scatter_dims_to_operand_dims", d->scatter_dims_to_operand_dims, d->n_scatter_to_operand,
               &first);
  tpu_hloi_buf_printf(m, &a.b, "%sindex_vector_dim = %lld>, unique_indices = false", first ? "" : ", ",
                      (long long)d->index_vector_dim);
  tpu_hv out = TPU_HV_NONE;
  tpu_hlo_type rt = TY(operand);
  tpu_hlo_emit(m, "stablehlo.scatter", ops, 3, &region, 1, tpu_hloi_attrs_str(&a), &rt, 1, &out);
  tpu_hloi_attrs_free(&a);
  return out;
}

bool tpu_hlo_sort(tpu_hlo *m, const tpu_hv *xs, int n, int dim, bool stable, int region, tpu_hv *outs) {
  for (int i = 0; i < n && i < 8; i++) outs[i] = TPU_HV_NONE;
  if (n < 1 || n > 8) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.sort: %d operands (1 to 8 supported)", n);
    return false;
  }
  if (!tpu_hloi_check(m, xs, n)) return false;
  tpu_hlo_type rt[8], args[16], pred = tpu_hlo_type_make(TPU_PRED, 0, NULL);
  for (int i = 0; i < n; i++) {
    rt[i] = TY(xs[i]);
    if (rt[i].rank != rt[0].rank || memcmp(rt[i].dims, rt[0].dims, sizeof(int64_t) * (size_t)rt[0].rank) != 0) {
      tpu_hloi_fail_types(m, "stablehlo.sort", xs[0], xs[i]);
      return false;
    }
    args[2 * i] = args[2 * i + 1] = tpu_hlo_type_make(rt[i].dtype, 0, NULL);
  }
  if (dim < 0 || dim >= rt[0].rank) {
    tpu_hlo_fail(m, TPU_ERR_INDEX, "stablehlo.sort: dimension %d out of range for rank %d", dim, rt[0].rank);
    return false;
  }
  if (!tpu_hloi_region_sig(m, "stablehlo.sort", region, args, 2 * n, &pred, 1)) return false;
  char attrs[64];
  snprintf(attrs, sizeof attrs, "dimension = %d : i64, is_stable = %s", dim, stable ? "true" : "false");
  return tpu_hlo_emit(m, "stablehlo.sort", xs, n, &region, 1, attrs, rt, n, outs);
}

tpu_hv tpu_hlo_rng_bit_generator(tpu_hlo *m, tpu_hv state, tpu_hlo_type bits, tpu_hv *new_state) {
  *new_state = TPU_HV_NONE;
  if (!tpu_hloi_check(m, &state, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *s = &TY(state);
  if (s->dtype != TPU_U64 || s->rank != 1 || s->dims[0] != 2) {
    char a[128];
    tpu_hlo_type_str(s, a, sizeof a);
    tpu_hlo_fail(m, TPU_ERR_TYPE, "stablehlo.rng_bit_generator: state has type %s, want tensor<2xui64>", a);
    return TPU_HV_NONE;
  }
  if (!tpu_dtype_is_int(bits.dtype) && !tpu_dtype_is_float(bits.dtype)) {
    tpu_hloi_fail_type(m, "stablehlo.rng_bit_generator: bits", &bits);
    return TPU_HV_NONE;
  }
  tpu_hlo_type rt[2] = {TY(state), bits};
  tpu_hv outs[2];
  if (!tpu_hlo_emit(m, "stablehlo.rng_bit_generator", &state, 1, NULL, 0,
                    "rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>", rt, 2, outs))
    return TPU_HV_NONE;
  *new_state = outs[0];
  return outs[1];
}

tpu_hv tpu_hlo_convolution(tpu_hlo *m, tpu_hv input, tpu_hv kernel, int nsp, const int64_t *strides,
                           const int64_t *pad, const int64_t *lhs_dil, const int64_t *rhs_dil, int64_t feature_groups,
                           int64_t batch_groups, tpu_hlo_precision p) {
  tpu_hv ops[2] = {input, kernel};
  if (!tpu_hloi_check(m, ops, 2)) return TPU_HV_NONE;
  const tpu_hlo_type *it = &TY(input), *kt = &TY(kernel);
  if (nsp < 0 || nsp > TPU_MAX_RANK - 2 || it->rank != nsp + 2 || kt->rank != nsp + 2 || it->dtype != kt->dtype ||
      feature_groups < 1 || batch_groups < 1 || (int)p < 0 || p > TPU_HLO_PREC_HIGHEST ||
      it->dims[1] != kt->dims[1] * feature_groups || kt->dims[0] % feature_groups != 0 ||
      it->dims[0] % batch_groups != 0 || kt->dims[0] % batch_groups != 0) {
    tpu_hloi_fail_types(m, "stablehlo.convolution: ranks, dtypes or group counts do not fit for", input, kernel);
    return TPU_HV_NONE;
  }
  int64_t ones[TPU_MAX_RANK];
  for (int i = 0; i < nsp; i++) ones[i] = 1;
  const int64_t *st = strides ? strides : ones, *ld = lhs_dil ? lhs_dil : ones, *rd = rhs_dil ? rhs_dil : ones;
  for (int i = 0; i < nsp; i++)
    if (st[i] < 1 || ld[i] < 1 || rd[i] < 1) {
      tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.convolution: strides and dilations must be >= 1 (dim %d)", i);
      return TPU_HV_NONE;
    }
  tpu_hlo_type t = *it;
  t.dims[0] = it->dims[0] / (batch_groups > 0 ? batch_groups : 1);
  t.dims[1] = kt->dims[0];
  for (int i = 0; i < nsp; i++) {
    int64_t in = (it->dims[2 + i] ? (it->dims[2 + i] - 1) * ld[i] + 1 : 0) + (pad ? pad[2 * i] + pad[2 * i + 1] : 0);
    int64_t k = (kt->dims[2 + i] - 1) * rd[i] + 1;
    t.dims[2 + i] = in < k ? 0 : (in - k) / st[i] + 1;
  }
  static const char *prec[] = {"DEFAULT", "HIGH", "HIGHEST"};
  tpu_attrs a = {0};
  tpu_hloi_buf_printf(m, &a.b, "batch_group_count = %lld : i64, dimension_numbers = #stablehlo.conv<[b, f",
                      (long long)batch_groups);
  for (int i = 0; i < nsp; i++) tpu_hloi_buf_printf(m, &a.b, ", %d", i);
  tpu_hloi_buf_put(m, &a.b, "]x[o, i", strlen("]x[o, i"));
  for (int i = 0; i < nsp; i++) tpu_hloi_buf_printf(m, &a.b, ", %d", i);
  tpu_hloi_buf_put(m, &a.b, "]->[b, f", strlen("]->[b, f"));
  for (int i = 0; i < nsp; i++) tpu_hloi_buf_printf(m, &a.b, ", %d", i);
  tpu_hloi_buf_printf(m, &a.b, "]>, feature_group_count = %lld : i64, ", (long long)feature_groups);
  tpu_hloi_put_array(m, &a.b, "lhs_dilation", ld, nsp);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_padding(m, &a.b, pad, nsp);
  tpu_hloi_buf_printf(m, &a.b, ", precision_config = [#stablehlo<precision %s>, #stablehlo<precision %s>], ", prec[p],
                      prec[p]);
  tpu_hloi_put_array(m, &a.b, "rhs_dilation", rd, nsp);
  tpu_hloi_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_hloi_put_array(m, &a.b, "window_strides", st, nsp);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.convolution", ops, 2, tpu_hloi_attrs_str(&a), t);
  tpu_hloi_attrs_free(&a);
  return r;
}
