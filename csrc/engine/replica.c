/* replica.c: replica-mode collectives: one collective over n local devices
 * as one program of n replicas (stablehlo.all_reduce, all_gather,
 * reduce_scatter, all_to_all, collective_permute), each replica reading the
 * record on its device and writing a new record there. The in-program
 * transport a multi-process backend uses, run here over the local devices of
 * one process.
 *
 * Programs are keyed by their text (it holds every parameter of the
 * collective and n) in a small table of the engine, replaced round-robin;
 * they do not go through the disk tier.
 */
#define _GNU_SOURCE
#include "replica.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

const char *const tpu_coll_names[TPU_COLL_COUNT] = {
#define TPU_COLLECTIVE(id, name, doc) name,
#include "collectives.def"
};
const char *const tpu_red_names[TPU_RED_COUNT] = {
#define TPU_REDUCE_OP(id, name, doc) name,
#include "collectives.def"
};

static int64_t tpu_shape_numel(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  return n;
}

static bool tpu_coll_reduces(tpu_coll_kind k) { return k == TPU_COLL_ALL_REDUCE || k == TPU_COLL_REDUCE_SCATTER; }

tpu_status *tpu_collective_check(const tpu_collective *c, int n, int *rank, int64_t *dims) {
  if ((unsigned)c->kind >= TPU_COLL_COUNT) return tpu_status_new(TPU_ERR_VALUE, "unknown collective %d", (int)c->kind);
  const char *name = tpu_coll_names[c->kind];
  if (n < 1 || n > TPU_MAX_REPLICAS)
    return tpu_status_new(TPU_ERR_VALUE, "%s: %d replicas (1 to %d)", name, n, TPU_MAX_REPLICAS);
  if (c->rank < 0 || c->rank > TPU_MAX_RANK)
    return tpu_status_new(TPU_ERR_VALUE, "%s: rank %d (at most %d)", name, c->rank, TPU_MAX_RANK);
  if (tpu_dtype_size(c->dtype) == 0) return tpu_status_new(TPU_ERR_TYPE, "%s: invalid dtype", name);
  for (int i = 0; i < c->rank; i++)
    if (c->dims[i] < 0) return tpu_status_new(TPU_ERR_VALUE, "%s: negative dimension %d", name, i);
  if (tpu_coll_reduces(c->kind)) {
    if ((unsigned)c->op >= TPU_RED_COUNT) return tpu_status_new(TPU_ERR_VALUE, "%s: unknown reduce op %d", name, c->op);
    const char *op = tpu_red_names[c->op], *dt = tpu_dtype_name(c->dtype);
    if (c->dtype == TPU_PRED)
      return tpu_status_new(TPU_ERR_TYPE, "%s: reduce op %s is not supported for bool tensors", name, op);
    if (c->op == TPU_RED_AVG && !tpu_dtype_is_float(c->dtype) && !tpu_dtype_is_complex(c->dtype))
      return tpu_status_new(TPU_ERR_TYPE,
                            "%s: reduce op avg needs a floating-point or complex dtype, not %s (gloo refuses avg; "
                            "sum, then divide)",
                            name, dt);
    if ((c->op == TPU_RED_MIN || c->op == TPU_RED_MAX) && tpu_dtype_is_complex(c->dtype))
      return tpu_status_new(TPU_ERR_TYPE, "%s: reduce op %s is not defined for complex dtype %s", name, op, dt);
  }
  *rank = c->rank;
  memcpy(dims, c->dims, sizeof(int64_t) * (size_t)c->rank);
  switch (c->kind) {
    case TPU_COLL_ALL_GATHER:
      if (c->rank == 0) {
        *rank = 1;
        dims[0] = n;
      } else {
        dims[0] = c->dims[0] * n;
      }
      break;
    case TPU_COLL_REDUCE_SCATTER:
    case TPU_COLL_ALL_TO_ALL:
      if (c->rank == 0) return tpu_status_new(TPU_ERR_VALUE, "%s: needs tensors of at least one dimension", name);
      if (c->dims[0] % n)
        return tpu_status_new(TPU_ERR_VALUE, "%s: dimension 0 (%lld) is not divisible by the %d replicas", name,
                              (long long)c->dims[0], n);
      if (c->kind == TPU_COLL_REDUCE_SCATTER) dims[0] = c->dims[0] / n;
      break;
    case TPU_COLL_PERMUTE: {
      if (c->npairs < 0 || c->npairs > n)
        return tpu_status_new(TPU_ERR_VALUE, "%s: %d pairs for %d replicas", name, c->npairs, n);
      uint64_t srcs = 0, dsts = 0;
      for (int i = 0; i < c->npairs; i++) {
        int s = c->pairs[i][0], t = c->pairs[i][1];
        if (s < 0 || s >= n || t < 0 || t >= n)
          return tpu_status_new(TPU_ERR_VALUE, "%s: pair (%d, %d) names a replica outside 0..%d", name, s, t, n - 1);
        if (srcs >> s & 1) return tpu_status_new(TPU_ERR_VALUE, "%s: replica %d is the source of two pairs", name, s);
        if (dsts >> t & 1) return tpu_status_new(TPU_ERR_VALUE, "%s: replica %d is the target of two pairs", name, t);
        srcs |= 1ull << s;
        dsts |= 1ull << t;
      }
      break;
    }
    case TPU_COLL_BROADCAST:
      if (c->src < 0 || c->src >= n)
        return tpu_status_new(TPU_ERR_VALUE, "%s: source replica %d outside 0..%d", name, c->src, n - 1);
      break;
    default: break;
  }
  return NULL;
}

