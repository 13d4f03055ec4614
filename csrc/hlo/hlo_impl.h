/* hlo_impl.h: the StableHLO builder's private state and the helpers its
 * files share (included only by the builder's own files; the rest of
 * torchtpu sees hlo.h).
 *
 * The builder is split by concern:
 *   hlo.c             the module: text buffers and types, values and their
 *                     scopes, parameters, finish (the text of @main), the
 *                     generic primitive tpu_hlo_emit, regions
 *   hlo_const.c       constants (scalar and dense literals) and iota
 *   hlo_elementwise.c unary and binary ops, compare, select, clamp, converts
 *   hlo_shape.c       reshape, broadcast, transpose, slices, concatenate,
 *                     pad, reverse
 *   hlo_reduce.c      reduce and reduce_window
 *   hlo_compute.c     dot_general, gather, scatter, sort, rng_bit_generator,
 *                     convolution
 *   hlo_extern.c      functions from StableHLO text: parsing, renaming,
 *                     calls, retargeting
 *   hlo_spmd.c        SPMD: the mesh, the partition and replica counts,
 *                     parameter and result shardings, sharding constraints
 *                     (the shardings themselves are sharding.c's)
 * The op files add to the module's text only through tpu_hlo_emit, read values
 * only through TY and tpu_hloi_val_at, and of the module's fields touch only
 * exact_div (hlo_elementwise.c) and the SPMD fields (hlo_spmd.c).
 *
 * Helpers shared between the files are named tpu_hloi_* ("hlo internal");
 * those one file uses stay static there. The text helpers only note running
 * out of memory (m->oom, reported at finish); the checks record the module's
 * sticky error.
 */
#ifndef TPU_HLO_IMPL_H
#define TPU_HLO_IMPL_H

#include <stdlib.h>

#include "hlo.h"

/* A growable text buffer; NUL-terminated once anything was put in it. */
typedef struct {
  char *p;
  size_t n, cap;
} tpu_buf;

#define TPU_HLO_MAX_DEPTH 8
#define TPU_HLO_CHUNK 256 /* value records per chunk */

typedef struct {
  tpu_hlo_type t;
  int scope;  /* 0: @main's body; otherwise the id of the region defining it */
  bool splat; /* XLA may see it as a broadcast or a constant (see exact_div) */
} tpu_val;

/* A closed region: its text and signature, until an op consumes it. */
typedef struct {
  char *text; /* owned; NULL once consumed */
  int scope;  /* scope that was current when it was opened */
  int nargs, nres;
  tpu_hlo_type *sig; /* owned: nargs argument types, then nres result types */
} tpu_region;

/* An open region. */
typedef struct {
  tpu_buf text;
  int scope;
  int nargs;
  tpu_hlo_type *args; /* owned */
} tpu_frame;

/* A parameter's or a result's sharding (hlo_spmd.c). */
typedef struct {
  bool result; /* index is a result index; otherwise a parameter's position */
  int index;
  tpu_sharding s;
} tpu_shard_note;

struct tpu_hlo {
  tpu_status *err;  /* sticky, owned */
  tpu_val **chunks; /* owned, each TPU_HLO_CHUNK records; never moved */
  int nchunks, capchunks;
  int nvals;
  tpu_hv *params;
  int nparams, capparams;
  int *alias; /* per param: result index or -1 */
  tpu_buf body;
  tpu_frame stack[TPU_HLO_MAX_DEPTH]; /* open regions */
  int depth;
  int nscopes;         /* region scope ids handed out */
  tpu_region *regions; /* closed regions, by id */
  int nregions, capregions;
  bool oom;
  bool exact_div; /* division and rsqrt as torch's CPU kernels, where XLA's CPU compiler differs */
  /* SPMD (hlo_spmd.c); all zero for a single-device program */
  int partitioner;    /* 0 (no mesh) or a tpu_hlo_partitioner */
  int num_partitions; /* 0: 1 */
  int num_replicas;   /* 0: 1 */
  tpu_sharding mesh;  /* mesh_rank and mesh; rank 0 */
  bool named;         /* axis_names given (else a0, a1, ...) */
  char axis_names[TPU_MESH_MAX_AXES][TPU_MESH_NAME_MAX + 1];
  tpu_shard_note *shards; /* owned */
  int nshards, capshards;
  /* functions from StableHLO text called (hlo_extern.c); borrowed */
  const tpu_hlo_fn **externs;
  int nexterns, capexterns;
};

