/* hlo_compute.c: the structured ops (see hlo.h; the builder's files are
 * listed in hlo_impl.h).
 *
 * dot_general, gather, scatter, sort, rng_bit_generator and convolution
 * (of 64-bit integers: spelled with sums of products, see below).
 * Each checks its operands and dimension numbers, infers its result types
 * (gather's is the caller's) and emits one op, the dimension numbers printed
 * as #stablehlo attributes. A scatter given no region gets one that keeps
 * the update; sort's comparator must take a pair of scalars per operand and
 * return i1.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "hlo_impl.h"

static void tpu_put_list(tpu_hlo *m, tpu_buf *b, const char *name, const int64_t *v, int n, bool *first) {
  if (n == 0) return;
  tpu_hloi_buf_printf(m, b, "%s%s = [", *first ? "" : ", ", name);
  tpu_hloi_put_i64s(m, b, v, n);
  tpu_hloi_buf_put(m, b, "]", 1);
  *first = false;
}

/* 64-bit integers: TPU's compiler has no integer dot or convolution of 64
 * bits (its rewrite of X64 types into 32-bit pairs does not cover them), so
 * for S64 and U64 the builder spells both with what it covers: a dot as a
 * sum of products, a convolution as a sum over the window of strided slices
 * dotted with the kernel's taps. The values are the same (integer products
 * and sums wrap alike); XLA fuses the products into the sum. */
static bool tpu_wide_int(tpu_dtype dt) { return dt == TPU_S64 || dt == TPU_U64; }

/* Elements of the products one step of a 64-bit integer dot forms (32 MiB):
 * a dot whose products are more is summed by a loop over blocks of the
 * contracting dims, so memory stays bounded whatever the sizes. */
#define TPU_WIDE_DOT_BLOCK ((int64_t)1 << 22)

/* sum over k of l [Bt, M, k] * r [Bt, N, k]: [Bt, M, N] */
static tpu_hv tpu_sum_of_products(tpu_hlo *m, tpu_hv l, tpu_hv r, int64_t Bt, int64_t M, int64_t N, int64_t k,
                                  tpu_dtype dt) {
  int64_t pd[4] = {Bt, M, N, k}, lm[3] = {0, 1, 3}, rm[3] = {0, 2, 3}, red = 3;
  tpu_hv p = tpu_hlo_binary(m, TPU_HLO_MUL, tpu_hlo_broadcast_in_dim(m, l, 4, pd, lm),
                            tpu_hlo_broadcast_in_dim(m, r, 4, pd, rm));
  return tpu_hlo_reduce(m, p, tpu_hlo_constant_int(m, dt, 0), &red, 1, TPU_HLO_ADD);
}

/* dot_general as products summed over the contracting dims; the operands
 * checked by the caller. Both are brought to [Bt, M or N, K] (batch, free
 * and contracting dims each collapsed into one); the result is reshaped to
 * dot_general's dims: batch, lhs free, rhs free. */
