/* call.h: one call of an op as the bindings parse it and the engine and the
 * lowering read it: its arguments (tensor views of records, Python numbers,
 * lists), what it returns, and the op table's rows. It sits below the
 * engine and the lowering, so that the bindings need neither.
 */
#ifndef TPU_CALL_H
#define TPU_CALL_H

#include <stddef.h>
#include <string.h>

#include "hlo/hlo.h"

#define TPU_MAX_ARGS 24
#define TPU_MAX_LIST 64
#define TPU_MAX_OUTS 128 /* results and in-place writes of one call (fused optimizers write many) */
#define TPU_MAX_INS 512

/* ---- parsed arguments ------------------------------------------------------ */

typedef enum {
  TPU_ARG_NONE = 0, /* None (for optional arguments) */
  TPU_ARG_TENSOR,
  TPU_ARG_TENSORS, /* Tensor[] and Tensor?[] (items may be NONE tensors) */
  TPU_ARG_SCALAR,  /* a Python number: a program input */
  TPU_ARG_INT,
  TPU_ARG_INTS,
  TPU_ARG_FLOAT,
  TPU_ARG_FLOATS,
  TPU_ARG_BOOL,
  TPU_ARG_DTYPE,
  TPU_ARG_STR,
  TPU_ARG_IGNORED /* device, layout, pin_memory, memory_format, generator */
} tpu_argkind;

/* A tpu torch.Generator's own state (one made by torch.Generator(device=
 * "tpu"), not the default one, which is the engine's): the key of its draws
 * and the offset of the next (the layout of generator_api.h's state). */
typedef struct {
  uint64_t seed, offset;
} tpu_rng;

typedef enum { TPU_SCALAR_BOOL, TPU_SCALAR_INT, TPU_SCALAR_FLOAT, TPU_SCALAR_COMPLEX } tpu_scalar_kind;

struct tpu_record; /* engine.h */

/* A tensor argument: a view (sizes, strides, offset in elements) of a
 * record's flat buffer, or a CPU 0-d tensor (host != 0) whose value is read
 * and passed as a 0-d program input. */
typedef struct {
  struct tpu_record *rec; /* borrowed for the call; NULL for host scalars */
  tpu_dtype dtype;
  int rank;
  int64_t offset;
  int64_t rec_numel;      /* elements of the record's flat buffer, in this tensor's dtype */
  tpu_dtype rec_dtype;    /* the record's dtype when this view reinterprets its bytes
                             (view_as_real, view(dtype)); TPU_INVALID when the same */
  bool host;              /* CPU 0-d tensor */
  bool zero_size;         /* no elements: no record is needed or looked up */
  uint8_t host_bytes[16]; /* its value, raw */
  int view;               /* TPU_VIEW_*: how the view is read (engine fills) */
  tpu_hv base;            /* the record's flat buffer parameter, or NONE */
  tpu_hv offv;            /* the dynamic offset parameter, or NONE */
  tpu_hv value;           /* materialised value, TPU_HV_NONE until requested */
  /* Last, and read up to rank only: 1 KiB at TPU_MAX_RANK 64, so a call
   * clears and copies the fields before them and their first rank entries
   * (tpu_tref_clear, tpu_tref_copy), not the whole struct. */
  int64_t sizes[TPU_MAX_RANK];
  int64_t strides[TPU_MAX_RANK];
} tpu_tref;

/* Zeroes every field but sizes and strides (rank becomes 0). */
static inline void tpu_tref_clear(tpu_tref *t) { memset(t, 0, offsetof(tpu_tref, sizes)); }
/* *d = *s up to s's rank. */
static inline void tpu_tref_copy(tpu_tref *d, const tpu_tref *s) {
  memcpy(d, s, offsetof(tpu_tref, sizes));
  size_t r = s->rank > 0 && s->rank <= TPU_MAX_RANK ? (size_t)s->rank : 0;
  memcpy(d->sizes, s->sizes, sizeof(int64_t) * r);
  memcpy(d->strides, s->strides, sizeof(int64_t) * r);
}

enum { TPU_VIEW_WHOLE, TPU_VIEW_RANGE, TPU_VIEW_PERMUTED, TPU_VIEW_GATHER, TPU_VIEW_STRIDED };

