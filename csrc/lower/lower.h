/* lower.h: lowering ATen overloads to StableHLO.
 *
 * One table (ops.def) maps each ATen overload to an emitter. The engine parses
 * the call's arguments into tpu_arg values, opens a tpu_lower context and
 * calls the emitter; the emitter asks for its inputs (tensor views are
 * materialised, scalars become 0-d program inputs), builds the computation,
 * and declares its outputs. The same emitters serve one eager op, a recorded
 * graph and an FX graph: they only see values, never buffers.
 *
 * Errors: emitters validate with tpu_lower_fail (sticky, via the builder);
 * messages read like PyTorch's own.
 */
#ifndef TPU_LOWER_H
#define TPU_LOWER_H

#include <stddef.h>

#include "../hlo/hlo.h"

#define TPU_MAX_ARGS 24
#define TPU_MAX_LIST 64
#define TPU_MAX_OUTS 128 /* results and in-place writes of one call (fused optimizers write many) */
#define TPU_MAX_INS 512

/* ---- parsed arguments ------------------------------------------------------ */

typedef enum {
  TPU_ARG_NONE = 0,  /* None (for optional arguments) */
  TPU_ARG_TENSOR,
  TPU_ARG_TENSORS,   /* Tensor[] and Tensor?[] (items may be NONE tensors) */
  TPU_ARG_SCALAR,    /* a Python number: a program input */
  TPU_ARG_INT,
  TPU_ARG_INTS,
  TPU_ARG_FLOAT,
  TPU_ARG_FLOATS,
  TPU_ARG_BOOL,
  TPU_ARG_DTYPE,
  TPU_ARG_STR,
  TPU_ARG_IGNORED    /* device, layout, pin_memory, memory_format, generator */
} tpu_argkind;

typedef enum { TPU_SCALAR_BOOL, TPU_SCALAR_INT, TPU_SCALAR_FLOAT, TPU_SCALAR_COMPLEX } tpu_scalar_kind;

struct tpu_record; /* engine.h */

/* A tensor argument: a view (sizes, strides, offset in elements) of a
 * record's flat buffer, or a CPU 0-d tensor (host != 0) whose value is read
 * and passed as a 0-d program input. */
typedef struct {
  struct tpu_record *rec; /* borrowed for the call; NULL for host scalars */
  tpu_dtype dtype;
  int rank;
  int64_t sizes[TPU_MAX_RANK];
  int64_t strides[TPU_MAX_RANK];
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
} tpu_tref;

enum { TPU_VIEW_WHOLE, TPU_VIEW_RANGE, TPU_VIEW_PERMUTED, TPU_VIEW_GATHER, TPU_VIEW_STRIDED };

typedef struct {
  tpu_argkind kind;
  bool is_default;          /* the value is the schema default */
  tpu_tref t;               /* TENSOR */
  tpu_tref *list;           /* TENSORS: items (owned by the engine's call) */
  int nlist;
  tpu_scalar_kind skind;    /* SCALAR */
  double f;                 /* SCALAR (float/bool/complex real), FLOAT */
  double f_imag;            /* SCALAR complex */
  int64_t i;                /* SCALAR (int), INT, BOOL (0/1) */
  tpu_dtype dtype;          /* DTYPE */
  char str[32];             /* STR */
  tpu_hv value;             /* SCALAR: its 0-d input value, NONE until requested */
  int nints;                /* INTS / FLOATS */
  /* The list comes last: only INTS and FLOATS arguments use it, and a
   * recorded op copies an argument up to what its kind uses (tpu_arg_size). */
  union {
    int64_t ints[TPU_MAX_LIST];   /* INTS */
    double floats[TPU_MAX_LIST];  /* FLOATS */
  };
} tpu_arg;

/* Bytes of a that its kind uses (a prefix of the struct). */
static inline size_t tpu_arg_size(const tpu_arg *a) {
  bool list = a->kind == TPU_ARG_INTS || a->kind == TPU_ARG_FLOATS;
  return offsetof(tpu_arg, ints) + (list ? sizeof(int64_t) * (size_t)a->nints : 0);
}

