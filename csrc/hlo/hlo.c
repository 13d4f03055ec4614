/* hlo.c: the StableHLO builder (see hlo.h).
 *
 * Text is MLIR generic form, which changes least across StableHLO versions.
 * Every value (parameter, op result, region argument) gets the next id and
 * is printed as %vN, so identical call sequences give identical text. Open
 * regions form a stack of text buffers; the innermost one receives new ops.
 * A closed region's text waits in a table until the op that owns it is
 * emitted, which splices it in.
 */
#define _POSIX_C_SOURCE 200809L
#include "hlo.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *p;
  size_t n, cap;
} tpu_buf;

#define TPU_HLO_MAX_DEPTH 8

struct tpu_hlo {
  tpu_status *err;       /* sticky, owned */
  tpu_hlo_type *types;   /* by value id */
  int nvals, capvals;
  tpu_hv *params;
  int nparams, capparams;
  int *alias;            /* per param: result index or -1 */
  tpu_buf body;
  tpu_buf stack[TPU_HLO_MAX_DEPTH]; /* open regions */
  int depth;
  char **regions;        /* closed, not yet consumed */
  int nregions, capregions;
  bool oom;
};

static const tpu_hlo_type tpu_hlo_invalid_type = {TPU_INVALID, 0, {0}};

/* ---- small helpers ---------------------------------------------------------------- */

static void tpu_buf_put(tpu_hlo *m, tpu_buf *b, const char *s, size_t n) {
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

static void tpu_buf_printf(tpu_hlo *m, tpu_buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void tpu_buf_printf(tpu_hlo *m, tpu_buf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    tpu_buf_put(m, b, tmp, (size_t)n);
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
  tpu_buf_put(m, b, big, (size_t)n);
  free(big);
}

static tpu_buf *tpu_cur(tpu_hlo *m) { return m->depth ? &m->stack[m->depth - 1] : &m->body; }

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

static void tpu_put_type(tpu_hlo *m, tpu_buf *b, const tpu_hlo_type *t) {
  char s[256];
  int n = tpu_hlo_type_str(t, s, sizeof s);
  tpu_buf_put(m, b, s, (size_t)(n < (int)sizeof s ? n : (int)sizeof s - 1));
}

static void tpu_put_i64s(tpu_hlo *m, tpu_buf *b, const int64_t *v, int n) {
  for (int i = 0; i < n; i++) tpu_buf_printf(m, b, "%s%lld", i ? ", " : "", (long long)v[i]);
}

/* "array<i64: 1, 2>" */
static void tpu_put_array(tpu_hlo *m, tpu_buf *b, const char *name, const int64_t *v, int n) {
  tpu_buf_printf(m, b, "%s = array<i64%s", name, n ? ": " : "");
  tpu_put_i64s(m, b, v, n);
  tpu_buf_put(m, b, ">", 1);
}

/* ---- module ------------------------------------------------------------------------ */

tpu_hlo *tpu_hlo_new(void) { return calloc(1, sizeof(tpu_hlo)); }

void tpu_hlo_free(tpu_hlo *m) {
  if (!m) return;
  tpu_status_free(m->err);
  free(m->types);
  free(m->params);
  free(m->alias);
  free(m->body.p);
  for (int i = 0; i < TPU_HLO_MAX_DEPTH; i++) free(m->stack[i].p);
  for (int i = 0; i < m->nregions; i++) free(m->regions[i]);
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
  if (m->nvals == m->capvals) {
    int cap = m->capvals ? m->capvals * 2 : 64;
    tpu_hlo_type *q = realloc(m->types, sizeof *q * (size_t)cap);
    if (!q) {
      m->oom = true;
      return TPU_HV_NONE;
    }
    m->types = q;
    m->capvals = cap;
  }
  m->types[m->nvals] = *t;
  return m->nvals++;
}

const tpu_hlo_type *tpu_hlo_typeof(const tpu_hlo *m, tpu_hv v) {
  if (v < 0 || v >= m->nvals) return &tpu_hlo_invalid_type;
  return &m->types[v];
}

static bool tpu_check(tpu_hlo *m, const tpu_hv *vs, int n) {
  if (!tpu_hlo_ok(m)) return false;
  for (int i = 0; i < n; i++)
    if (vs[i] < 0 || vs[i] >= m->nvals) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: invalid value handle %d", vs[i]);
      return false;
    }
  return true;
}

tpu_hv tpu_hlo_param(tpu_hlo *m, tpu_hlo_type t) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  if (m->depth) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: parameter declared inside a region");
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
  for (int i = 0; i < m->nparams; i++)
    if (m->params[i] == p) {
      m->alias[i] = result_index;
      return;
    }
  tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: alias of a value that is not a parameter");
}

uint64_t tpu_hlo_hash(const char *text, size_t len) {
  uint64_t h = 14695981039346656037ull; /* the FNV-1a 64 offset basis */
  for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)text[i]) * 1099511628211ull;
  return h;
}