static tpu_hv tpu_dot_by_sum(tpu_hlo *m, tpu_hv lhs, tpu_hv rhs, int nb, const int64_t *lb, const int64_t *rb, int nc,
                             const int64_t *lc, const int64_t *rc, tpu_dtype dt) {
  const tpu_hlo_type lt = TY(lhs), rt = TY(rhs);
  int64_t lperm[TPU_MAX_RANK], rperm[TPU_MAX_RANK], res[TPU_MAX_RANK];
  bool lused[TPU_MAX_RANK] = {0}, rused[TPU_MAX_RANK] = {0};
  int nl = 0, nr = 0, nres = 0;
  int64_t Bt = 1, M = 1, N = 1, K = 1;
  for (int i = 0; i < nb; i++) {
    lused[lb[i]] = rused[rb[i]] = true;
    lperm[nl++] = lb[i];
    rperm[nr++] = rb[i];
    res[nres++] = lt.dims[lb[i]];
    Bt *= lt.dims[lb[i]];
  }
  for (int i = 0; i < nc; i++) lused[lc[i]] = rused[rc[i]] = true;
  for (int i = 0; i < lt.rank; i++)
    if (!lused[i]) {
      lperm[nl++] = i;
      res[nres++] = lt.dims[i];
      M *= lt.dims[i];
    }
  for (int i = 0; i < rt.rank; i++)
    if (!rused[i]) {
      rperm[nr++] = i;
      res[nres++] = rt.dims[i];
      N *= rt.dims[i];
    }
  for (int i = 0; i < nc; i++) {
    lperm[nl++] = lc[i];
    rperm[nr++] = rc[i];
    K *= lt.dims[lc[i]];
  }
  tpu_hv zero = tpu_hlo_constant_int(m, dt, 0);
  if (Bt * M * N == 0 || K == 0) return tpu_hlo_broadcast_in_dim(m, zero, nres, res, NULL);
  int64_t l3[3] = {Bt, M, K}, r3[3] = {Bt, N, K};
  tpu_hv l = tpu_hlo_reshape(m, tpu_hlo_transpose(m, tpu_hlo_convert(m, lhs, dt), lperm), 3, l3);
  tpu_hv r = tpu_hlo_reshape(m, tpu_hlo_transpose(m, tpu_hlo_convert(m, rhs, dt), rperm), 3, r3);
  int64_t per = Bt * M * N, kb = per >= TPU_WIDE_DOT_BLOCK ? 1 : TPU_WIDE_DOT_BLOCK / per;
  if (kb >= K) return tpu_hlo_reshape(m, tpu_sum_of_products(m, l, r, Bt, M, N, K, dt), nres, res);
  /* a loop over nblk blocks of kb contracting indices, K padded with zeros to nblk * kb */
  int64_t nblk = (K + kb - 1) / kb, lo[3] = {0, 0, 0}, hi[3] = {0, 0, nblk * kb - K}, in[3] = {0, 0, 0};
  int64_t acc3[3] = {Bt, M, N};
  tpu_hv init[4] = {tpu_hlo_constant_int(m, TPU_S64, 0), tpu_hlo_broadcast_in_dim(m, zero, 3, acc3, NULL),
                    tpu_hlo_pad(m, l, zero, lo, hi, in), tpu_hlo_pad(m, r, zero, lo, hi, in)};
  tpu_hlo_type ty[4];
  for (int i = 0; i < 4; i++) ty[i] = TY(init[i]);
  tpu_hv a[4];
  tpu_hlo_region_begin(m, ty, 4, a);
  tpu_hv more = tpu_hlo_compare(m, TPU_HLO_LT, a[0], tpu_hlo_constant_int(m, TPU_S64, nblk));
  int regions[2];
  regions[0] = tpu_hlo_region_end(m, &more, 1);
  tpu_hlo_region_begin(m, ty, 4, a);
  tpu_hv z = tpu_hlo_constant_int(m, TPU_S64, 0);
  tpu_hv st[3] = {z, z, tpu_hlo_binary(m, TPU_HLO_MUL, a[0], tpu_hlo_constant_int(m, TPU_S64, kb))};
  int64_t lsz[3] = {Bt, M, kb}, rsz[3] = {Bt, N, kb};
  tpu_hv part = tpu_sum_of_products(m, tpu_hlo_dynamic_slice(m, a[2], st, lsz), tpu_hlo_dynamic_slice(m, a[3], st, rsz),
                                    Bt, M, N, kb, dt);
  tpu_hv next[4] = {tpu_hlo_binary(m, TPU_HLO_ADD, a[0], tpu_hlo_constant_int(m, TPU_S64, 1)),
                    tpu_hlo_binary(m, TPU_HLO_ADD, a[1], part), a[2], a[3]};
  regions[1] = tpu_hlo_region_end(m, next, 4);
  tpu_hv outs[4] = {TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE, TPU_HV_NONE};
  if (!tpu_hlo_emit(m, "stablehlo.while", init, 4, regions, 2, NULL, ty, 4, outs)) return TPU_HV_NONE;
  return tpu_hlo_reshape(m, outs[1], nres, res);
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
  if (tpu_wide_int(t.dtype) || tpu_wide_int(lt->dtype))
    return tpu_dot_by_sum(m, lhs, rhs, nbatch, lhs_batch, rhs_batch, ncontract, lhs_contract, rhs_contract, t.dtype);
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

/* A 64-bit integer convolution as a sum over the kernel's taps: for each,
 * the padded, dilated input sliced at the tap's offset with the strides
 * (batch, feature, output spatial), dotted with the tap's [out, in] weights
 * over the feature group. it, kt: the operands' types; t: the result's. */
static tpu_hv tpu_conv_by_taps(tpu_hlo *m, tpu_hv x, tpu_hv w, tpu_hlo_type it, tpu_hlo_type kt, tpu_hlo_type t,
                               const int64_t *st, const int64_t *pad, const int64_t *ld, const int64_t *rd, int64_t fg,
                               int64_t bg) {
  int nsp = it.rank - 2;
  tpu_hv zero = tpu_hlo_constant_int(m, t.dtype, 0);
  int64_t taps = 1, numel = 1;
  for (int i = 0; i < nsp; i++) taps *= kt.dims[2 + i];
  for (int i = 0; i < t.rank; i++) numel *= t.dims[i];
  if (taps == 0 || numel == 0 || kt.dims[1] == 0) return tpu_hlo_broadcast_in_dim(m, zero, t.rank, t.dims, NULL);
  if (fg > 1 && bg > 1) {
    tpu_hlo_fail(m, TPU_ERR_VALUE, "stablehlo.convolution: feature and batch groups both over 1");
    return TPU_HV_NONE;
  }
  int64_t lo[TPU_MAX_RANK] = {0}, hi[TPU_MAX_RANK] = {0}, in[TPU_MAX_RANK] = {0};
  for (int i = 0; i < nsp; i++) {
    lo[2 + i] = pad ? pad[2 * i] : 0;
    hi[2 + i] = pad ? pad[2 * i + 1] : 0;
    in[2 + i] = ld[i] - 1;
  }
  tpu_hv xp = tpu_hlo_pad(m, x, zero, lo, hi, in);
  int64_t G = fg > 1 ? fg : bg, B = t.dims[0], O = kt.dims[0], Cg = kt.dims[1];
  tpu_hv acc = TPU_HV_NONE;
  for (int64_t tap = 0; tap < taps; tap++) {
    int64_t k[TPU_MAX_RANK], rem = tap;
    for (int i = nsp - 1; i >= 0; i--) {
      k[i] = rem % kt.dims[2 + i];
      rem /= kt.dims[2 + i];
    }
    int64_t s0[TPU_MAX_RANK] = {0}, s1[TPU_MAX_RANK], ss[TPU_MAX_RANK], w0[TPU_MAX_RANK] = {0}, w1[TPU_MAX_RANK];
    s1[0] = it.dims[0];
    s1[1] = it.dims[1];
    ss[0] = ss[1] = 1;
    w1[0] = O;
    w1[1] = Cg;
    for (int i = 0; i < nsp; i++) {
      s0[2 + i] = k[i] * rd[i];
      s1[2 + i] = s0[2 + i] + (t.dims[2 + i] - 1) * st[i] + 1;
      ss[2 + i] = st[i];
      w0[2 + i] = k[i];
      w1[2 + i] = k[i] + 1;
    }
    tpu_hv xs = tpu_hlo_slice(m, xp, s0, s1, ss);
    /* lhs [B, G, Cg, out...] (feature groups) or [G, B, C, out...] (batch groups); rhs [G, O/G, Cg] */
    int64_t ld_[TPU_MAX_RANK], rdm[3] = {G, O / G, Cg};
    ld_[0] = fg > 1 ? B : G;
    ld_[1] = fg > 1 ? G : B;
    ld_[2] = Cg;
    for (int i = 0; i < nsp; i++) ld_[3 + i] = t.dims[2 + i];
    xs = tpu_hlo_reshape(m, xs, nsp + 3, ld_);
    tpu_hv wk = tpu_hlo_reshape(m, tpu_hlo_slice(m, w, w0, w1, NULL), 3, rdm);
    int64_t lb = fg > 1 ? 1 : 0, rb = 0, lc = 2, rc = 2;
    /* [G, B, out..., O/G] */
    tpu_hv d = tpu_dot_by_sum(m, xs, wk, 1, &lb, &rb, 1, &lc, &rc, t.dtype);
    acc = tap == 0 ? d : tpu_hlo_binary(m, TPU_HLO_ADD, acc, d);
  }
  /* to [B, G, O/G, out...], then [B, O, out...] */
  int64_t perm[TPU_MAX_RANK] = {1, 0, nsp + 2};
  for (int i = 0; i < nsp; i++) perm[3 + i] = 2 + i;
  return tpu_hlo_reshape(m, tpu_hlo_transpose(m, acc, perm), t.rank, t.dims);
}

tpu_hv tpu_hlo_convolution(tpu_hlo *m, tpu_hv input, tpu_hv kernel, int nsp, const int64_t *strides, const int64_t *pad,
                           const int64_t *lhs_dil, const int64_t *rhs_dil, int64_t feature_groups, int64_t batch_groups,
                           tpu_hlo_precision p) {
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
  if (tpu_wide_int(t.dtype))
    return tpu_conv_by_taps(m, input, kernel, *it, *kt, t, st, pad, ld, rd, feature_groups, batch_groups);
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