/* ---- the context an emitter sees ------------------------------------------ */

typedef struct tpu_lower tpu_lower;

/* Program inputs, in parameter order: what the engine passes at run time. */
typedef enum { TPU_IN_RECORD, TPU_IN_SCALAR, TPU_IN_HOST_TENSOR, TPU_IN_OFFSET, TPU_IN_RNG } tpu_in_kind;
typedef struct {
  tpu_in_kind kind;
  int arg;   /* argument index */
  int item;  /* list item, or -1 */
} tpu_in_plan;

/* Program outputs: a new tensor, or the new flat buffer of an argument's
 * record (an in-place write), or the next RNG state. */
typedef enum { TPU_OUT_NEW, TPU_OUT_WRITE, TPU_OUT_RNG, TPU_OUT_CHECK } tpu_out_kind;
typedef struct {
  tpu_out_kind kind;
  int arg, item;        /* WRITE: which tensor argument; CHECK: arg is the error's tpu_code */
  tpu_hlo_type type;    /* NEW: the tensor's type (contiguous) */
  const char *msg;      /* CHECK: the error's message (static storage) */
} tpu_out_plan;

/* What the call returns to Python: new output k, or tensor argument a. */
typedef struct {
  bool is_arg;
  int index;            /* output index or argument index */
  int item;             /* list item for TENSORS arguments, or -1 */
  bool resize;          /* new output `index` becomes out= argument `arg`'s
                           contents (its shape was wrong: torch resizes out=) */
  int arg;
} tpu_ret_plan;

struct tpu_lower {
  tpu_hlo *hlo;
  tpu_arg *args;     /* borrowed: the call's parsed arguments */
  int nargs;
  const char *opname; /* "aten::add.Tensor", for messages */
  int flags;         /* TPU_OP_* of the table row */
  tpu_in_plan in[TPU_MAX_INS];
  int nin;
  tpu_out_plan out[TPU_MAX_OUTS];
  tpu_hv outv[TPU_MAX_OUTS];
  int nout;
  tpu_ret_plan ret[TPU_MAX_OUTS];
  int nret;
  bool ret_tuple;    /* return a tuple even for one value */
  bool uses_rng;
  tpu_hv rng_state;  /* tensor<2xui64> */
  int64_t rng_words; /* random words drawn: the generator's advance */
  tpu_hlo_precision precision; /* of f32 matmuls and convolutions */
  bool value_checks;           /* make the checks that need tensor values (tpu_lower_check) */
  /* Fused lowering (engine.c): many calls share one builder. fuse_record
   * gives a record's current flat value (rec->numel elements of rec->dtype),
   * a program input or an earlier call's result, instead of a new input;
   * fuse_input hears of every other program input, in creation order. NULL
   * when one call is lowered alone. */
  void *fuse;
  tpu_hv (*fuse_record)(tpu_lower *L, struct tpu_record *rec);
  void (*fuse_input)(tpu_lower *L, tpu_in_kind kind, int arg, int item);
  /* Fused lowering: per argument, an earlier call's program input that this
   * call's Python number reads too (TPU_HV_NONE: its own); NULL: none. */
  const tpu_hv *shared;
  /* A value check of this call (tpu_lower_check): a 0-d pred, true when an
   * input is invalid, with the error to raise; TPU_HV_NONE: none. */
  tpu_hv check;
  tpu_code check_code;
  const char *check_msg;
};

typedef void (*tpu_emit_fn)(tpu_lower *L);

/* Row flags. INPLACE: the functional emitter's first result is written into
 * argument 0, which is returned. OUT: results are written into the out=
 * tensors (the trailing TENSOR arguments), which are returned. */