tpu_status *tpu_hlo_finish(tpu_hlo *m, const tpu_hv *results, int n, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  if (m->depth && tpu_hlo_ok(m)) tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: a region was left open");
  tpu_check(m, results, n);
  for (int i = 0; i < m->nparams && tpu_hlo_ok(m); i++)
    if (m->alias[i] >= 0 && (m->alias[i] >= n || !tpu_hlo_type_eq(&m->types[m->params[i]], &m->types[results[m->alias[i]]])))
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: parameter %d aliases result %d of another type", i, m->alias[i]);
  if (m->oom && !m->err) m->err = tpu_status_new(TPU_ERR_MEMORY, "out of memory building a program");
  if (m->err) {
    tpu_status *s = m->err;
    m->err = NULL;
    m->oom = false;
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: already finished with an error");
    return s;
  }
  tpu_buf out = {0};
  tpu_buf_printf(m, &out,
                 "module @torchtpu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
                 "  func.func public @main(");
  for (int i = 0; i < m->nparams; i++) {
    tpu_buf_printf(m, &out, "%s%%v%d: ", i ? ", " : "", m->params[i]);
    tpu_put_type(m, &out, &m->types[m->params[i]]);
    if (m->alias[i] >= 0) tpu_buf_printf(m, &out, " {tf.aliasing_output = %d : i32}", m->alias[i]);
  }
  tpu_buf_printf(m, &out, ") -> (");
  for (int i = 0; i < n; i++) {
    if (i) tpu_buf_put(m, &out, ", ", 2);
    tpu_put_type(m, &out, &m->types[results[i]]);
  }
  tpu_buf_printf(m, &out, ") {\n");
  if (m->body.n) tpu_buf_put(m, &out, m->body.p, m->body.n);
  tpu_buf_printf(m, &out, "    \"func.return\"(");
  for (int i = 0; i < n; i++) tpu_buf_printf(m, &out, "%s%%v%d", i ? ", " : "", results[i]);
  tpu_buf_printf(m, &out, ") : (");
  for (int i = 0; i < n; i++) {
    if (i) tpu_buf_put(m, &out, ", ", 2);
    tpu_put_type(m, &out, &m->types[results[i]]);
  }
  tpu_buf_printf(m, &out, ") -> ()\n  }\n}\n");
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
  if (!tpu_check(m, operands, nops)) return false;
  for (int i = 0; i < nregions; i++)
    if (regions[i] < 0 || regions[i] >= m->nregions || !m->regions[regions[i]]) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: invalid region", name);
      return false;
    }
  tpu_buf *b = tpu_cur(m);
  int indent = 4 + 2 * m->depth;
  tpu_buf_printf(m, b, "%*s", indent, "");
  for (int i = 0; i < nres; i++) {
    outs[i] = tpu_new_value(m, &result_types[i]);
    tpu_buf_printf(m, b, "%s%%v%d", i ? ", " : "", outs[i]);
  }
  if (nres) tpu_buf_put(m, b, " = ", 3);
  tpu_buf_printf(m, b, "\"%s\"(", name);
  for (int i = 0; i < nops; i++) tpu_buf_printf(m, b, "%s%%v%d", i ? ", " : "", operands[i]);
  tpu_buf_put(m, b, ")", 1);
  if (nregions) {
    tpu_buf_put(m, b, " (", 2);
    for (int i = 0; i < nregions; i++) {
      if (i) tpu_buf_put(m, b, ", ", 2);
      char *r = m->regions[regions[i]];
      tpu_buf_put(m, b, r, strlen(r));
      free(r);
      m->regions[regions[i]] = NULL;
    }
    tpu_buf_put(m, b, ")", 1);
  }
  if (attrs && attrs[0]) tpu_buf_printf(m, b, " {%s}", attrs);
  tpu_buf_put(m, b, " : (", 4);
  for (int i = 0; i < nops; i++) {
    if (i) tpu_buf_put(m, b, ", ", 2);
    tpu_put_type(m, b, &m->types[operands[i]]);
  }
  tpu_buf_put(m, b, ") -> ", 5);
  if (nres != 1) tpu_buf_put(m, b, "(", 1);
  for (int i = 0; i < nres; i++) {
    if (i) tpu_buf_put(m, b, ", ", 2);
    tpu_put_type(m, b, &result_types[i]);
  }
  if (nres != 1) tpu_buf_put(m, b, ")", 1);
  tpu_buf_put(m, b, "\n", 1);
  return tpu_hlo_ok(m);
}

tpu_hv tpu_hlo_emit1(tpu_hlo *m, const char *name, const tpu_hv *operands, int nops, const char *attrs,
                     tpu_hlo_type result) {
  tpu_hv out = TPU_HV_NONE;
  tpu_hlo_emit(m, name, operands, nops, NULL, 0, attrs, &result, 1, &out);
  return out;
}

/* Attribute text built in a scratch buffer owned by the caller's frame. */
typedef struct {
  tpu_buf b;
} tpu_attrs;

static const char *tpu_attrs_str(tpu_attrs *a) { return a->b.p ? a->b.p : ""; }
static void tpu_attrs_free(tpu_attrs *a) { free(a->b.p); }

/* ---- regions ------------------------------------------------------------------------- */

void tpu_hlo_region_begin(tpu_hlo *m, const tpu_hlo_type *arg_types, int n, tpu_hv *args) {
  for (int i = 0; i < n; i++) args[i] = TPU_HV_NONE;
  if (!tpu_hlo_ok(m)) return;
  if (m->depth >= TPU_HLO_MAX_DEPTH) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: regions nested too deeply");
    return;
  }
  tpu_buf *b = &m->stack[m->depth++];
  b->n = 0;
  tpu_buf_printf(m, b, "{\n%*s^bb0(", 2 + 2 * m->depth, "");
  for (int i = 0; i < n; i++) {
    args[i] = tpu_new_value(m, &arg_types[i]);
    tpu_buf_printf(m, b, "%s%%v%d: ", i ? ", " : "", args[i]);
    tpu_put_type(m, b, &arg_types[i]);
  }
  tpu_buf_put(m, b, "):\n", 3);
}