/* The record of value v (v must be valid). */
static inline tpu_val *tpu_hloi_val_at(const tpu_hlo *m, tpu_hv v) {
  return &m->chunks[v / TPU_HLO_CHUNK][v % TPU_HLO_CHUNK];
}
/* The type of value v of the module `m` in scope (v must be valid). */
#define TY(v) (tpu_hloi_val_at(m, (v))->t)

/* Attribute text built in a scratch buffer owned by the caller's frame. */
typedef struct {
  tpu_buf b;
} tpu_attrs;

static inline const char *tpu_hloi_attrs_str(tpu_attrs *a) { return a->b.p ? a->b.p : ""; }
static inline void tpu_hloi_attrs_free(tpu_attrs *a) { free(a->b.p); }

/* ---- text (hlo.c) ---------------------------------------------------------------- */

/* Append n bytes of s / formatted text to b; out of memory sets m->oom. */
void tpu_hloi_buf_put(tpu_hlo *m, tpu_buf *b, const char *s, size_t n);
void tpu_hloi_buf_printf(tpu_hlo *m, tpu_buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "tensor<2x3xf32>" */
void tpu_hloi_put_type(tpu_hlo *m, tpu_buf *b, const tpu_hlo_type *t);
/* "1, 2" */
void tpu_hloi_put_i64s(tpu_hlo *m, tpu_buf *b, const int64_t *v, int n);
/* "name = array<i64: 1, 2>" */
void tpu_hloi_put_array(tpu_hlo *m, tpu_buf *b, const char *name, const int64_t *v, int n);
/* "padding = dense<[[lo, hi], ...]> : tensor<rankx2xi64>"; pad NULL: zeros. */
void tpu_hloi_put_padding(tpu_hlo *m, tpu_buf *b, const int64_t *pad, int rank);

/* ---- SPMD (hlo_spmd.c) ---------------------------------------------------------- */

/* The module line, and the sdy.mesh op after it for Shardy. */
void tpu_hloi_spmd_put_head(tpu_hlo *m, tpu_buf *b);
/* " {mhlo.sharding = ..., tf.aliasing_output = N : i32}" for parameter or
 * result `index` (alias < 0: none); nothing when neither is set. */
void tpu_hloi_spmd_put_attrs(tpu_hlo *m, tpu_buf *b, bool result, int index, int alias);
/* Result shardings fit the results, the mesh fits num_partitions; false and
 * the sticky error otherwise. */
bool tpu_hloi_spmd_check(tpu_hlo *m, const tpu_hv *results, int n);

/* ---- functions from StableHLO text (hlo_extern.c) ------------------------------ */

/* The called functions' aliases (before the module line) and definitions
 * (after @main). */
void tpu_hloi_extern_put_prelude(tpu_hlo *m, tpu_buf *b);
void tpu_hloi_extern_put(tpu_hlo *m, tpu_buf *b);

/* ---- checks (hlo.c) -------------------------------------------------------------- */

/* A type the text can express: a known dtype, rank 0..TPU_MAX_RANK, dims >= 0. */
bool tpu_hloi_type_valid(const tpu_hlo_type *t);
/* Operands exist and are defined in a scope that is still open (false and
 * an error, or the earlier error, otherwise). */
bool tpu_hloi_check(tpu_hlo *m, const tpu_hv *vs, int n);
/* Record "<what>: invalid type ..." / "<op>: operand types ... differ". */
void tpu_hloi_fail_type(tpu_hlo *m, const char *what, const tpu_hlo_type *t);
void tpu_hloi_fail_types(tpu_hlo *m, const char *op, tpu_hv a, tpu_hv b);
/* Region `region` is unused and takes args[0..nargs) and returns
 * res[0..nres), before `op` consumes it. */
bool tpu_hloi_region_sig(tpu_hlo *m, const char *op, int region, const tpu_hlo_type *args, int nargs,
                         const tpu_hlo_type *res, int nres);

#endif