enum {
  TPU_OP_INPLACE = 1,
  TPU_OP_OUT = 2,
  TPU_OP_SCALAR_ATTRS = 4,
  TPU_OP_OUT_EXACT = 8,
  TPU_OP_FILLS = 16,   /* writes one value to every alias: an expanded self is allowed (fill_, index_put_) */
  TPU_OP_NO_ALIAS = 32, /* out= may not even be exactly an input (gather, index_select, take) */
  TPU_OP_FILL_VALUE = 64, /* its Python scalars are written into self: they must fit self's dtype (fill_, masked_fill) */
  TPU_OP_CHECK_ARGS = 128 /* tpu_check_args checks its Python scalars' values on every call (uniform_'s range) */
};
/* SCALAR_ATTRS: the op's Python scalars shape the program (arange's bounds),
 * so their values are part of the cache key. A result written into self or
 * an out= tensor must be castable to its dtype (torch.can_cast; else torch's
 * "result type ... can't be cast" error); OUT_EXACT: out= tensors must have
 * the result's dtype exactly, as torch's matmuls, gather, sort, ... demand. */

typedef enum {
#define TPU_OP(id, name, emit, flags) TPU_OP_##id,
#include "ops.def"
#undef TPU_OP
  TPU_NUM_OPS
} tpu_op_id;

typedef struct {
  const char *name;  /* ATen overload, "add.Tensor" */
  tpu_emit_fn emit;
  int flags;
} tpu_op_row;

extern const tpu_op_row tpu_op_table[TPU_NUM_OPS];

/* Run the row's emitter and apply INPLACE/OUT rules; the context's plans are
 * complete afterwards. Errors stay in L->hlo. */
void tpu_lower_run(tpu_lower *L, const tpu_op_row *row);

/* ---- helpers for emitters ------------------------------------------------------ */