int tpu_hlo_region_end(tpu_hlo *m, const tpu_hv *results, int n) {
  if (!m->depth) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: region_end without region_begin");
    return -1;
  }
  if (!tpu_check(m, results, n)) {
    m->depth--;
    return -1;
  }
  tpu_buf *b = &m->stack[m->depth - 1];
  tpu_buf_printf(m, b, "%*s\"stablehlo.return\"(", 4 + 2 * m->depth, "");
  for (int i = 0; i < n; i++) tpu_buf_printf(m, b, "%s%%v%d", i ? ", " : "", results[i]);
  tpu_buf_put(m, b, ") : (", 5);
  for (int i = 0; i < n; i++) {
    if (i) tpu_buf_put(m, b, ", ", 2);
    tpu_put_type(m, b, &m->types[results[i]]);
  }
  tpu_buf_printf(m, b, ") -> ()\n%*s}", 2 + 2 * m->depth, "");
  m->depth--;
  if (m->oom) return -1;
  if (m->nregions == m->capregions) {
    int cap = m->capregions ? m->capregions * 2 : 8;
    char **q = realloc(m->regions, sizeof *q * (size_t)cap);
    if (!q) {
      m->oom = true;
      return -1;
    }
    m->regions = q;
    m->capregions = cap;
  }
  char *txt = malloc(b->n + 1);
  if (!txt) {
    m->oom = true;
    return -1;
  }
  memcpy(txt, b->p, b->n + 1);
  m->regions[m->nregions] = txt;
  return m->nregions++;
}

/* ---- constants ------------------------------------------------------------------------ */

static void tpu_put_float(tpu_hlo *m, tpu_buf *b, tpu_dtype dt, double v) {
  if (isnan(v) || isinf(v) || (dt == TPU_F16 && fabs(v) > 65504.0) ||
      ((dt == TPU_F32 || dt == TPU_BF16) && fabs(v) > 3.4028234663852886e38)) {
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
    tpu_buf_put(m, b, s, strlen(s));
    return;
  }
  char tmp[64];
  if (dt == TPU_F64) snprintf(tmp, sizeof tmp, "%.17g", v);
  else snprintf(tmp, sizeof tmp, "%.9g", (double)(float)v);
  if (!strpbrk(tmp, ".eEn")) strcat(tmp, ".0");
  tpu_buf_put(m, b, tmp, strlen(tmp));
}

static void tpu_put_scalar_literal(tpu_hlo *m, tpu_buf *b, tpu_dtype dt, double f, int64_t i) {
  if (dt == TPU_PRED) tpu_buf_printf(m, b, "%s", i ? "true" : "false");
  else if (tpu_dtype_is_float(dt)) tpu_put_float(m, b, dt, f);
  else if (dt == TPU_C64 || dt == TPU_C128) {
    tpu_dtype part = dt == TPU_C64 ? TPU_F32 : TPU_F64;
    tpu_buf_put(m, b, "(", 1);
    tpu_put_float(m, b, part, f);
    tpu_buf_put(m, b, ", ", 2);
    tpu_put_float(m, b, part, 0.0);
    tpu_buf_put(m, b, ")", 1);
  } else if (tpu_dtype_is_unsigned_int(dt)) {
    uint64_t u = (uint64_t)i;
    if (tpu_dtype_size(dt) < 8) u &= ((uint64_t)1 << (8 * tpu_dtype_size(dt))) - 1;
    tpu_buf_printf(m, b, "%llu", (unsigned long long)u);
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
    tpu_buf_printf(m, b, "%lld", (long long)v);
  }
}

static tpu_hv tpu_constant(tpu_hlo *m, tpu_dtype dt, double f, int64_t i) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  tpu_hlo_type t = tpu_hlo_type_make(dt, 0, NULL);
  tpu_attrs a = {0};
  tpu_buf_put(m, &a.b, "value = dense<", strlen("value = dense<"));
  tpu_put_scalar_literal(m, &a.b, dt, f, i);
  tpu_buf_put(m, &a.b, "> : ", strlen("> : "));
  tpu_put_type(m, &a.b, &t);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.constant", NULL, 0, tpu_attrs_str(&a), t);
  tpu_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_constant(tpu_hlo *m, tpu_dtype dt, double v) {
  return tpu_constant(m, dt, v, (int64_t)(isfinite(v) ? v : 0));
}

tpu_hv tpu_hlo_constant_int(tpu_hlo *m, tpu_dtype dt, int64_t v) { return tpu_constant(m, dt, (double)v, v); }

static void tpu_put_nested(tpu_hlo *m, tpu_buf *b, const tpu_hlo_type *t, int d, const int64_t *vals, int64_t *k) {
  if (d == t->rank) {
    tpu_put_scalar_literal(m, b, t->dtype, (double)vals[*k], vals[*k]);
    (*k)++;
    return;
  }
  tpu_buf_put(m, b, "[", 1);
  for (int64_t i = 0; i < t->dims[d]; i++) {
    if (i) tpu_buf_put(m, b, ", ", 2);
    tpu_put_nested(m, b, t, d + 1, vals, k);
  }
  tpu_buf_put(m, b, "]", 1);
}

