/* emit_matmul.c: matrix products: mm, addmm, bmm, baddbmm, addbmm, mv,
 * addmv, dot and vdot. All are stablehlo.dot_general accumulating in f32
 * for half types and rounding once, as torch's CPU kernels compute them,
 * and refuse what those kernels refuse (bool, mixed dtypes) with their
 * words. */
#include <string.h>

#include "emit.h"

/* beta * self + alpha * prod with torch's rule that beta == 0 ignores self
 * (NaN in self does not propagate). Scalars are program inputs. */
static tpu_hv tpu_scaled_sum(tpu_lower *L, int self_arg, tpu_hv prod, int beta_arg, int alpha_arg, tpu_dtype dt) {
  const tpu_hlo_type *pt = T(L, prod);
  int rank = pt->rank;
  int64_t dims[TPU_MAX_RANK];
  memcpy(dims, pt->dims, sizeof(int64_t) * (size_t)rank);
  tpu_hv p = prod;
  if (tpu_arg_is(L, alpha_arg, TPU_ARG_SCALAR) && !L->args[alpha_arg].is_default)
    p = tpu_lower_binary(L, TPU_HLO_MUL, p, tpu_lower_scalar(L, alpha_arg, dt));
  tpu_hv s = tpu_lower_broadcast_to(L, tpu_lower_input(L, self_arg, dt), rank, dims);
  if (tpu_arg_is(L, beta_arg, TPU_ARG_SCALAR) && !L->args[beta_arg].is_default) {
    tpu_hv b = tpu_lower_scalar(L, beta_arg, dt);
    tpu_hv bs = tpu_lower_binary(L, TPU_HLO_MUL, s, b);
    tpu_hv z = tpu_hlo_compare(H, TPU_HLO_EQ, b, tpu_hlo_constant(H, dt, 0));
    s = tpu_hlo_select(H, tpu_lower_broadcast_to(L, z, rank, dims), tpu_k(L, bs, 0), bs);
  }
  return tpu_hlo_binary(H, TPU_HLO_ADD, s, p);
}

static bool tpu_same_dtype(tpu_lower *L, int a, int b, const char *what) {
  if (L->args[a].t.dtype != L->args[b].t.dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s: expected %s to have the same dtype, but got: %s != %s", L->opname, what,
                   tpu_dtype_name(L->args[a].t.dtype), tpu_dtype_name(L->args[b].t.dtype));
    return false;
  }
  return true;
}

static void tpu_check_mm_dtypes(tpu_lower *L, int a, int b) {
  if (L->args[a].t.dtype != L->args[b].t.dtype)
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected m1 and m2 to have the same dtype, but got: %s != %s",
                   tpu_typemeta_name(L->args[a].t.dtype), tpu_typemeta_name(L->args[b].t.dtype));
}

/* torch's CPU matmul kernels have no bool instance: they refuse bool inputs
 * only where they would compute, not for an empty result or an empty sum
 * (those return before the kernel's dtype dispatch). */
static bool tpu_mm_bool_refused(tpu_lower *L, int a, int64_t out_numel, int64_t inner, const char *kernel) {
  if (L->args[a].t.dtype != TPU_PRED || out_numel == 0 || inner == 0) return false;
  tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"%s\" not implemented for 'Bool'", kernel);
  return true;
}

static tpu_hv tpu_matmul2(tpu_lower *L, tpu_hv a, tpu_hv b) {
  const tpu_hlo_type *at = T(L, a), *bt = T(L, b);
  if (at->rank != 2 || bt->rank != 2 || at->dims[1] != bt->dims[0]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                   (long long)at->dims[0], (long long)(at->rank > 1 ? at->dims[1] : 0), (long long)bt->dims[0],
                   (long long)(bt->rank > 1 ? bt->dims[1] : 0));
    return TPU_HV_NONE;
  }
  tpu_dtype dt = at->dtype, acc = tpu_acc_type(dt);
  int64_t lc = 1, rc = 0;
  tpu_hv r = tpu_hlo_dot_general(H, a, b, 0, NULL, NULL, 1, &lc, &rc, L->precision, acc);
  return tpu_hlo_convert(H, r, dt);
}

