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

#include "../call.h"


/* ---- the context an emitter sees ------------------------------------------ */

typedef struct tpu_lower tpu_lower;

/* Program inputs, in parameter order: what the engine passes at run time. */
/* A Python number is a 64-bit input (TPU_IN_SCALAR: its own kind's widest
 * type, converted where used), or on a TPU (tpu_like) an f32 input
 * where a use wants f32 (TPU_IN_SCALAR32): the host rounds it as the
 * program's convert would, and the program holds no 64-bit value, which a
 * TPU emulates in pairs of 32-bit words that no fusion crosses. */
typedef enum {
  TPU_IN_RECORD,
  TPU_IN_SCALAR,
  TPU_IN_HOST_TENSOR,
  TPU_IN_OFFSET,
  TPU_IN_RNG,
  TPU_IN_SCALAR32,
  TPU_IN_OFFSET32 /* a view's offset as s32 (tpu_like, and the record's elements fit) */
} tpu_in_kind;
typedef struct {
  tpu_in_kind kind;
  int arg;  /* argument index */
  int item; /* list item, or -1 */
} tpu_in_plan;

/* Program outputs: a new tensor, or the new flat buffer of an argument's
 * record (an in-place write), or the next RNG state. */
typedef enum { TPU_OUT_NEW, TPU_OUT_WRITE, TPU_OUT_RNG, TPU_OUT_CHECK } tpu_out_kind;
typedef struct {
  tpu_out_kind kind;
  int arg, item;     /* WRITE: which tensor argument; CHECK: arg is the error's tpu_code */
  tpu_hlo_type type; /* NEW: the tensor's type (contiguous) */
  const char *msg;   /* CHECK: the error's message (static storage) */
} tpu_out_plan;


struct tpu_lower {
  tpu_hlo *hlo;
  tpu_arg *args; /* borrowed: the call's parsed arguments */
  int nargs;
  const char *opname; /* "aten::add.Tensor", for messages */
  int flags;          /* TPU_OP_* of the table row */
  tpu_in_plan in[TPU_MAX_INS];
  int nin;
  tpu_out_plan out[TPU_MAX_OUTS];
  tpu_hv outv[TPU_MAX_OUTS];
  int nout;
  tpu_ret_plan ret[TPU_MAX_OUTS];
  int nret;
  bool ret_tuple; /* return a tuple even for one value */
  bool uses_rng;
  tpu_hv rng_state;            /* tensor<2xui64> */
  int64_t rng_words;           /* random words drawn: the generator's advance */
  tpu_hlo_precision precision; /* of f32 matmuls and convolutions */
  /* A TPU, or compiling for one: Python numbers used as f32 enter as f32
   * (TPU_IN_SCALAR32), and emitters that widen to f64 only to round torch's
   * CPU kernels' last bit keep f32 (a TPU emulates f64) */
  bool tpu_like;
  bool value_checks;   /* make the checks that need tensor values (tpu_lower_check) */
  bool static_offsets; /* views' offsets are constants, not inputs (a program over a mesh:
                                  the partitioner slices a split tensor only at known places) */
  bool plans_only;     /* lowered for its plans, not run (a fused op, or an op over a mesh) */
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
  const tpu_hv *shared, *shared32;
  /* A value check of this call (tpu_lower_check): a 0-d pred, true when an
   * input is invalid, with the error to raise; TPU_HV_NONE: none. */
  tpu_hv check;
  tpu_code check_code;
  const char *check_msg;
  /* Functions from StableHLO text by id (tpu::stablehlo_call): the engine's
   * table (ctx: the engine); NULL when there is none. */
  const tpu_hlo_fn *(*fn_lookup)(void *ctx, int64_t id);
  void *fn_ctx;
  /* The type of a record's buffer (its dtype and shape), which the program's
   * parameter for it takes; NULL: flat. Unused with fuse_record. */
  tpu_hlo_type (*record_type)(const struct tpu_record *rec);
};


/* Run the row's emitter and apply INPLACE/OUT rules; the context's plans are
 * complete afterwards. Errors stay in L->hlo. */
void tpu_lower_run(tpu_lower *L, const tpu_op_row *row);

/* ---- helpers for emitters ------------------------------------------------------ */

void tpu_lower_fail(tpu_lower *L, tpu_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Where torch versions differ, the running torch's way (set once at setup
 * from probes of CPU torch; _registry._torch_compat):
 * - BOOL_SUB: a subtraction with a bool operand raises NotImplementedError
 *   (torch 2.14 and later; RuntimeError before);
 * - ARG_BOOL: argmax/argmin of bool raise NotImplementedError (2.15 on);
 * - ARANGE_COUNT: an int64 arange of float bounds counts its values from
 *   the float bounds, as every other integer dtype (2.14 on; before, from
 *   the truncated bounds). */
enum { TPU_COMPAT_BOOL_SUB = 1, TPU_COMPAT_ARG_BOOL = 2, TPU_COMPAT_ARANGE_COUNT = 4 };
void tpu_lower_set_compat(unsigned flags);
bool tpu_lower_compat(unsigned flag);
/* NotImplementedError where the running torch's check raises it (a
 * TPU_COMPAT_* flag), else RuntimeError. */
tpu_code tpu_lower_check_code(unsigned flag);
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
/* A check that the 0-d value v (any dtype) converts to dt as c10's checked
 * conversion allows ("value cannot be converted to type ... without
 * overflow"): an imaginary part into a real dtype, NaN or a value out of
 * range into an integer, a finite value out of range into a float. */
void tpu_lower_check_fits(tpu_lower *L, tpu_hv v, tpu_dtype dt);

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


/* Flat-buffer helpers used by the engine for copies. */
tpu_hv tpu_lower_view_read(tpu_lower *L, tpu_tref *t, tpu_hv base, tpu_hv offset);
tpu_hv tpu_lower_view_write(tpu_lower *L, tpu_tref *t, tpu_hv base, tpu_hv offset, tpu_hv v);

/* The C++ type name of a dtype as torch's messages print it (caffe2's
 * TypeMeta: "long int", "unsigned char", "c10::Half", ...). */
const char *tpu_typemeta_name(tpu_dtype t);

#endif