tpu_hv tpu_hlo_constant_ints(tpu_hlo *m, tpu_hlo_type t, const int64_t *vals) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  tpu_attrs a = {0};
  int64_t k = 0;
  tpu_buf_put(m, &a.b, "value = dense<", strlen("value = dense<"));
  tpu_put_nested(m, &a.b, &t, 0, vals, &k);
  tpu_buf_put(m, &a.b, "> : ", strlen("> : "));
  tpu_put_type(m, &a.b, &t);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.constant", NULL, 0, tpu_attrs_str(&a), t);
  tpu_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_iota(tpu_hlo *m, tpu_hlo_type t, int dim) {
  if (!tpu_hlo_ok(m)) return TPU_HV_NONE;
  if (dim < 0 || dim >= t.rank) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.iota: dimension %d out of range for rank %d", dim, t.rank);
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

tpu_hv tpu_hlo_unary(tpu_hlo *m, tpu_hlo_op op, tpu_hv x) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  if (op >= TPU_HLO_ADD) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: op %d is not unary", (int)op);
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = m->types[x];
  if (op == TPU_HLO_IS_FINITE) t.dtype = TPU_PRED;
  if ((op == TPU_HLO_REAL || op == TPU_HLO_IMAG || op == TPU_HLO_ABS) && tpu_dtype_is_complex(t.dtype))
    t.dtype = t.dtype == TPU_C64 ? TPU_F32 : TPU_F64;
  char name[64];
  tpu_opname(name, sizeof name, op);
  return tpu_hlo_emit1(m, name, &x, 1, NULL, t);
}

static void tpu_fail_types(tpu_hlo *m, const char *op, tpu_hv a, tpu_hv b) {
  char sa[128], sb[128];
  tpu_hlo_type_str(&m->types[a], sa, sizeof sa);
  tpu_hlo_type_str(&m->types[b], sb, sizeof sb);
  tpu_hlo_fail(m, TPU_ERR_RUNTIME, "%s: operand types %s and %s differ", op, sa, sb);
}

tpu_hv tpu_hlo_binary(tpu_hlo *m, tpu_hlo_op op, tpu_hv x, tpu_hv y) {
  tpu_hv ops[2] = {x, y};
  if (!tpu_check(m, ops, 2)) return TPU_HV_NONE;
  char name[64];
  tpu_opname(name, sizeof name, op);
  if (op < TPU_HLO_ADD) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: op %s is not binary", name);
    return TPU_HV_NONE;
  }
  if (!tpu_hlo_type_eq(&m->types[x], &m->types[y])) {
    tpu_fail_types(m, name, x, y);
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = m->types[x];
  if (op == TPU_HLO_COMPLEX) t.dtype = t.dtype == TPU_F64 ? TPU_C128 : TPU_C64;
  return tpu_hlo_emit1(m, name, ops, 2, NULL, t);
}

tpu_hv tpu_hlo_compare(tpu_hlo *m, tpu_hlo_cmp dir, tpu_hv x, tpu_hv y) {
  tpu_hv ops[2] = {x, y};
  if (!tpu_check(m, ops, 2)) return TPU_HV_NONE;
  if (!tpu_hlo_type_eq(&m->types[x], &m->types[y])) {
    tpu_fail_types(m, "stablehlo.compare", x, y);
    return TPU_HV_NONE;
  }
  static const char *dirs[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  tpu_dtype dt = m->types[x].dtype;
  const char *ct = (tpu_dtype_is_float(dt) || tpu_dtype_is_complex(dt)) ? "FLOAT"
                   : tpu_dtype_is_signed_int(dt)                         ? "SIGNED"
                                                                         : "UNSIGNED";
  char attrs[160];
  snprintf(attrs, sizeof attrs,
           "comparison_direction = #stablehlo<comparison_direction %s>, compare_type = #stablehlo<comparison_type %s>",
           dirs[dir], ct);
  tpu_hlo_type t = m->types[x];
  t.dtype = TPU_PRED;
  return tpu_hlo_emit1(m, "stablehlo.compare", ops, 2, attrs, t);
}

tpu_hv tpu_hlo_select(tpu_hlo *m, tpu_hv pred, tpu_hv on_true, tpu_hv on_false) {
  tpu_hv ops[3] = {pred, on_true, on_false};
  if (!tpu_check(m, ops, 3)) return TPU_HV_NONE;
  if (!tpu_hlo_type_eq(&m->types[on_true], &m->types[on_false])) {
    tpu_fail_types(m, "stablehlo.select", on_true, on_false);
    return TPU_HV_NONE;
  }
  const tpu_hlo_type *p = &m->types[pred];
  tpu_hlo_type want = m->types[on_true];
  want.dtype = TPU_PRED;
  if (p->dtype != TPU_PRED || (p->rank != 0 && !tpu_hlo_type_eq(p, &want))) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.select: predicate must be i1 of the operands' shape or 0-d");
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.select", ops, 3, NULL, m->types[on_true]);
}

tpu_hv tpu_hlo_clamp(tpu_hlo *m, tpu_hv lo, tpu_hv x, tpu_hv hi) {
  tpu_hv ops[3] = {lo, x, hi};
  if (!tpu_check(m, ops, 3)) return TPU_HV_NONE;
  for (int i = 0; i < 3; i += 2) {
    const tpu_hlo_type *t = &m->types[ops[i]];
    if (t->dtype != m->types[x].dtype || (t->rank != 0 && !tpu_hlo_type_eq(t, &m->types[x]))) {
      tpu_fail_types(m, "stablehlo.clamp", ops[i], x);
      return TPU_HV_NONE;
    }
  }
  return tpu_hlo_emit1(m, "stablehlo.clamp", ops, 3, NULL, m->types[x]);
}

tpu_hv tpu_hlo_convert(tpu_hlo *m, tpu_hv x, tpu_dtype dt) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  if (m->types[x].dtype == dt) return x;
  tpu_hlo_type t = m->types[x];
  t.dtype = dt;
  return tpu_hlo_emit1(m, "stablehlo.convert", &x, 1, NULL, t);
}