/* " replica_groups = dense<[[0, 1, ..., n-1]]> : tensor<1xnxi64>" */
static int tpu_groups_attr(char *buf, size_t cap, int n) {
  int k = snprintf(buf, cap, "replica_groups = dense<[[");
  for (int i = 0; i < n; i++) k += snprintf(buf + k, cap - (size_t)k, i ? ", %d" : "%d", i);
  k += snprintf(buf + k, cap - (size_t)k, "]]> : tensor<1x%dxi64>", n);
  return k;
}

static int tpu_reduce_region(tpu_hlo *m, tpu_dtype dt, tpu_red_op op) {
  static const tpu_hlo_op ops[TPU_RED_COUNT] = {TPU_HLO_ADD, TPU_HLO_MUL, TPU_HLO_MIN, TPU_HLO_MAX, TPU_HLO_ADD};
  tpu_hlo_type st[2] = {tpu_hlo_type_make(dt, 0, NULL), tpu_hlo_type_make(dt, 0, NULL)};
  tpu_hv a[2];
  tpu_hlo_region_begin(m, st, 2, a);
  tpu_hv r = tpu_hlo_binary(m, ops[op], a[0], a[1]);
  return tpu_hlo_region_end(m, &r, 1);
}

/* x / n for AVG (floating and complex dtypes). */
static tpu_hv tpu_avg(tpu_hlo *m, tpu_hv x, tpu_dtype dt, int n) {
  const tpu_hlo_type *t = tpu_hlo_typeof(m, x);
  tpu_hlo_type tt = *t;
  tpu_hv k = tpu_hlo_constant(m, dt, (double)n);
  int64_t bd[TPU_MAX_RANK] = {0};
  tpu_hv kb = tpu_hlo_broadcast_in_dim(m, k, tt.rank, tt.dims, bd);
  return tpu_hlo_binary(m, TPU_HLO_DIV, x, kb);
}

/* The program of c over n replicas: @main(input record) -> output record,
 * each in the shape of its record's buffer (it: the inputs'; the output's is
 * tpu_buffer_type of its shape). */
