/* hlo.h: the StableHLO builder.
 *
 * A tpu_hlo is one module under construction with a single public function
 * @main. Values are small integer handles (tpu_hv); every op infers its result
 * type, checks its operands, and appends one line of MLIR generic-form text.
 * Value names are assigned in order, so the same sequence of calls always
 * produces byte-identical text: the text is the canonical form, and its hash
 * is the program's structural hash.
 *
 * Errors are sticky: the first bad operand (or an explicit tpu_hlo_fail)
 * records a status, later calls return TPU_HV_NONE and do nothing, and
 * tpu_hlo_finish reports that first error. Emitters therefore check nothing
 * until the end.
 *
 * Regions (reduce bodies, comparators, scatter updates, loop bodies) are built
 * between tpu_hlo_region_begin and tpu_hlo_region_end; ops issued in between go
 * into the region. Regions nest. The returned region id is consumed by exactly
 * one op that takes regions.
 */
#ifndef TPU_HLO_H
#define TPU_HLO_H

#include "../core.h"
#include "sharding.h"

typedef struct tpu_hlo tpu_hlo;
typedef int32_t tpu_hv; /* value handle; TPU_HV_NONE after an error */
#define TPU_HV_NONE (-1)

typedef struct {
  tpu_dtype dtype;
  int rank;
  int64_t dims[TPU_MAX_RANK];
} tpu_hlo_type;

/* Build a type; dims may be NULL when rank is 0. */
tpu_hlo_type tpu_hlo_type_make(tpu_dtype dt, int rank, const int64_t *dims);
int64_t tpu_hlo_type_numel(const tpu_hlo_type *t);
/* *d = *s, its dims up to its rank (a type is 520 bytes at TPU_MAX_RANK 64). */
static inline void tpu_hlo_type_copy(tpu_hlo_type *d, const tpu_hlo_type *s) {
  d->dtype = s->dtype;
  d->rank = s->rank;
  for (int i = 0; i < s->rank; i++) d->dims[i] = s->dims[i];
}
bool tpu_hlo_type_eq(const tpu_hlo_type *a, const tpu_hlo_type *b);
/* Bytes that hold any type's text: "tensor<", a dim of up to 20 characters
 * and an "x" for each dim, the longest element type, ">". */
#define TPU_HLO_TYPE_STR_MAX (TPU_MAX_RANK * 21 + 32)
/* "tensor<2x3xf32>"; writes at most n bytes (NUL included); returns length. */
int tpu_hlo_type_str(const tpu_hlo_type *t, char *buf, size_t n);

/* ---- module ----------------------------------------------------------------- */

tpu_hlo *tpu_hlo_new(void); /* NULL only when out of memory */
void tpu_hlo_free(tpu_hlo *m);

bool tpu_hlo_ok(const tpu_hlo *m);
/* Keep float divisions correctly rounded and rsqrt as 1 / sqrt where XLA's
 * CPU compiler would not: it multiplies by the reciprocal of a broadcast or
 * constant divisor, and approximates rsqrt. */