typedef struct {
  tpu_argkind kind;
  bool is_default; /* the value is the schema default */
  tpu_tref t;      /* TENSOR */
  tpu_tref *list;  /* TENSORS: items (owned by the engine's call) */
  int nlist;
  tpu_scalar_kind skind; /* SCALAR */
  double f;              /* SCALAR (float/bool/complex real), FLOAT */
  double f_imag;         /* SCALAR complex */
  int64_t i;             /* SCALAR (int), INT, BOOL (0/1) */
  tpu_dtype dtype;       /* DTYPE */
  char str[32];          /* STR */
  tpu_hv value;          /* SCALAR: its 0-d input value, NONE until requested */
  tpu_hv value32;        /* SCALAR: the same as an f32 input (TPU_IN_SCALAR32), NONE until requested */
  tpu_rng *gen;          /* IGNORED: a generator argument's state; NULL: the default generator */
  int nints;             /* INTS / FLOATS */
  /* The list comes last: only INTS and FLOATS arguments use it, and a
   * recorded op copies an argument up to what its kind uses (tpu_arg_size). */
  union {
    int64_t ints[TPU_MAX_LIST];  /* INTS */
    double floats[TPU_MAX_LIST]; /* FLOATS */
  };
} tpu_arg;

/* Bytes of a that its kind uses (a prefix of the struct). */
static inline size_t tpu_arg_size(const tpu_arg *a) {
  bool list = a->kind == TPU_ARG_INTS || a->kind == TPU_ARG_FLOATS;
  return offsetof(tpu_arg, ints) + (list ? sizeof(int64_t) * (size_t)a->nints : 0);
}
/* Zeroes every field before the list, its tensor's sizes and strides aside. */
static inline void tpu_arg_clear(tpu_arg *a) {
  memset(a, 0, offsetof(tpu_arg, t) + offsetof(tpu_tref, sizes));
  memset((char *)a + offsetof(tpu_arg, list), 0, offsetof(tpu_arg, ints) - offsetof(tpu_arg, list));
}
/* *d = *s, what its kind uses (tpu_arg_size), the tensor up to its rank. */
static inline void tpu_arg_copy(tpu_arg *d, const tpu_arg *s) {
  tpu_tref_copy(&d->t, &s->t);
  memcpy(d, s, offsetof(tpu_arg, t));
  memcpy((char *)d + offsetof(tpu_arg, list), (const char *)s + offsetof(tpu_arg, list),
         tpu_arg_size(s) - offsetof(tpu_arg, list));
}

/* What the call returns to Python: new output k, or tensor argument a. */
typedef struct {
  bool is_arg;
  int index;   /* output index or argument index */
  int item;    /* list item for TENSORS arguments, or -1 */
  bool resize; /* new output `index` becomes out= argument `arg`'s
                           contents (its shape was wrong: torch resizes out=) */
  int arg;
} tpu_ret_plan;

/* ---- the op table (rows in lower/ops*.def, emitters in lower/emit_*.c) ---- */

struct tpu_lower; /* lower.h */
typedef void (*tpu_emit_fn)(struct tpu_lower *L);

/* Row flags. INPLACE: the functional emitter's first result is written into
 * argument 0, which is returned. OUT: results are written into the out=
 * tensors (the trailing TENSOR arguments), which are returned. */
enum {
  TPU_OP_INPLACE = 1,
  TPU_OP_OUT = 2,
  TPU_OP_SCALAR_ATTRS = 4,
  TPU_OP_OUT_EXACT = 8,
  TPU_OP_FILLS = 16,    /* writes one value to every alias: an expanded self is allowed (fill_, index_put_) */
  TPU_OP_NO_ALIAS = 32, /* out= may not even be exactly an input (gather, index_select, take) */
  TPU_OP_FILL_VALUE =
      64, /* its Python scalars are written into self: they must fit self's dtype (fill_, masked_fill) */
  TPU_OP_CHECK_ARGS = 128 /* tpu_check_args checks its Python scalars' values on every call (uniform_'s range) */
};
/* SCALAR_ATTRS: the op's Python scalars shape the program (arange's bounds),
 * so their values are part of the cache key. A result written into self or
 * an out= tensor must be castable to its dtype (torch.can_cast; else torch's
 * "result type ... can't be cast" error); OUT_EXACT: out= tensors must have
 * the result's dtype exactly, as torch's matmuls, gather, sort, ... demand. */

