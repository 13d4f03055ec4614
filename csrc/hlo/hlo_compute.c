/* hlo_compute.c: the structured ops (see hlo.h; the builder's files are
 * listed in hlo_impl.h).
 *
 * dot_general, gather, scatter, sort, rng_bit_generator and convolution.
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