void tpu_hlo_set_exact_division(tpu_hlo *m, bool on);
/* Record a sticky error (ignored if one is already recorded). */
void tpu_hlo_fail(tpu_hlo *m, tpu_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Next argument of @main. */
tpu_hv tpu_hlo_param(tpu_hlo *m, tpu_hlo_type t);
/* Mark parameter p as donated into result r (tf.aliasing_output); the types
 * must match. Checked at finish. */
void tpu_hlo_param_alias(tpu_hlo *m, tpu_hv p, int result_index);
/* Type of a value; borrowed, valid while m lives. Returns a static invalid
 * type (dtype TPU_INVALID) for TPU_HV_NONE. */
const tpu_hlo_type *tpu_hlo_typeof(const tpu_hlo *m, tpu_hv v);

/* Close @main returning results[0..n). On success *text (owned by the
 * caller, free()) and *len are set. On a sticky error returns it (owned). */
tpu_status *tpu_hlo_finish(tpu_hlo *m, const tpu_hv *results, int n, char **text, size_t *len);

/* 64-bit structural hash of finished text (FNV-1a over the bytes). */
uint64_t tpu_hlo_hash(const char *text, size_t len);

/* ---- SPMD ---------------------------------------------------------------------
 * A single-controller SPMD program: one @main whose parameters, results and
 * chosen intermediate values carry shardings over the module's device mesh;
 * XLA's partitioner (GSPMD or Shardy, chosen per module) splits it into the
 * program each device runs. Nothing here changes the text of a module that
 * sets none of it. Bad shardings (see tpu_sharding_check; the mesh must be
 * the module's, the rank the value's) are sticky TPU_ERR_VALUE errors. */

typedef enum {
  TPU_HLO_GSPMD = 1, /* mhlo.sharding = "{devices=...}" attributes, custom_call @Sharding */
  TPU_HLO_SHARDY     /* an sdy.mesh op, sdy.sharding = #sdy.sharding<...>, sdy.sharding_constraint */
} tpu_hlo_partitioner;

/* Declare the device mesh, once, before any sharding; axis_names (Shardy's,
 * copied) may be NULL for a0, a1, .... Sets mhlo.num_partitions to the
 * mesh's device count. */
/* Whether a mesh was declared (the module is an SPMD program). */
bool tpu_hlo_has_mesh(const tpu_hlo *m);
void tpu_hlo_set_mesh(tpu_hlo *m, tpu_hlo_partitioner p, int mesh_rank, const int64_t *mesh,
                      const char *const *axis_names);
/* The module's mhlo.num_partitions and mhlo.num_replicas (1 and 1 unless
 * set; with a mesh, the partitions must be its devices, checked at finish). */
void tpu_hlo_set_num_partitions(tpu_hlo *m, int n);
void tpu_hlo_set_num_replicas(tpu_hlo *m, int n);
/* The sharding of parameter p / of result result_index (checked against the
 * result at finish); a later call replaces an earlier one. Printed as the
 * argument's or result's attribute, next to tf.aliasing_output. */
void tpu_hlo_param_sharding(tpu_hlo *m, tpu_hv p, const tpu_sharding *s);
void tpu_hlo_result_sharding(tpu_hlo *m, int result_index, const tpu_sharding *s);
/* The layouts XLA's partitioner chose for a program's n outputs, read from
 * its optimized module (a serialized HloModuleProto, or with with_config an
 * HloModuleProtoWithConfig around one: tpu_rt_exec_optimized) over the mesh (mesh_rank, mesh): out[k] for each k with want[k], a tensor of
 * rank ranks[k]. An owned status where the module names none or an output's
 * layout is not one a tpu_sharding can say (sharding_read.c); out[k] of the
 * wanted outputs is then undefined. */
tpu_status *tpu_hlo_read_output_shardings(const uint8_t *module, size_t len, bool with_config, int mesh_rank,
                                          const int64_t *mesh, int n, const int *ranks, const bool *want,
                                          tpu_sharding *out);
/* x constrained to sharding s (same type as x): GSPMD's custom_call
 * @Sharding or Shardy's sdy.sharding_constraint. */
tpu_hv tpu_hlo_sharding_constraint(tpu_hlo *m, tpu_hv x, const tpu_sharding *s);

/* ---- the generic primitive ---------------------------------------------------
 * Emit `"name"(operands) ({regions}) {attrs} : (operand types) -> results`.
 * attrs: the text between the braces, without them, or NULL. regions: ids from
 * tpu_hlo_region_end, consumed. Writes nres handles to outs. Every typed
 * helper below is built on this. Returns false after an error. */
bool tpu_hlo_emit(tpu_hlo *m, const char *name, const tpu_hv *operands, int nops, const int *regions, int nregions,
                  const char *attrs, const tpu_hlo_type *result_types, int nres, tpu_hv *outs);
/* One-result convenience form. */
tpu_hv tpu_hlo_emit1(tpu_hlo *m, const char *name, const tpu_hv *operands, int nops, const char *attrs,
                     tpu_hlo_type result);

/* ---- regions ------------------------------------------------------------------ */

/* Open a block with n scalar-or-tensor arguments; their handles go to args. */
void tpu_hlo_region_begin(tpu_hlo *m, const tpu_hlo_type *arg_types, int n, tpu_hv *args);
/* Close it with `stablehlo.return results`; returns its id (or -1). */
int tpu_hlo_region_end(tpu_hlo *m, const tpu_hv *results, int n);

/* ---- typed ops ------------------------------------------------------------------ */

typedef enum {
  /* unary */
  TPU_HLO_ABS,
  TPU_HLO_NEG,
  TPU_HLO_EXP,
  TPU_HLO_EXPM1,
  TPU_HLO_LOG,
  TPU_HLO_LOG1P,
  TPU_HLO_SQRT,
  TPU_HLO_RSQRT,
  TPU_HLO_CBRT,
  TPU_HLO_TANH,
  TPU_HLO_LOGISTIC,
  TPU_HLO_SIN,
  TPU_HLO_COS,
  TPU_HLO_TAN,
  TPU_HLO_FLOOR,
  TPU_HLO_CEIL,
  TPU_HLO_ROUND_EVEN,
  TPU_HLO_ROUND_AWAY,
  TPU_HLO_SIGN,
  TPU_HLO_NOT,
  TPU_HLO_IS_FINITE,
  TPU_HLO_POPCNT,
  TPU_HLO_CLZ,
  TPU_HLO_REAL,
  TPU_HLO_IMAG,
  /* binary */
  TPU_HLO_ADD,
  TPU_HLO_SUB,
  TPU_HLO_MUL,
  TPU_HLO_DIV,
  TPU_HLO_REM,
  TPU_HLO_POW,
  TPU_HLO_MAX,
  TPU_HLO_MIN,
  TPU_HLO_AND,
  TPU_HLO_OR,
  TPU_HLO_XOR,
  TPU_HLO_ATAN2,
  TPU_HLO_SHL,
  TPU_HLO_SHR_A,
  TPU_HLO_SHR_L,
  TPU_HLO_COMPLEX,
  TPU_HLO_NUM_OPS
} tpu_hlo_op;

typedef enum { TPU_HLO_EQ, TPU_HLO_NE, TPU_HLO_LT, TPU_HLO_LE, TPU_HLO_GT, TPU_HLO_GE } tpu_hlo_cmp;

typedef enum { TPU_HLO_PREC_DEFAULT, TPU_HLO_PREC_HIGH, TPU_HLO_PREC_HIGHEST } tpu_hlo_precision;

/* 0-d constants. Float values are printed exactly (hex bit patterns for
 * non-finite values); integer dtypes take the int64 form. */
tpu_hv tpu_hlo_constant(tpu_hlo *m, tpu_dtype dt, double v);
tpu_hv tpu_hlo_constant_int(tpu_hlo *m, tpu_dtype dt, int64_t v);
/* A dense constant of type t (integer dtypes only), numel(t) values. */
tpu_hv tpu_hlo_constant_ints(tpu_hlo *m, tpu_hlo_type t, const int64_t *vals);
tpu_hv tpu_hlo_iota(tpu_hlo *m, tpu_hlo_type t, int dim);

tpu_hv tpu_hlo_unary(tpu_hlo *m, tpu_hlo_op op, tpu_hv x);
/* Operands must have identical types (except SHL etc.: identical too). */
tpu_hv tpu_hlo_binary(tpu_hlo *m, tpu_hlo_op op, tpu_hv x, tpu_hv y);
/* Comparison type (FLOAT, SIGNED, UNSIGNED) follows the operand dtype. */
tpu_hv tpu_hlo_compare(tpu_hlo *m, tpu_hlo_cmp dir, tpu_hv x, tpu_hv y);
tpu_hv tpu_hlo_select(tpu_hlo *m, tpu_hv pred, tpu_hv on_true, tpu_hv on_false);
/* lo and hi are 0-d or of x's type. */
tpu_hv tpu_hlo_clamp(tpu_hlo *m, tpu_hv lo, tpu_hv x, tpu_hv hi);
/* Returns x itself when it already has dtype dt. */
tpu_hv tpu_hlo_convert(tpu_hlo *m, tpu_hv x, tpu_dtype dt);
tpu_hv tpu_hlo_bitcast_convert(tpu_hlo *m, tpu_hv x, tpu_dtype dt);

/* Shape ops. reshape returns x when the shape is unchanged. */
tpu_hv tpu_hlo_reshape(tpu_hlo *m, tpu_hv x, int rank, const int64_t *dims);
/* Result shape dims[0..rank); x's dimension i maps to result dim bdims[i]. */
tpu_hv tpu_hlo_broadcast_in_dim(tpu_hlo *m, tpu_hv x, int rank, const int64_t *dims, const int64_t *bdims);
tpu_hv tpu_hlo_transpose(tpu_hlo *m, tpu_hv x, const int64_t *perm);
tpu_hv tpu_hlo_slice(tpu_hlo *m, tpu_hv x, const int64_t *start, const int64_t *limit, const int64_t *strides);
/* starts: rank 0-d integer values. */
tpu_hv tpu_hlo_dynamic_slice(tpu_hlo *m, tpu_hv x, const tpu_hv *starts, const int64_t *sizes);
tpu_hv tpu_hlo_dynamic_update_slice(tpu_hlo *m, tpu_hv x, tpu_hv update, const tpu_hv *starts);
tpu_hv tpu_hlo_concat(tpu_hlo *m, const tpu_hv *xs, int n, int dim);
/* padval: 0-d of x's dtype; lo/hi may be negative; interior >= 0. */
tpu_hv tpu_hlo_pad(tpu_hlo *m, tpu_hv x, tpu_hv padval, const int64_t *lo, const int64_t *hi, const int64_t *interior);
tpu_hv tpu_hlo_reverse(tpu_hlo *m, tpu_hv x, const int64_t *dims, int ndims);

/* Reduce x over dims with the scalar body `op` (ADD, MUL, MAX, MIN, AND, OR)
 * and init (0-d, x's dtype). Result drops the reduced dims. */
tpu_hv tpu_hlo_reduce(tpu_hlo *m, tpu_hv x, tpu_hv init, const int64_t *dims, int ndims, tpu_hlo_op op);
/* Variadic reduce with a region taking 2n scalars (acc..., elem...) and
 * returning n. */
bool tpu_hlo_reduce_region(tpu_hlo *m, const tpu_hv *xs, const tpu_hv *inits, int n, const int64_t *dims, int ndims,
                           int region, tpu_hv *outs);
/* Windowed reduce (pooling). All arrays have x's rank; padding is lo/hi
 * pairs: pad[2*i], pad[2*i+1]. NULL strides/dilations mean 1s; NULL pad 0s. */
bool tpu_hlo_reduce_window(tpu_hlo *m, const tpu_hv *xs, const tpu_hv *inits, int n, const int64_t *window,
                           const int64_t *strides, const int64_t *base_dil, const int64_t *win_dil, const int64_t *pad,
                           int region, tpu_hv *outs);

/* Matmul family. Result: batch dims, lhs free dims, rhs free dims; dtype is
 * out_dt (TPU_INVALID: the lhs dtype). */
tpu_hv tpu_hlo_dot_general(tpu_hlo *m, tpu_hv lhs, tpu_hv rhs, int nbatch, const int64_t *lhs_batch,
                           const int64_t *rhs_batch, int ncontract, const int64_t *lhs_contract,
                           const int64_t *rhs_contract, tpu_hlo_precision p, tpu_dtype out_dt);

typedef struct {
  int n_offset, n_collapsed, n_start_index_map, n_operand_batching;
  int64_t offset_dims[TPU_MAX_RANK];
  int64_t collapsed_slice_dims[TPU_MAX_RANK];
  int64_t operand_batching_dims[TPU_MAX_RANK];
  int64_t start_indices_batching_dims[TPU_MAX_RANK];
  int64_t start_index_map[TPU_MAX_RANK];
  int64_t index_vector_dim;
} tpu_hlo_gather_dims;

/* Result type is given by the caller (gather's inference is the caller's
 * business); slice_sizes has the operand's rank. */
tpu_hv tpu_hlo_gather(tpu_hlo *m, tpu_hv operand, tpu_hv indices, const tpu_hlo_gather_dims *d,
                      const int64_t *slice_sizes, tpu_hlo_type result);

typedef struct {
  int n_update_window, n_inserted, n_scatter_to_operand, n_input_batching;
  int64_t update_window_dims[TPU_MAX_RANK];
  int64_t inserted_window_dims[TPU_MAX_RANK];
  int64_t input_batching_dims[TPU_MAX_RANK];
  int64_t scatter_indices_batching_dims[TPU_MAX_RANK];
  int64_t scatter_dims_to_operand_dims[TPU_MAX_RANK];
  int64_t index_vector_dim;
} tpu_hlo_scatter_dims;

/* Result has operand's type. region: (old, new) scalars -> one scalar; pass
 * -1 to get a "replace with the update" body built for you. */
tpu_hv tpu_hlo_scatter(tpu_hlo *m, tpu_hv operand, tpu_hv indices, tpu_hv updates, const tpu_hlo_scatter_dims *d,
                       int region);

/* Sort n arrays of the same shape along dim with a comparator region taking
 * 2n scalars (lhs_0, rhs_0, lhs_1, rhs_1, ...) returning one i1. */
bool tpu_hlo_sort(tpu_hlo *m, const tpu_hv *xs, int n, int dim, bool stable, int region, tpu_hv *outs);

/* Counter-based bits: state is tensor<2xui64> (THREE_FRY); returns the new
 * state in *new_state and bits of type `bits` (an unsigned int type). */
tpu_hv tpu_hlo_rng_bit_generator(tpu_hlo *m, tpu_hv state, tpu_hlo_type bits, tpu_hv *new_state);

/* Convolution in the layout (batch, feature, spatial...) for input and
 * output and (out_feature, in_feature, spatial...) for the kernel, with nsp
 * spatial dims. pad: lo/hi pairs. NULL arrays mean defaults (1 or 0). */
tpu_hv tpu_hlo_convolution(tpu_hlo *m, tpu_hv input, tpu_hv kernel, int nsp, const int64_t *strides, const int64_t *pad,
                           const int64_t *lhs_dil, const int64_t *rhs_dil, int64_t feature_groups, int64_t batch_groups,
                           tpu_hlo_precision p);

/* ---- functions from StableHLO text (hlo_extern.c) -----------------------------
 * A StableHLO module written elsewhere (JAX's export, torchtpu.stablehlo_op's
 * text), pretty or generic form, parsed once: its @main's signature (tensors
 * of static shape) and its function definitions, renamed with a prefix made
 * from the text's hash and made private. A module being built calls it with
 * tpu_hlo_call; the definitions follow the builder's @main in the finished
 * text. Immutable once parsed (a variant may be added before any use); a
 * function must outlive every module that calls it. Bad text is a
 * TPU_ERR_VALUE status naming what is wrong. */

typedef struct tpu_hlo_fn tpu_hlo_fn;

tpu_status *tpu_hlo_fn_parse(const char *text, size_t len, tpu_hlo_fn **out);
void tpu_hlo_fn_free(tpu_hlo_fn *f);
int tpu_hlo_fn_nargs(const tpu_hlo_fn *f);
int tpu_hlo_fn_nresults(const tpu_hlo_fn *f);
/* Borrowed, valid while f lives; i must be in range. */
const tpu_hlo_type *tpu_hlo_fn_arg(const tpu_hlo_fn *f, int i);
const tpu_hlo_type *tpu_hlo_fn_result(const tpu_hlo_fn *f, int i);
/* The hash of its text (locations and comments dropped): same text, same hash. */
uint64_t tpu_hlo_fn_hash(const tpu_hlo_fn *f);
/* Its renamed definitions, as a finished module holds them (borrowed). */
const char *tpu_hlo_fn_text(const tpu_hlo_fn *f);
/* The same function for another compiler target ("tpu": a Pallas kernel's
 * Mosaic form, which only the TPU compiler compiles); its @main must have
 * f's signature. One variant; a later one replaces it. */
tpu_status *tpu_hlo_fn_add_variant(tpu_hlo_fn *f, const char *target, const char *text, size_t len);
bool tpu_hlo_fn_has_variant(const tpu_hlo_fn *f, const char *target);
/* Emit `"func.call"(args) {callee = @<prefix>main}`: the operands must have
 * @main's argument types; writes its tpu_hlo_fn_nresults(f) results to outs. */
bool tpu_hlo_call(tpu_hlo *m, const tpu_hlo_fn *f, const tpu_hv *args, int n, tpu_hv *outs);
/* The attribute of the barriers that only keep the CPU compiler from
 * rewriting a division (exact division). */
#define TPU_HLO_CPU_EXACT "torchtpu.cpu_exact"
/* A finished module's text with the definitions of every fns[i] that has a
 * variant for target replaced by the variant's (the same names, so the calls
 * stay): what the target's compiler is given. For "tpu", TPU_HLO_CPU_EXACT
 * barriers are identities: a program made on a TPU has none, and a barrier
 * keeps XLA from fusing what it hides (a divisor's broadcast, materialized).
 * *out is owned by the caller. */
tpu_status *tpu_hlo_retarget(const char *text, size_t len, const tpu_hlo_fn *const *fns, int nfns, const char *target,
                             char **out, size_t *outlen);

#endif