void tpu_lower_fail(tpu_lower *L, tpu_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool tpu_lower_is_none(const tpu_lower *L, int i);
/* Value of tensor argument i (item j for lists, else -1), as stored. */
tpu_hv tpu_lower_tensor(tpu_lower *L, int i, int j);
/* Tensor or scalar argument i as a value of dtype dt. */
tpu_hv tpu_lower_input(tpu_lower *L, int i, tpu_dtype dt);
/* Scalar argument i as a 0-d value of dtype dt. */
tpu_hv tpu_lower_scalar(tpu_lower *L, int i, tpu_dtype dt);
/* Result dtype of torch's type promotion over arguments idx[0..n). */
tpu_dtype tpu_lower_result_type(tpu_lower *L, const int *idx, int n);
/* Default float dtype (float32) unless dt is already floating or complex. */
tpu_dtype tpu_lower_float_type(tpu_dtype dt);
/* Wrap a possibly negative dim for a tensor of `rank` dims. */
int64_t tpu_lower_dim(tpu_lower *L, int64_t d, int rank);

/* Broadcast v to dims (numpy rules, right-aligned). */
tpu_hv tpu_lower_broadcast_to(tpu_lower *L, tpu_hv v, int rank, const int64_t *dims);
/* NULL when a value of shape vdims broadcasts to exactly dims (a copy_ or an
 * in-place result), else torch's RuntimeError: "The size of tensor a ..."
 * or "output with shape [..] doesn't match the broadcast shape [..]". */
/* NULL when the Python scalar a converts to dt without overflow (c10's
 * checked_convert, as fill_ and masked_fill do), else torch's RuntimeError. */
tpu_status *tpu_scalar_check(const tpu_arg *a, tpu_dtype dt);
/* torch's checks of argument values that are not part of a program (rows
 * flagged TPU_OP_CHECK_ARGS): NULL when they pass. */
tpu_status *tpu_check_args(const char *op, const tpu_arg *args, int nargs);
tpu_status *tpu_broadcast_check(int rank, const int64_t *dims, int vrank, const int64_t *vdims);
/* Broadcast values to their common shape (in place in vs). */
void tpu_lower_broadcast_all(tpu_lower *L, tpu_hv *vs, int n);
/* Binary op after broadcasting both operands to their common shape (their
 * dtypes must already agree). MAX and MIN of floats propagate a NaN of
 * either operand, as torch's maximum, minimum and clamp do. */
tpu_hv tpu_lower_binary(tpu_lower *L, tpu_hlo_op op, tpu_hv a, tpu_hv b);
/* 0-d constant broadcast to v's shape and dtype. */
tpu_hv tpu_lower_full_like(tpu_lower *L, tpu_hv like, double value);
tpu_hv tpu_lower_full(tpu_lower *L, tpu_hlo_type t, double value);

/* A check that needs tensor values (an index in range, a class target in
 * range, a nonzero integer divisor), as CUDA's device-side asserts: bad (a
 * pred of any shape) is true where an input is invalid. The program computes
 * whether any is; then the call's writes leave their tensors as they were,
 * and the error (code, msg: a string literal) is raised at the next sync
 * point (at once in debug mode). Register it before the call's writes.
 * TORCHTPU_VALUE_CHECKS=0 makes no checks. */
void tpu_lower_check(tpu_lower *L, tpu_hv bad, tpu_code code, const char *msg);
/* A check that integer idx lies in [-n, n) (negative: indices may count
 * from the end) or [0, n). */
void tpu_lower_check_range(tpu_lower *L, tpu_hv idx, int64_t n, bool negative, tpu_code code, const char *msg);
/* A check of class targets tg (s64) against C classes: each in [0, C) or
 * the ignored index (the losses' "Target ... is out of bounds"). */
void tpu_lower_check_targets(tpu_lower *L, tpu_hv tg, int64_t C, int64_t ignore_index);
/* A check that an integer divisor b has no zero ("ZeroDivisionError", as
 * CPU torch); nothing for floats. */
void tpu_lower_check_divisor(tpu_lower *L, tpu_hv b);

/* Declare a new output tensor; returns its index. */
int tpu_lower_out(tpu_lower *L, tpu_hv v);
/* Write v (converted and broadcast) into tensor argument i's view. */
void tpu_lower_write(tpu_lower *L, int i, int item, tpu_hv v);
/* Return tensor argument i (after writes) instead of a new output. */
void tpu_lower_return_arg(tpu_lower *L, int i, int item);
/* n random 32-bit words (u32 tensor of shape t) from the device generator. */
tpu_hv tpu_lower_random_bits(tpu_lower *L, int rank, const int64_t *dims);
/* Uniform [0, 1) floats of dtype dt and the given shape. */
tpu_hv tpu_lower_uniform(tpu_lower *L, tpu_dtype dt, int rank, const int64_t *dims);

/* Rows of operand (along dim 0) picked by idx (s64 [n, 1]): [n, rest...]. */
tpu_hv tpu_lower_gather_rows(tpu_lower *L, tpu_hv operand, tpu_hv idx);
/* operand with its rows idx (s64 [n, 1]) combined with updates [n, rest...]
 * by region ((old, new) -> value), or replaced when region is -1. */
tpu_hv tpu_lower_scatter_rows(tpu_lower *L, tpu_hv operand, tpu_hv idx, tpu_hv updates, int region);

/* torch's memory-overlap rules (at::has_internal_overlap and
 * at::get_overlap_status). Whether some element of t is another's too (a
 * stride 0 over a size above 1; views that overlap otherwise are too hard to
 * tell, as in torch, and allowed). */
bool tpu_tref_internal_overlap(const tpu_tref *t);
enum { TPU_OVERLAP_NO, TPU_OVERLAP_FULL, TPU_OVERLAP_PARTIAL };
/* How a and b share memory: NO (other records, no elements, not both dense,
 * or disjoint), FULL (the same elements in the same order) or PARTIAL. */
int tpu_tref_overlap(const tpu_tref *a, const tpu_tref *b);

/* Flat-buffer helpers used by the engine for copies. */
tpu_hv tpu_lower_view_read(tpu_lower *L, tpu_tref *t, tpu_hv base, tpu_hv offset);
tpu_hv tpu_lower_view_write(tpu_lower *L, tpu_tref *t, tpu_hv base, tpu_hv offset, tpu_hv v);
/* Classify how a view is read (TPU_VIEW_*). */
int tpu_lower_view_kind(const tpu_tref *t);

#endif