typedef enum {
#define TPU_OP(id, name, emit, flags) TPU_OP_##id,
#include "lower/ops.def"
#undef TPU_OP
  TPU_NUM_OPS
} tpu_op_id;

typedef struct {
  const char *name; /* ATen overload, "add.Tensor" */
  tpu_emit_fn emit;
  int flags;
} tpu_op_row;

extern const tpu_op_row tpu_op_table[TPU_NUM_OPS];

/* ---- view geometry -------------------------------------------------------- */

/* How a view is read from its record's flat buffer (TPU_VIEW_*). */
int tpu_tref_view_kind(const tpu_tref *t);
int64_t tpu_numel(int rank, const int64_t *sizes);
bool tpu_tref_contiguous(const tpu_tref *t);
/* The view is a permutation plus broadcast of a contiguous block: its dims
 * (size > 1, stride > 0) outer to inner in order, their count in *n. */
bool tpu_tref_permuted_order(const tpu_tref *t, int *order, int *n);
/* The view is a block of its record seen as a dense array (see call.c). */
bool tpu_tref_strided_order(const tpu_tref *t, int *order, int *n);
/* Non-overlapping and dense: some order of the dims (those of size 1 aside)
 * has contiguous strides (torch's is_non_overlapping_and_dense). */
bool tpu_dense(int rank, const int64_t *sizes, const int64_t *strides);
/* The strides of a contiguous tensor of these sizes (a size 0 steps as 1),
 * the channels innermost when rank is channels_last (4: torch's
 * channels_last, 5: channels_last_3d; 0: neither). */
void tpu_contiguous_strides(int rank, const int64_t *sizes, int channels_last, int64_t *strides);
/* A dense layout's dims of size > 1 from the largest stride to the smallest
 * into dims (the shape of its storage as an array): their count, 0 when the
 * layout is not dense. */
int tpu_storage_dims(int rank, const int64_t *sizes, const int64_t *strides, int64_t *dims);
/* The dims from the largest stride to the smallest (ties in dim order) into
 * order: rank, or 0 when that is the plain order. */
int tpu_stride_order_desc(int rank, const int64_t *strides, int *order);
/* Bytes from a view's first element to the end of its last (a view with
 * elements, strides not negative). */
int64_t tpu_span_bytes(int rank, const int64_t *sizes, const int64_t *strides, int64_t itemsize);
/* torch's memory-overlap rules (at::has_internal_overlap and
 * at::get_overlap_status). Whether some element of t is another's too (a
 * stride 0 over a size above 1; views that overlap otherwise are too hard to
 * tell, as in torch, and allowed). */
bool tpu_tref_internal_overlap(const tpu_tref *t);
enum { TPU_OVERLAP_NO, TPU_OVERLAP_FULL, TPU_OVERLAP_PARTIAL };
/* How a and b share memory: NO (other records, no elements, not both dense,
 * or disjoint), FULL (the same elements in the same order) or PARTIAL. */
int tpu_tref_overlap(const tpu_tref *a, const tpu_tref *b);
/* torch's broadcast refusal of a value of shape vdims written into dims (in
 * place, or out=): NULL when it fits. */
tpu_status *tpu_broadcast_check(int rank, const int64_t *dims, int vrank, const int64_t *vdims);

/* ---- per-call argument checks (the engine's, on every call) --------------- */

/* NULL when the Python scalar a converts to dt without overflow (c10's
 * checked_convert, as fill_ and masked_fill do), else torch's RuntimeError. */
tpu_status *tpu_scalar_check(const tpu_arg *a, tpu_dtype dt);
/* torch's checks of argument values that are not part of a program (rows
 * flagged TPU_OP_CHECK_ARGS): NULL when they pass. */
tpu_status *tpu_check_args(const char *op, const tpu_arg *args, int nargs);
/* The range of finite values of dt that c10's checked conversion accepts
 * (unsigned types: also negatives of a magnitude that fits, by the caller);
 * shared with the lowering's check of a value inside a program
 * (tpu_lower_check_fits). */
void tpu_dtype_bounds(tpu_dtype dt, double *lo_out, double *hi_out);

#endif