static tpu_status *tpu_replica_text(const tpu_collective *c, int n, const tpu_hlo_type *it, int orank,
                                    const int64_t *odims, char **text, size_t *len) {
  tpu_hlo *m = tpu_hlo_new();
  if (!m) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  tpu_hlo_set_num_replicas(m, n);
  tpu_hlo_set_num_partitions(m, 1);
  tpu_hv p = tpu_hlo_param(m, *it);
  tpu_hv x = tpu_hlo_reshape(m, p, c->rank, c->dims);
  char attrs[2048], groups[1024];
  tpu_groups_attr(groups, sizeof groups, n);
  tpu_hlo_type ot = tpu_hlo_type_make(c->dtype, orank, odims);
  tpu_hv y = TPU_HV_NONE;
  switch (c->kind) {
    case TPU_COLL_ALL_REDUCE:
    case TPU_COLL_REDUCE_SCATTER: {
      int reg = tpu_reduce_region(m, c->dtype, c->op);
      if (c->kind == TPU_COLL_ALL_REDUCE)
        snprintf(attrs, sizeof attrs, "%s", groups);
      else
        snprintf(attrs, sizeof attrs, "%s, scatter_dimension = 0 : i64", groups);
      tpu_hlo_emit(m, c->kind == TPU_COLL_ALL_REDUCE ? "stablehlo.all_reduce" : "stablehlo.reduce_scatter", &x, 1, &reg,
                   1, attrs, &ot, 1, &y);
      if (c->op == TPU_RED_AVG) y = tpu_avg(m, y, c->dtype, n);
      break;
    }
    case TPU_COLL_ALL_GATHER: {
      if (c->rank == 0) x = tpu_hlo_reshape(m, x, 1, (int64_t[]){1});
      snprintf(attrs, sizeof attrs, "all_gather_dim = 0 : i64, %s", groups);
      y = tpu_hlo_emit1(m, "stablehlo.all_gather", &x, 1, attrs, ot);
      break;
    }
    case TPU_COLL_ALL_TO_ALL:
      snprintf(attrs, sizeof attrs, "split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = %d : i64, %s",
               n, groups);
      y = tpu_hlo_emit1(m, "stablehlo.all_to_all", &x, 1, attrs, ot);
      break;
    case TPU_COLL_PERMUTE: {
      int k = snprintf(attrs, sizeof attrs, "source_target_pairs = dense<[");
      for (int i = 0; i < c->npairs; i++)
        k += snprintf(attrs + k, sizeof attrs - (size_t)k, "%s[%d, %d]", i ? ", " : "", c->pairs[i][0], c->pairs[i][1]);
      snprintf(attrs + k, sizeof attrs - (size_t)k, "]> : tensor<%dx2xi64>", c->npairs);
      if (c->npairs == 0) { /* no pair: every replica gets zeros */
        tpu_hv z = tpu_hlo_constant(m, c->dtype, 0);
        int64_t bd[TPU_MAX_RANK] = {0};
        y = tpu_hlo_broadcast_in_dim(m, z, orank, odims, bd);
      } else {
        y = tpu_hlo_emit1(m, "stablehlo.collective_permute", &x, 1, attrs, ot);
      }
      break;
    }
    case TPU_COLL_BROADCAST: {
      /* gathered whole, then the source's row: exact for every value */
      int64_t d1[TPU_MAX_RANK + 1], dn[TPU_MAX_RANK + 1];
      d1[0] = 1;
      dn[0] = n;
      for (int i = 0; i < c->rank; i++) d1[i + 1] = dn[i + 1] = c->dims[i];
      if (c->rank + 1 > TPU_MAX_RANK) {
        tpu_hlo_fail(m, TPU_ERR_VALUE, "broadcast: rank %d is over %d", c->rank, TPU_MAX_RANK - 1);
        break;
      }
      tpu_hv x1 = tpu_hlo_reshape(m, x, c->rank + 1, d1);
      snprintf(attrs, sizeof attrs, "all_gather_dim = 0 : i64, %s", groups);
      tpu_hv g = tpu_hlo_emit1(m, "stablehlo.all_gather", &x1, 1, attrs, tpu_hlo_type_make(c->dtype, c->rank + 1, dn));
      int64_t start[TPU_MAX_RANK] = {0}, limit[TPU_MAX_RANK], strides[TPU_MAX_RANK];
      for (int i = 0; i <= c->rank; i++) {
        limit[i] = d1[i];
        strides[i] = 1;
      }
      start[0] = c->src;
      limit[0] = c->src + 1;
      y = tpu_hlo_slice(m, g, start, limit, strides);
      y = tpu_hlo_reshape(m, y, c->rank, c->dims);
      break;
    }
    default: tpu_hlo_fail(m, TPU_ERR_VALUE, "unknown collective"); break;
  }
  tpu_hlo_type rt = tpu_buffer_type(c->dtype, orank, odims);
  tpu_hv r = tpu_hlo_reshape(m, y, rt.rank, rt.dims);
  tpu_status *s = tpu_hlo_finish(m, &r, 1, text, len);
  tpu_hlo_free(m);
  return s;
}