tpu_hv tpu_hlo_bitcast_convert(tpu_hlo *m, tpu_hv x, tpu_dtype dt) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  if (tpu_dtype_size(m->types[x].dtype) != tpu_dtype_size(dt)) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.bitcast_convert: element sizes differ");
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = m->types[x];
  t.dtype = dt;
  return tpu_hlo_emit1(m, "stablehlo.bitcast_convert", &x, 1, NULL, t);
}

/* ---- shapes ----------------------------------------------------------------------------- */

tpu_hv tpu_hlo_reshape(tpu_hlo *m, tpu_hv x, int rank, const int64_t *dims) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  tpu_hlo_type t = tpu_hlo_type_make(m->types[x].dtype, rank, dims);
  if (tpu_hlo_type_eq(&t, &m->types[x])) return x;
  if (tpu_hlo_type_numel(&t) != tpu_hlo_type_numel(&m->types[x])) {
    char a[128], b[128];
    tpu_hlo_type_str(&m->types[x], a, sizeof a);
    tpu_hlo_type_str(&t, b, sizeof b);
    tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.reshape: cannot reshape %s to %s", a, b);
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.reshape", &x, 1, NULL, t);
}

tpu_hv tpu_hlo_broadcast_in_dim(tpu_hlo *m, tpu_hv x, int rank, const int64_t *dims, const int64_t *bdims) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &m->types[x];
  if (xt->rank > rank || (xt->rank && !bdims)) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.broadcast_in_dim: bad rank");
    return TPU_HV_NONE;
  }
  for (int i = 0; i < xt->rank; i++)
    if (bdims[i] < 0 || bdims[i] >= rank || (xt->dims[i] != 1 && xt->dims[i] != dims[bdims[i]])) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.broadcast_in_dim: dimension %d does not fit", i);
      return TPU_HV_NONE;
    }
  tpu_hlo_type t = tpu_hlo_type_make(xt->dtype, rank, dims);
  if (tpu_hlo_type_eq(&t, xt)) {
    bool ident = true;
    for (int i = 0; i < rank; i++) ident = ident && bdims[i] == i;
    if (ident) return x;
  }
  tpu_attrs a = {0};
  tpu_put_array(m, &a.b, "broadcast_dimensions", bdims, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.broadcast_in_dim", &x, 1, tpu_attrs_str(&a), t);
  tpu_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_transpose(tpu_hlo *m, tpu_hv x, const int64_t *perm) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &m->types[x];
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
  tpu_put_array(m, &a.b, "permutation", perm, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.transpose", &x, 1, tpu_attrs_str(&a), t);
  tpu_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_slice(tpu_hlo *m, tpu_hv x, const int64_t *start, const int64_t *limit, const int64_t *strides) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &m->types[x];
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
  tpu_put_array(m, &a.b, "start_indices", start, xt->rank);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_array(m, &a.b, "limit_indices", limit, xt->rank);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_array(m, &a.b, "strides", ones, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.slice", &x, 1, tpu_attrs_str(&a), t);
  tpu_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_dynamic_slice(tpu_hlo *m, tpu_hv x, const tpu_hv *starts, const int64_t *sizes) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &m->types[x];
  tpu_hv ops[1 + TPU_MAX_RANK];
  ops[0] = x;
  for (int i = 0; i < xt->rank; i++) ops[1 + i] = starts[i];
  if (!tpu_check(m, ops, 1 + xt->rank)) return TPU_HV_NONE;
  tpu_hlo_type t = tpu_hlo_type_make(xt->dtype, xt->rank, sizes);
  tpu_attrs a = {0};
  tpu_put_array(m, &a.b, "slice_sizes", sizes, xt->rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.dynamic_slice", ops, 1 + xt->rank, tpu_attrs_str(&a), t);
  tpu_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_dynamic_update_slice(tpu_hlo *m, tpu_hv x, tpu_hv update, const tpu_hv *starts) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  const tpu_hlo_type *xt = &m->types[x];
  tpu_hv ops[2 + TPU_MAX_RANK];
  ops[0] = x;
  ops[1] = update;
  for (int i = 0; i < xt->rank; i++) ops[2 + i] = starts[i];
  if (!tpu_check(m, ops, 2 + xt->rank)) return TPU_HV_NONE;
  if (m->types[update].dtype != xt->dtype || m->types[update].rank != xt->rank) {
    tpu_fail_types(m, "stablehlo.dynamic_update_slice", x, update);
    return TPU_HV_NONE;
  }
  return tpu_hlo_emit1(m, "stablehlo.dynamic_update_slice", ops, 2 + xt->rank, NULL, *xt);
}

tpu_hv tpu_hlo_concat(tpu_hlo *m, const tpu_hv *xs, int n, int dim) {
  if (n < 1 || !tpu_check(m, xs, n)) {
    if (n < 1) tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.concatenate: no operands");
    return TPU_HV_NONE;
  }
  tpu_hlo_type t = m->types[xs[0]];
  if (dim < 0 || dim >= t.rank) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.concatenate: bad dimension %d", dim);
    return TPU_HV_NONE;
  }
  t.dims[dim] = 0;
  for (int i = 0; i < n; i++) {
    const tpu_hlo_type *u = &m->types[xs[i]];
    bool ok = u->dtype == t.dtype && u->rank == t.rank;
    for (int d = 0; ok && d < t.rank; d++) ok = d == dim || u->dims[d] == t.dims[d];
    if (!ok) {
      tpu_fail_types(m, "stablehlo.concatenate", xs[0], xs[i]);
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
  if (!tpu_check(m, ops, 2)) return TPU_HV_NONE;
  tpu_hlo_type t = m->types[x];
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
  tpu_put_array(m, &a.b, "edge_padding_low", lo, t.rank);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_array(m, &a.b, "edge_padding_high", hi, t.rank);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_array(m, &a.b, "interior_padding", in, t.rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.pad", ops, 2, tpu_attrs_str(&a), t);
  tpu_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_reverse(tpu_hlo *m, tpu_hv x, const int64_t *dims, int ndims) {
  if (!tpu_check(m, &x, 1)) return TPU_HV_NONE;
  if (ndims == 0) return x;
  tpu_attrs a = {0};
  tpu_put_array(m, &a.b, "dimensions", dims, ndims);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.reverse", &x, 1, tpu_attrs_str(&a), m->types[x]);
  tpu_attrs_free(&a);
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

bool tpu_hlo_reduce_region(tpu_hlo *m, const tpu_hv *xs, const tpu_hv *inits, int n, const int64_t *dims, int ndims,
                           int region, tpu_hv *outs) {
  if (n < 1 || n > 8) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.reduce: bad operand count");
    return false;
  }
  tpu_hv ops[16];
  for (int i = 0; i < n; i++) {
    ops[i] = xs[i];
    ops[n + i] = inits[i];
  }
  if (!tpu_check(m, ops, 2 * n)) return false;
  const tpu_hlo_type *xt = &m->types[xs[0]];
  bool red[TPU_MAX_RANK] = {0};
  for (int i = 0; i < ndims; i++) {
    if (dims[i] < 0 || dims[i] >= xt->rank || red[dims[i]]) {
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "stablehlo.reduce: bad dimension %lld", (long long)dims[i]);
      return false;
    }
    red[dims[i]] = true;
  }
  tpu_hlo_type rt[8];
  for (int k = 0; k < n; k++) {
    rt[k] = tpu_hlo_type_make(m->types[xs[k]].dtype, 0, NULL);
    for (int i = 0; i < xt->rank; i++)
      if (!red[i]) rt[k].dims[rt[k].rank++] = xt->dims[i];
  }
  tpu_attrs a = {0};
  tpu_put_array(m, &a.b, "dimensions", dims, ndims);
  bool ok = tpu_hlo_emit(m, "stablehlo.reduce", ops, 2 * n, &region, 1, tpu_attrs_str(&a), rt, n, outs);
  tpu_attrs_free(&a);
  return ok;
}

tpu_hv tpu_hlo_reduce(tpu_hlo *m, tpu_hv x, tpu_hv init, const int64_t *dims, int ndims, tpu_hlo_op op) {
  tpu_hv ops[2] = {x, init};
  if (!tpu_check(m, ops, 2)) return TPU_HV_NONE;
  int region = tpu_scalar_body(m, m->types[x].dtype, op);
  tpu_hv out = TPU_HV_NONE;
  tpu_hlo_reduce_region(m, &x, &init, 1, dims, ndims, region, &out);
  return out;
}

static void tpu_put_padding(tpu_hlo *m, tpu_buf *b, const int64_t *pad, int rank) {
  tpu_buf_put(m, b, "padding = dense<[", 17);
  for (int i = 0; i < rank; i++)
    tpu_buf_printf(m, b, "%s[%lld, %lld]", i ? ", " : "", (long long)(pad ? pad[2 * i] : 0),
                   (long long)(pad ? pad[2 * i + 1] : 0));
  tpu_buf_printf(m, b, "]> : tensor<%dx2xi64>", rank);
}

bool tpu_hlo_reduce_window(tpu_hlo *m, const tpu_hv *xs, const tpu_hv *inits, int n, const int64_t *window,
                           const int64_t *strides, const int64_t *base_dil, const int64_t *win_dil, const int64_t *pad,
                           int region, tpu_hv *outs) {
  if (n < 1 || n > 8) return false;
  tpu_hv ops[16];
  for (int i = 0; i < n; i++) {
    ops[i] = xs[i];
    ops[n + i] = inits[i];
  }
  if (!tpu_check(m, ops, 2 * n)) return false;
  const tpu_hlo_type *xt = &m->types[xs[0]];
  int r = xt->rank;
  int64_t ones[TPU_MAX_RANK];
  for (int i = 0; i < r; i++) ones[i] = 1;
  const int64_t *st = strides ? strides : ones, *bd = base_dil ? base_dil : ones, *wd = win_dil ? win_dil : ones;
  tpu_hlo_type rt[8];
  for (int k = 0; k < n; k++) {
    rt[k] = m->types[xs[k]];
    for (int i = 0; i < r; i++) {
      int64_t dil = (xt->dims[i] - 1) * bd[i] + 1;
      int64_t padded = dil + (pad ? pad[2 * i] + pad[2 * i + 1] : 0);
      int64_t wspan = (window[i] - 1) * wd[i] + 1;
      rt[k].dims[i] = padded < wspan ? 0 : (padded - wspan) / st[i] + 1;
    }
  }
  tpu_attrs a = {0};
  tpu_put_array(m, &a.b, "window_dimensions", window, r);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_array(m, &a.b, "window_strides", st, r);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_array(m, &a.b, "base_dilations", bd, r);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_array(m, &a.b, "window_dilations", wd, r);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_padding(m, &a.b, pad, r);
  bool ok = tpu_hlo_emit(m, "stablehlo.reduce_window", ops, 2 * n, &region, 1, tpu_attrs_str(&a), rt, n, outs);
  tpu_attrs_free(&a);
  return ok;
}

/* ---- matmul, gather, scatter, sort, rng, convolution ------------------------------------- */

static void tpu_put_list(tpu_hlo *m, tpu_buf *b, const char *name, const int64_t *v, int n, bool *first) {
  if (n == 0) return;
  tpu_buf_printf(m, b, "%s%s = [", *first ? "" : ", ", name);
  tpu_put_i64s(m, b, v, n);
  tpu_buf_put(m, b, "]", 1);
  *first = false;
}

tpu_hv tpu_hlo_dot_general(tpu_hlo *m, tpu_hv lhs, tpu_hv rhs, int nbatch, const int64_t *lhs_batch,
                           const int64_t *rhs_batch, int ncontract, const int64_t *lhs_contract,
                           const int64_t *rhs_contract, tpu_hlo_precision p, tpu_dtype out_dt) {
  tpu_hv ops[2] = {lhs, rhs};
  if (!tpu_check(m, ops, 2)) return TPU_HV_NONE;
  const tpu_hlo_type *lt = &m->types[lhs], *rt = &m->types[rhs];
  bool lused[TPU_MAX_RANK] = {0}, rused[TPU_MAX_RANK] = {0};
  tpu_hlo_type t = tpu_hlo_type_make(out_dt == TPU_INVALID ? lt->dtype : out_dt, 0, NULL);
  for (int i = 0; i < nbatch; i++) {
    if (lt->dims[lhs_batch[i]] != rt->dims[rhs_batch[i]]) goto bad;
    lused[lhs_batch[i]] = rused[rhs_batch[i]] = true;
    t.dims[t.rank++] = lt->dims[lhs_batch[i]];
  }
  for (int i = 0; i < ncontract; i++) {
    if (lt->dims[lhs_contract[i]] != rt->dims[rhs_contract[i]]) goto bad;
    lused[lhs_contract[i]] = rused[rhs_contract[i]] = true;
  }
  for (int i = 0; i < lt->rank; i++)
    if (!lused[i]) t.dims[t.rank++] = lt->dims[i];
  for (int i = 0; i < rt->rank; i++)
    if (!rused[i]) t.dims[t.rank++] = rt->dims[i];
  if (t.rank > TPU_MAX_RANK) goto bad;
  {
    static const char *prec[] = {"DEFAULT", "HIGH", "HIGHEST"};
    tpu_attrs a = {0};
    bool first = true;
    tpu_buf_put(m, &a.b, "dot_dimension_numbers = #stablehlo.dot<", strlen("dot_dimension_numbers = #stablehlo.dot<"));
    tpu_put_list(m, &a.b, "lhs_batching_dimensions", lhs_batch, nbatch, &first);
    tpu_put_list(m, &a.b, "rhs_batching_dimensions", rhs_batch, nbatch, &first);
    tpu_put_list(m, &a.b, "lhs_contracting_dimensions", lhs_contract, ncontract, &first);
    tpu_put_list(m, &a.b, "rhs_contracting_dimensions", rhs_contract, ncontract, &first);
    tpu_buf_printf(m, &a.b, ">, precision_config = [#stablehlo<precision %s>, #stablehlo<precision %s>]", prec[p],
                   prec[p]);
    tpu_hv r = tpu_hlo_emit1(m, "stablehlo.dot_general", ops, 2, tpu_attrs_str(&a), t);
    tpu_attrs_free(&a);
    return r;
  }
bad:
  tpu_fail_types(m, "stablehlo.dot_general", lhs, rhs);
  return TPU_HV_NONE;
}

tpu_hv tpu_hlo_gather(tpu_hlo *m, tpu_hv operand, tpu_hv indices, const tpu_hlo_gather_dims *d,
                      const int64_t *slice_sizes, tpu_hlo_type result) {
  tpu_hv ops[2] = {operand, indices};
  if (!tpu_check(m, ops, 2)) return TPU_HV_NONE;
  tpu_attrs a = {0};
  bool first = true;
  tpu_buf_put(m, &a.b, "dimension_numbers = #stablehlo.gather<", strlen("dimension_numbers = #stablehlo.gather<"));
  tpu_put_list(m, &a.b, "offset_dims", d->offset_dims, d->n_offset, &first);
  tpu_put_list(m, &a.b, "collapsed_slice_dims", d->collapsed_slice_dims, d->n_collapsed, &first);
  tpu_put_list(m, &a.b, "operand_batching_dims", d->operand_batching_dims, d->n_operand_batching, &first);
  tpu_put_list(m, &a.b, "start_indices_batching_dims", d->start_indices_batching_dims, d->n_operand_batching, &first);
  tpu_put_list(m, &a.b, "start_index_map", d->start_index_map, d->n_start_index_map, &first);
  tpu_buf_printf(m, &a.b, "%sindex_vector_dim = %lld>, indices_are_sorted = false, ", first ? "" : ", ",
                 (long long)d->index_vector_dim);
  tpu_put_array(m, &a.b, "slice_sizes", slice_sizes, m->types[operand].rank);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.gather", ops, 2, tpu_attrs_str(&a), result);
  tpu_attrs_free(&a);
  return r;
}

tpu_hv tpu_hlo_scatter(tpu_hlo *m, tpu_hv operand, tpu_hv indices, tpu_hv updates, const tpu_hlo_scatter_dims *d,
                       int region) {
  tpu_hv ops[3] = {operand, indices, updates};
  if (!tpu_check(m, ops, 3)) return TPU_HV_NONE;
  if (region < 0) {
    tpu_hlo_type st = tpu_hlo_type_make(m->types[operand].dtype, 0, NULL);
    tpu_hlo_type sts[2] = {st, st};
    tpu_hv args[2];
    tpu_hlo_region_begin(m, sts, 2, args);
    region = tpu_hlo_region_end(m, &args[1], 1);
    if (region < 0) return TPU_HV_NONE;
  }
  tpu_attrs a = {0};
  bool first = true;
  tpu_buf_put(m, &a.b, "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<", strlen("indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<"));
  tpu_put_list(m, &a.b, "update_window_dims", d->update_window_dims, d->n_update_window, &first);
  tpu_put_list(m, &a.b, "inserted_window_dims", d->inserted_window_dims, d->n_inserted, &first);
  tpu_put_list(m, &a.b, "input_batching_dims", d->input_batching_dims, d->n_input_batching, &first);
  tpu_put_list(m, &a.b, "scatter_indices_batching_dims", d->scatter_indices_batching_dims, d->n_input_batching, &first);
  tpu_put_list(m, &a.b, "scatter_dims_to_operand_dims", d->scatter_dims_to_operand_dims, d->n_scatter_to_operand,
               &first);
  tpu_buf_printf(m, &a.b, "%sindex_vector_dim = %lld>, unique_indices = false", first ? "" : ", ",
                 (long long)d->index_vector_dim);
  tpu_hv out = TPU_HV_NONE;
  tpu_hlo_type rt = m->types[operand];
  tpu_hlo_emit(m, "stablehlo.scatter", ops, 3, &region, 1, tpu_attrs_str(&a), &rt, 1, &out);
  tpu_attrs_free(&a);
  return out;
}

bool tpu_hlo_sort(tpu_hlo *m, const tpu_hv *xs, int n, int dim, bool stable, int region, tpu_hv *outs) {
  if (n < 1 || n > 8 || !tpu_check(m, xs, n)) return false;
  tpu_hlo_type rt[8];
  for (int i = 0; i < n; i++) rt[i] = m->types[xs[i]];
  char attrs[64];
  snprintf(attrs, sizeof attrs, "dimension = %d : i64, is_stable = %s", dim, stable ? "true" : "false");
  return tpu_hlo_emit(m, "stablehlo.sort", xs, n, &region, 1, attrs, rt, n, outs);
}

tpu_hv tpu_hlo_rng_bit_generator(tpu_hlo *m, tpu_hv state, tpu_hlo_type bits, tpu_hv *new_state) {
  *new_state = TPU_HV_NONE;
  if (!tpu_check(m, &state, 1)) return TPU_HV_NONE;
  tpu_hlo_type rt[2] = {m->types[state], bits};
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
  if (!tpu_check(m, ops, 2)) return TPU_HV_NONE;
  const tpu_hlo_type *it = &m->types[input], *kt = &m->types[kernel];
  if (nsp < 0 || it->rank != nsp + 2 || kt->rank != nsp + 2) {
    tpu_fail_types(m, "stablehlo.convolution", input, kernel);
    return TPU_HV_NONE;
  }
  int64_t ones[TPU_MAX_RANK];
  for (int i = 0; i < nsp; i++) ones[i] = 1;
  const int64_t *st = strides ? strides : ones, *ld = lhs_dil ? lhs_dil : ones, *rd = rhs_dil ? rhs_dil : ones;
  tpu_hlo_type t = *it;
  t.dims[0] = it->dims[0] / (batch_groups > 0 ? batch_groups : 1);
  t.dims[1] = kt->dims[0];
  for (int i = 0; i < nsp; i++) {
    int64_t in = (it->dims[2 + i] - 1) * ld[i] + 1 + (pad ? pad[2 * i] + pad[2 * i + 1] : 0);
    int64_t k = (kt->dims[2 + i] - 1) * rd[i] + 1;
    t.dims[2 + i] = in < k ? 0 : (in - k) / st[i] + 1;
  }
  static const char *prec[] = {"DEFAULT", "HIGH", "HIGHEST"};
  tpu_attrs a = {0};
  tpu_buf_printf(m, &a.b, "batch_group_count = %lld : i64, dimension_numbers = #stablehlo.conv<[b, f",
                 (long long)batch_groups);
  for (int i = 0; i < nsp; i++) tpu_buf_printf(m, &a.b, ", %d", i);
  tpu_buf_put(m, &a.b, "]x[o, i", strlen("]x[o, i"));
  for (int i = 0; i < nsp; i++) tpu_buf_printf(m, &a.b, ", %d", i);
  tpu_buf_put(m, &a.b, "]->[b, f", strlen("]->[b, f"));
  for (int i = 0; i < nsp; i++) tpu_buf_printf(m, &a.b, ", %d", i);
  tpu_buf_printf(m, &a.b, "]>, feature_group_count = %lld : i64, ", (long long)feature_groups);
  tpu_put_array(m, &a.b, "lhs_dilation", ld, nsp);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_padding(m, &a.b, pad, nsp);
  tpu_buf_printf(m, &a.b, ", precision_config = [#stablehlo<precision %s>, #stablehlo<precision %s>], ", prec[p],
                 prec[p]);
  tpu_put_array(m, &a.b, "rhs_dilation", rd, nsp);
  tpu_buf_put(m, &a.b, ", ", strlen(", "));
  tpu_put_array(m, &a.b, "window_strides", st, nsp);
  tpu_hv r = tpu_hlo_emit1(m, "stablehlo.convolution", ops, 2, tpu_attrs_str(&a), t);
  tpu_attrs_free(&a);
  return r;
}