void tpu_emit_mm(tpu_lower *L) {
  tpu_check_mm_dtypes(L, 0, 1);
  tpu_tref *x = &L->args[0].t, *y = &L->args[1].t;
  if (x->rank == 2 && y->rank == 2 &&
      tpu_mm_bool_refused(L, 0, x->sizes[0] * y->sizes[1], x->sizes[1], "addmm_impl_cpu_"))
    return;
  tpu_lower_out(L, tpu_matmul2(L, tpu_lower_tensor(L, 0, -1), tpu_lower_tensor(L, 1, -1)));
}

/* addmm(self, mat1, mat2, *, beta=1, alpha=1) = beta*self + alpha*(mat1@mat2),
 * accumulated in f32 for half types and rounded once, as torch's CPU kernel */
void tpu_emit_addmm(tpu_lower *L) {
  const char *what[2] = {"self", "mat1"};
  for (int i = 0; i < 2; i++)
    if (L->args[i].t.dtype != L->args[2].t.dtype) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s and mat2 must have the same dtype, but got %s and %s", what[i],
                     tpu_dtype_c10_name(L->args[i].t.dtype), tpu_dtype_c10_name(L->args[2].t.dtype));
      return;
    }
  tpu_tref *x = &L->args[1].t, *y = &L->args[2].t;
  if (x->rank == 2 && y->rank == 2 &&
      tpu_mm_bool_refused(L, 1, x->sizes[0] * y->sizes[1], x->sizes[1], "addmm_impl_cpu_"))
    return;
  tpu_dtype dt = L->args[1].t.dtype, acc = tpu_acc_type(dt);
  tpu_hv a = tpu_lower_tensor(L, 1, -1), b = tpu_lower_tensor(L, 2, -1);
  if (T(L, a)->rank != 2 || T(L, b)->rank != 2 || T(L, a)->dims[1] != T(L, b)->dims[0]) {
    tpu_matmul2(L, a, b); /* reports the shape error */
    return;
  }
  int64_t lc = 1, rc = 0;
  tpu_hv p = tpu_hlo_dot_general(H, a, b, 0, NULL, NULL, 1, &lc, &rc, L->precision, acc);
  if (!L->args[4].is_default) p = tpu_lower_binary(L, TPU_HLO_MUL, p, tpu_lower_scalar(L, 4, acc));
  tpu_hv s = tpu_lower_input(L, 0, acc);
  if (!L->args[3].is_default) {
    tpu_hv beta = tpu_lower_scalar(L, 3, acc);
    s = tpu_lower_binary(L, TPU_HLO_MUL, s, beta); /* beta == 0 ignores self, NaNs included */
    s = tpu_hlo_select(
        H,
        tpu_hlo_compare(H, TPU_HLO_EQ, tpu_lower_broadcast_to(L, beta, T(L, s)->rank, T(L, s)->dims), tpu_k(L, s, 0)),
        tpu_k(L, s, 0), s);
  }
  const tpu_hlo_type *pt = T(L, p);
  tpu_hv r = tpu_hlo_binary(H, TPU_HLO_ADD, tpu_lower_broadcast_to(L, s, pt->rank, pt->dims), p);
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* bmm(self, mat2): the result takes mat2's dtype (torch's meta kernel
 * allocates it from mat2), and an empty result or an empty sum (zeros)
 * returns before any dtype check, whatever the two dtypes; otherwise bool is
 * refused and the dtypes must agree. */