/* The compiled program of this text over n replicas (kept by the engine). */
static tpu_status *tpu_replica_exec(tpu_engine *e, char *text, size_t len, int n, tpu_rt_exec **exec) {
  for (int i = 0; i < TPU_RPROGS; i++) {
    struct tpu_rprog *p = &e->replica.progs[i];
    if (p->exec && p->len == len && memcmp(p->text, text, len) == 0) {
      atomic_fetch_add(&e->metrics.cache_hits, 1);
      free(text);
      *exec = p->exec;
      return NULL;
    }
  }
  atomic_fetch_add(&e->metrics.cache_misses, 1);
  int64_t t0 = tpu_now_ns();
  tpu_rt_compile_opts o = {.replicas = n, .partitions = 1};
  /* one replica: a one-device program, run where its argument is */
  tpu_status *s = n == 1 ? tpu_rt_compile(e->rt, text, len, exec) : tpu_rt_compile_with(e->rt, text, len, &o, exec);
  atomic_fetch_add(&e->metrics.compile_ns, tpu_now_ns() - t0);
  atomic_fetch_add(&e->metrics.programs_compiled, 1);
  if (e->dump_hlo || (s && e->debug)) fprintf(stderr, "%s\n", text);
  if (!s && (s = tpu_engine_aot_compile(e, text, len, "a replica collective", n == 1 ? NULL : &o))) {
    tpu_rt_exec_free(*exec);
    *exec = NULL;
  }
  if (s) {
    free(text);
    return s;
  }
  struct tpu_rprog *p = &e->replica.progs[e->replica.next];
  e->replica.next = (e->replica.next + 1) % TPU_RPROGS;
  free(p->text);
  tpu_rt_exec_free(p->exec);
  *p = (struct tpu_rprog){text, len, *exec};
  return NULL;
}

void tpu_replica_release(tpu_engine *e) {
  for (int i = 0; i < TPU_RPROGS; i++) {
    free(e->replica.progs[i].text);
    tpu_rt_exec_free(e->replica.progs[i].exec);
    e->replica.progs[i] = (struct tpu_rprog){0};
  }
}

tpu_status *tpu_engine_replica_collective(tpu_engine *e, const tpu_collective *c, tpu_record *const *ins, int n,
                                          tpu_record **outs) {
  for (int i = 0; i < n; i++) outs[i] = NULL;
  int orank;
  int64_t odims[TPU_MAX_RANK];
  tpu_status *s = tpu_collective_check(c, n, &orank, odims);
  if (s) return s;
  const char *name = tpu_coll_names[c->kind];
  if (!e->rt) return tpu_status_new(TPU_ERR_RUNTIME, "%s: the runtime has not started", name);
  int ndev = tpu_rt_device_count(e->rt);
  if (n > ndev) return tpu_status_new(TPU_ERR_VALUE, "%s: %d tensors for %d local devices", name, n, ndev);
  int64_t numel = tpu_shape_numel(c->rank, c->dims);
  bool pending = false;
  for (int i = 0; i < n; i++) {
    const tpu_record *r = ins[i];
    if (r->device != i)
      return tpu_status_new(TPU_ERR_VALUE, "%s: tensor %d is on tpu:%d; tensor i of the list must be on tpu:i", name, i,
                            r->device);
    if (r->dtype != c->dtype)
      return tpu_status_new(TPU_ERR_TYPE, "%s: tensor %d has dtype %s, expected %s", name, i, tpu_dtype_name(r->dtype),
                            tpu_dtype_name(c->dtype));
    if (r->numel != numel)
      return tpu_status_new(TPU_ERR_VALUE, "%s: tensor %d has %lld elements, expected %lld", name, i,
                            (long long)r->numel, (long long)numel);
    if (r->freed) return tpu_status_new(TPU_ERR_RUNTIME, "%s: the memory of tensor %d was freed", name, i);
    /* one program takes every replica's buffer: the storages must have been made alike */
    tpu_hlo_type t0 = tpu_record_type(ins[0]), ti = tpu_record_type(r);
    if (!tpu_hlo_type_eq(&t0, &ti)) {
      char a[128], b[128];
      tpu_hlo_type_str(&ti, a, sizeof a);
      tpu_hlo_type_str(&t0, b, sizeof b);
      return tpu_status_new(TPU_ERR_VALUE,
                            "%s: the storage of tensor %d was made as %s and that of tensor 0 as %s; pass tensors "
                            "whose storages were made alike (clone() each)",
                            name, i, a, b);
    }
    if (atomic_load(&r->graph_refs) > 0) pending = true;
  }
  if (pending && (s = tpu_engine_flush(e, TPU_FLUSH_SYNC))) return s; /* recorded ops write an input: they run first */
  for (int i = 0; i < n; i++)
    if ((s = tpu_record_materialize(e, ins[i]))) return s;
  char *text = NULL;
  size_t len = 0;
  tpu_hlo_type it = tpu_record_type(ins[0]);
  if ((s = tpu_replica_text(c, n, &it, orank, odims, &text, &len)))
    return tpu_status_prefix(s, "%s: building the program", name);
  tpu_rt_exec *exec = NULL;
  if ((s = tpu_replica_exec(e, text, len, n, &exec))) return tpu_status_prefix(s, "%s: compiling", name);
  tpu_rt_buffer *args[TPU_MAX_REPLICAS], *res[TPU_MAX_REPLICAS] = {0};
  for (int i = 0; i < n; i++) {
    if (tpu_rt_exec_row_device(exec, i) != i)
      return tpu_status_new(TPU_ERR_RUNTIME, "%s: replica %d runs on device %d, not %d", name, i,
                            tpu_rt_exec_row_device(exec, i), i);
    args[i] = ins[i]->buf;
  }
  for (int i = 0; i < n; i++)
    if (!(outs[i] = tpu_record_new_shaped(e, i, c->dtype, orank, odims))) {
      for (int j = 0; j < i; j++) tpu_record_unref(outs[j]), outs[j] = NULL;
      return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    }
  int64_t t0 = tpu_now_ns(), p0 = tpu_prof_t0();
  s = n == 1 ? tpu_rt_execute(e->rt, exec, args, 1, res) : tpu_rt_execute_rows(e->rt, exec, args, 1, res);
  if (p0 && !s) tpu_prof_rows(exec, p0, name);
  atomic_fetch_add(&e->metrics.execute_ns, tpu_now_ns() - t0);
  if (s) {
    for (int i = 0; i < n; i++) {
      tpu_rt_buffer_free(res[i]);
      tpu_record_unref(outs[i]);
      outs[i] = NULL;
    }
    return tpu_status_prefix(s, "%s", name);
  }
  for (int i = 0; i < n; i++) outs[i]->buf = res[i];
  atomic_fetch_add(&e->metrics.replica_colls, 1);
  return NULL;
}