void tpu_emit_bmm(tpu_lower *L) {
  tpu_tref *x = &L->args[0].t, *y = &L->args[1].t;
  if (x->rank != 3 || y->rank != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "%s must be a 3D tensor", x->rank != 3 ? "batch1" : "batch2");
    return;
  }
  if (x->sizes[0] != y->sizes[0] || x->sizes[2] != y->sizes[1]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected size for first two dimensions of batch2 tensor to be: [%lld, %lld] but got: [%lld, %lld].",
                   (long long)x->sizes[0], (long long)x->sizes[2], (long long)y->sizes[0], (long long)y->sizes[1]);
    return;
  }
  int64_t rd[3] = {x->sizes[0], x->sizes[1], y->sizes[2]};
  if (rd[0] * rd[1] * rd[2] == 0 || x->sizes[2] == 0) {
    tpu_lower_out(L, tpu_lower_full(L, tpu_hlo_type_make(y->dtype, 3, rd), 0));
    return;
  }
  if (tpu_mm_bool_refused(L, 0, 1, 1, "bmm")) return;
  if (x->dtype != y->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected scalar type %s but found %s", tpu_dtype_c10_name(x->dtype),
                   tpu_dtype_c10_name(y->dtype));
    return;
  }
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  tpu_dtype dt = x->dtype;
  int64_t z = 0, lc = 2, rc = 1;
  tpu_hv r = tpu_hlo_dot_general(H, a, b, 1, &z, &z, 1, &lc, &rc, L->precision, tpu_acc_type(dt));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* dot(self, tensor), mv(self, vec) */
void tpu_emit_dot(tpu_lower *L) {
  tpu_tref *x = &L->args[0].t, *y = &L->args[1].t;
  if (!strncmp(L->opname, "mv", 2) &&
      (L->opname[2] == 0 || L->opname[2] == '.')) { /* torch's addmv: (result = vec's dtype, mat, vec) */
    if (x->dtype != y->dtype) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "addmv input tensors must have the same dtype, but got %s, %s, and %s",
                     tpu_dtype_c10_name(y->dtype), tpu_dtype_c10_name(x->dtype), tpu_dtype_c10_name(y->dtype));
      return;
    }
    if (x->rank == 2 && tpu_mm_bool_refused(L, 0, x->sizes[0], x->sizes[1], "addmv_impl_cpu")) return;
  } else {
    if (x->dtype != y->dtype) {
      tpu_lower_fail(L, TPU_ERR_RUNTIME, "dot : expected both vectors to have same dtype, but found %s and %s",
                     tpu_dtype_c10_name(x->dtype), tpu_dtype_c10_name(y->dtype));
      return;
    }
    if (x->dtype == TPU_PRED) { /* refused even when empty */
      tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "\"dot\" not implemented for 'Bool'");
      return;
    }
  }
  tpu_hv a = tpu_lower_tensor(L, 0, -1), b = tpu_lower_tensor(L, 1, -1);
  tpu_dtype dt = T(L, a)->dtype;
  int64_t lc = T(L, a)->rank - 1, rc = 0;
  tpu_hv r = tpu_hlo_dot_general(H, a, b, 0, NULL, NULL, 1, &lc, &rc, L->precision, tpu_acc_type(dt));
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}

/* baddbmm(self, batch1, batch2, *, beta, alpha) and addbmm (sum over the batch). */
static void tpu_emit_bmm_add(tpu_lower *L, bool reduce_batch) {
  if (!tpu_same_dtype(L, 1, 2, "batch1 and batch2")) return;
  tpu_tref *a = &L->args[1].t, *b = &L->args[2].t;
  if (a->rank != 3 || b->rank != 3) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "batch1 must be a 3D tensor");
    return;
  }
  if (a->sizes[0] != b->sizes[0] || a->sizes[2] != b->sizes[1]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "Expected size for first two dimensions of batch2 tensor to be: [%lld, %lld] but got: [%lld, %lld].",
                   (long long)a->sizes[0], (long long)a->sizes[2], (long long)b->sizes[0], (long long)b->sizes[1]);
    return;
  }
  tpu_dtype dt = a->dtype, acc = tpu_acc_type(dt);
  tpu_hv x = tpu_lower_tensor(L, 1, -1), y = tpu_lower_tensor(L, 2, -1);
  tpu_hv p;
  if (reduce_batch) {
    int64_t lc[2] = {0, 2}, rc[2] = {0, 1};
    p = tpu_hlo_dot_general(H, x, y, 0, NULL, NULL, 2, lc, rc, L->precision, acc);
  } else {
    int64_t z = 0, lc = 2, rc = 1;
    p = tpu_hlo_dot_general(H, x, y, 1, &z, &z, 1, &lc, &rc, L->precision, acc);
  }
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_scaled_sum(L, 0, p, 3, 4, acc), dt));
}
void tpu_emit_baddbmm(tpu_lower *L) { tpu_emit_bmm_add(L, false); }
void tpu_emit_addbmm(tpu_lower *L) { tpu_emit_bmm_add(L, true); }

/* addmv(self, mat, vec, *, beta, alpha) */
void tpu_emit_addmv(tpu_lower *L) {
  if (!tpu_same_dtype(L, 1, 2, "mat and vec")) return;
  tpu_tref *m = &L->args[1].t, *v = &L->args[2].t;
  if (m->rank != 2 || v->rank != 1 || m->sizes[1] != v->sizes[0]) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "size mismatch, got input (%lld), mat (%lldx%lld), vec (%lld)",
                   (long long)(L->args[0].t.rank ? L->args[0].t.sizes[0] : 1),
                   (long long)(m->rank > 0 ? m->sizes[0] : 0), (long long)(m->rank > 1 ? m->sizes[1] : 0),
                   (long long)(v->rank > 0 ? v->sizes[0] : 0));
    return;
  }
  tpu_dtype dt = m->dtype, acc = tpu_acc_type(dt);
  int64_t lc = 1, rc = 0;
  tpu_hv p = tpu_hlo_dot_general(H, tpu_lower_tensor(L, 1, -1), tpu_lower_tensor(L, 2, -1), 0, NULL, NULL, 1, &lc, &rc,
                                 L->precision, acc);
  tpu_lower_out(L, tpu_hlo_convert(H, tpu_scaled_sum(L, 0, p, 3, 4, acc), dt));
}

/* vdot(self, other): dot of 1-d tensors (real dtypes: no conjugation to do). */
void tpu_emit_vdot(tpu_lower *L) {
  tpu_tref *a = &L->args[0].t, *b = &L->args[1].t;
  if (a->rank != 1 || b->rank != 1) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "1D tensors expected, but got %dD and %dD tensors", a->rank, b->rank);
    return;
  }
  if (a->dtype != b->dtype) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME, "expected both vectors to have same dtype, but found %s and %s",
                   tpu_dtype_name(a->dtype), tpu_dtype_name(b->dtype));
    return;
  }
  if (a->sizes[0] != b->sizes[0]) {
    tpu_lower_fail(
        L, TPU_ERR_RUNTIME,
        "inconsistent tensor size, expected tensor [%lld] and src [%lld] to have the same number of elements, but got %lld and %lld elements respectively",
        (long long)a->sizes[0], (long long)b->sizes[0], (long long)a->sizes[0], (long long)b->sizes[0]);
    return;
  }
  if (tpu_dtype_is_complex(a->dtype)) {
    tpu_lower_fail(L, TPU_ERR_UNIMPLEMENTED, "vdot: complex tensors are not supported on tpu yet");
    return;
  }
  tpu_dtype dt = a->dtype, acc = tpu_acc_type(dt);
  int64_t lc = 0, rc = 0;
  tpu_hv r = tpu_hlo_dot_general(H, tpu_lower_tensor(L, 0, -1), tpu_lower_tensor(L, 1, -1), 0, NULL, NULL, 1, &lc, &rc,
                                 L->precision, acc);
  tpu_lower_out(L, tpu_hlo_convert(H, r, dt));
}
