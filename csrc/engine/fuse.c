/* fuse.c: fused mode.
 *
 * Ops are recorded (a deep copy of their arguments and their plans; their
 * outputs are records without buffers) until a sync point flushes them: the
 * ops nobody needs are dropped, the rest are keyed by their signatures and
 * how values flow between them, and lowered into one program (or found in
 * the cache), which computes the final value of every record still held.
 */
#define _POSIX_C_SOURCE 200809L
#include "fuse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

/* A recorded op making a new value of at least this many bytes keeps where
 * Python called it (tpu_fuse_blame names it when a program runs out of memory). */
#define TPU_SITE_BYTES ((int64_t)64 << 20)

/* The recorded ops' names for the TPU report's name of the flush (aot_target.c):
 * the first three distinct ones, then "..." when there are others. */
static void tpu_fuse_ops_named(tpu_engine *e) {
  char *w = e->aot.what;
  size_t cap = sizeof e->aot.what, n = 0;
  w[0] = 0;
  if (!e->aot.target) return;
  const tpu_op_row *listed[3];
  int nl = 0;
  for (int i = 0; i < e->fuse.nnodes; i++) {
    const tpu_op_row *row = e->fuse.nodes[i].row;
    bool seen = false;
    for (int k = 0; k < nl; k++) seen = seen || listed[k] == row;
    if (seen) continue;
    if (nl == 3 || n + strlen(row->name) + 8 > cap) {
      snprintf(w + n, cap - n, ", ...");
      return;
    }
    n += (size_t)snprintf(w + n, cap - n, "%s%s", nl ? ", " : "", row->name);
    listed[nl++] = row;
  }
}

/* ---- fused mode ------------------------------------------------------------------ */

static void tpu_graph_ref(tpu_record *r) {
  tpu_record_ref(r);
  atomic_fetch_add(&r->graph_refs, 1);
}

static void tpu_graph_unref(tpu_record *r) {
  atomic_fetch_sub(&r->graph_refs, 1);
  tpu_record_unref(r);
}

/* Something besides the recording holds the record (a tensor, a result
 * being returned): its final value must be computed. */
static bool tpu_record_live(tpu_record *r) { return atomic_load(&r->refs) > atomic_load(&r->graph_refs); }

static void tpu_node_release(tpu_node *n) {
  for (int i = 0; i < n->nargs; i++) {
    tpu_arg *a = &n->args[i];
    if (a->kind == TPU_ARG_TENSOR && a->t.rec) tpu_graph_unref(a->t.rec);
    if (a->kind == TPU_ARG_TENSORS)
      for (int j = 0; j < a->nlist; j++)
        if (a->list[j].rec) tpu_graph_unref(a->list[j].rec);
  }
  for (int j = 0; j < n->nnew; j++) tpu_graph_unref(n->outrec[j]);
  free(n->args); /* the node's one block: args, lists, outrec, sig */
  free(n->site);
}

void tpu_nodes_release(tpu_engine *e) {
  for (int i = 0; i < e->fuse.nnodes; i++) tpu_node_release(&e->fuse.nodes[i]);
  e->fuse.nnodes = 0;
  e->fuse.fe_first = 0; /* a foreach call's later items start the next recording */
}

void tpu_fuse_free(tpu_engine *e) {
  tpu_nodes_release(e);
  free(e->fuse.nodes);
  e->fuse.nodes = NULL;
  e->fuse.capnodes = 0;
}

/* A copy of the Python site of a fused program's check, while its recorded
 * ops are at hand (a flush; a plan's replay passes no tpu_site_fn). */
static char *tpu_fcheck_site(const tpu_engine *e, const tpu_fcheck *w) {
  const char *s = w->node >= 0 && w->node < e->fuse.nnodes ? e->fuse.nodes[w->node].site : NULL;
  return s ? strdup(s) : NULL;
}


void tpu_engine_foreach(tpu_engine *e, bool begin) {
  if (begin && !++e->fuse.fe_groups) e->fuse.fe_groups = 1; /* 0 means no call */
  e->fuse.fe_group = begin ? e->fuse.fe_groups : 0;
  e->fuse.fe_first = e->fuse.nnodes;
}

/* A Python number that the group's first node of the same op takes in the
 * same place with the same bits (the same scalar passed with every tensor of
 * a foreach list, or equal items of a scalar list) is read from that node's
 * program input. Equal bits are what makes sharing right; the flush's key
 * holds the choice, so a step that shares differently is another program. */
static void tpu_node_share(const tpu_engine *e, tpu_node *n) {
  for (int j = e->fuse.fe_first; j < e->fuse.nnodes; j++) {
    const tpu_node *p = &e->fuse.nodes[j];
    if (p->group != n->group || p->op_id != n->op_id || p->nargs != n->nargs) continue;
    for (int a = 0; a < n->nargs; a++) {
      if (n->args[a].kind != TPU_ARG_SCALAR || p->args[a].kind != TPU_ARG_SCALAR) continue;
      uint8_t x[16], y[16];
      if (tpu_scalar_bits(&n->args[a], x) == tpu_scalar_bits(&p->args[a], y) && !memcmp(x, y, sizeof x))
        n->share |= 1u << a;
    }
    n->share_from = j;
    return;
  }
}

/* Record one op: its outputs are new records without buffers, returned at
 * once; nothing runs. */
tpu_status *tpu_engine_record(tpu_engine *e, const tpu_op_row *row, int op_id, tpu_arg *args, int nargs,
                              const tpu_sig *sig, tpu_cache_entry *c, tpu_engine_result *res) {
  if (e->fuse.nnodes >= e->fuse.cap || (e->fuse.nnodes && e->fuse.dev != e->dev)) {
    /* A fused program runs on one device: ops of another run first. */
    tpu_status *s = tpu_engine_flush(e, e->fuse.nnodes >= e->fuse.cap ? TPU_FLUSH_CAP : TPU_FLUSH_DEVICE);
    if (s) return s;
  }
  e->fuse.dev = e->dev;
  if (e->fuse.nnodes == e->fuse.capnodes) {
    int cap = e->fuse.capnodes ? 2 * e->fuse.capnodes : 256;
    tpu_node *g = realloc(e->fuse.nodes, sizeof *g * (size_t)cap);
    if (!g) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    e->fuse.nodes = g;
    e->fuse.capnodes = cap;
  }
  tpu_node *n = &e->fuse.nodes[e->fuse.nnodes];
  memset(n, 0, sizeof *n);
  int nnew = 0;
  for (int k = 0; k < c->nout; k++) nnew += c->out[k].kind == TPU_OUT_NEW;
  /* One block per node (ops are recorded by the hundred per step): the
   * arguments, their tensor lists, the output records, the signature. */
  size_t nlist = 0;
  for (int i = 0; i < nargs; i++)
    if (args[i].kind == TPU_ARG_TENSORS) nlist += (size_t)args[i].nlist;
  size_t at = sizeof(tpu_arg) * (size_t)nargs, lt = sizeof(tpu_tref) * nlist, ot = sizeof(tpu_record *) * (size_t)nnew;
  uint8_t *block = malloc(at + lt + ot + sig->n + 1);
  if (!block) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  n->args = (tpu_arg *)block;
  tpu_tref *lists = (tpu_tref *)(block + at);
  n->outrec = (tpu_record **)(block + at + lt);
  n->sig = block + at + lt + ot;
  for (int i = 0; i < nargs; i++) tpu_arg_copy(&n->args[i], &args[i]);
  if (nnew) memset(n->outrec, 0, ot);
  for (int i = 0; i < nargs; i++) {
    tpu_arg *a = &n->args[i];
    if (a->kind != TPU_ARG_TENSORS) continue;
    for (int j = 0; j < a->nlist; j++) tpu_tref_copy(&lists[j], &args[i].list[j]);
    a->list = lists;
    lists += a->nlist;
  }
  n->row = row;
  n->op_id = op_id;
  n->nargs = nargs;
  memcpy(n->sig, sig->p, sig->n);
  n->siglen = sig->n;
  n->group = e->fuse.fe_group;
  if (n->group) tpu_node_share(e, n);
  for (int i = 0; i < nargs; i++) {
    tpu_arg *a = &n->args[i];
    if (a->kind == TPU_ARG_TENSOR && a->t.rec) tpu_graph_ref(a->t.rec);
    if (a->kind == TPU_ARG_TENSORS)
      for (int j = 0; j < a->nlist; j++)
        if (a->list[j].rec) tpu_graph_ref(a->list[j].rec);
  }
  for (int k = 0; k < c->nout; k++) {
    const tpu_out_plan *o = &c->out[k];
    if (o->kind != TPU_OUT_NEW) continue;
    tpu_record *r = tpu_record_new_shaped(e, e->dev, o->type.dtype, o->type.rank, o->type.dims);
    if (!r) {
      n->nnew = res->nout;
      tpu_node_release(n);
      tpu_engine_result_release(res);
      return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    }
    tpu_graph_ref(r);
    n->outrec[res->nout] = r;
    res->outs[res->nout] = r; /* the caller's reference */
    tpu_hlo_type_copy(&res->types[res->nout], &o->type);
    res->nout++;
  }
  n->nnew = nnew;
  if (e->where && e->value_checks && !e->fuse.capturing)
    for (int k = 0; k < c->nout && !n->site; k++)
      if (c->out[k].kind == TPU_OUT_CHECK) n->site = e->where();
  /* An op making a large value (a new one, or one written in place that
   * has no buffer yet: ones() is empty() and fill_) notes where Python
   * called it (one walk of the frames, small beside the value's own cost):
   * running out of memory names it (tpu_fuse_blame). */
  if (e->where && !e->fuse.capturing && !n->site) {
    int64_t most = 0;
    for (int j = 0; j < nnew; j++)
      if (n->outrec[j] && n->outrec[j]->numel * (int64_t)tpu_dtype_size(n->outrec[j]->dtype) > most)
        most = n->outrec[j]->numel * (int64_t)tpu_dtype_size(n->outrec[j]->dtype);
    for (int a = 0; a < nargs; a++) {
      const tpu_record *r = n->args[a].kind == TPU_ARG_TENSOR ? n->args[a].t.rec : NULL;
      if (r && !r->buf && !r->shards && r->numel * (int64_t)tpu_dtype_size(r->dtype) > most)
        most = r->numel * (int64_t)tpu_dtype_size(r->dtype);
    }
    if (most >= TPU_SITE_BYTES) n->site = e->where();
  }
  n->rng_seed = e->rng_seed; /* a seed set before the flush is for later ops */
  n->rng_offset = e->rng_offset;
  e->rng_offset += (uint64_t)c->rng_words;
  res->nret = c->nret;
  memcpy(res->ret, c->ret, sizeof(tpu_ret_plan) * (size_t)c->nret);
  e->fuse.nnodes++;
  return NULL;
}

/* The flush's state, seen by the lowering hooks. */
typedef struct {
  tpu_fin *fin; /* owned until moved into the cache entry */
  int nfin, capfin;
  int node; /* the op being lowered */
  bool oom;
  const tpu_sharding *mesh; /* a program over this mesh (spmd.c), or NULL */
  tpu_hv *chk;              /* owned: the ops' value checks */
  tpu_fcheck *chkw;         /* owned until moved into the cache entry: their errors */
  int nchk, capchk;
} tpu_fuse_ctx;

static void tpu_fuse_add(tpu_fuse_ctx *x, tpu_fin f) {
  if (x->nfin == x->capfin) {
    int cap = x->capfin ? 2 * x->capfin : 64;
    tpu_fin *g = realloc(x->fin, sizeof *g * (size_t)cap);
    if (!g) {
      x->oom = true;
      return;
    }
    x->fin = g;
    x->capfin = cap;
  }
  x->fin[x->nfin++] = f;
}

static tpu_hv tpu_fuse_record_hook(tpu_lower *L, tpu_record *rec) {
  tpu_fuse_ctx *x = L->fuse;
  if (rec->fuse_val != TPU_HV_NONE) return rec->fuse_val;
  tpu_fuse_add(x, (tpu_fin){TPU_IN_RECORD, x->node, -1, -1, rec->fuse_id});
  /* the parameter in the shape of the record's buffer (its global shape over
   * a mesh), read flat */
  int64_t n = rec->numel;
  rec->fuse_param = tpu_hlo_param(L->hlo, tpu_record_type(rec));
  if (x->mesh) { /* over a mesh: a mesh record split; others given whole to each device */
    tpu_sharding rep = tpu_sharding_make(x->mesh->mesh_rank, x->mesh->mesh, rec->grank, NULL);
    tpu_hlo_param_sharding(L->hlo, rec->fuse_param, rec->sh ? rec->sh : &rep);
  }
  rec->fuse_val = rec->grank == 1 ? rec->fuse_param : tpu_hlo_reshape(L->hlo, rec->fuse_param, 1, &n);
  return rec->fuse_val;
}

static void tpu_fuse_input_hook(tpu_lower *L, tpu_in_kind kind, int arg, int item) {
  tpu_fuse_ctx *x = L->fuse;
  tpu_fuse_add(x, (tpu_fin){kind, x->node, arg, item, -1});
}


static int tpu_fuse_id(tpu_rectab *t, tpu_record *r, uint64_t epoch) {
  if (r->fuse_epoch == epoch) return r->fuse_id;
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 128;
    tpu_record **g = realloc(t->r, sizeof *g * (size_t)cap);
    if (!g) {
      t->oom = true;
      return -1;
    }
    t->r = g;
    t->cap = cap;
  }
  r->fuse_epoch = epoch;
  r->fuse_id = t->n;
  r->fuse_val = r->fuse_param = TPU_HV_NONE;
  r->fuse_def = r->fuse_new = r->fuse_has_sh = false;
  t->r[t->n++] = r;
  return r->fuse_id;
}

/* Lowers the recorded ops into one program (compiled through the cache
 * tiers) and builds the entry that says how to feed and unpack it. */
static tpu_status *tpu_fuse_lower(tpu_engine *e, tpu_rectab *tab, const tpu_sig *sig, uint64_t h,
                                  tpu_cache_entry **out) {
  *out = NULL;
  tpu_fuse_ctx x = {0};
  tpu_hlo *H = tpu_hlo_new();
  if (!H) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  tpu_hlo_set_exact_division(H, e->exact_div);
  tpu_status *s = tpu_spmd_mesh(tab, &x.mesh);
  if (s) {
    tpu_hlo_free(H);
    return s;
  }
  if (x.mesh) tpu_hlo_set_mesh(H, e->shardy ? TPU_HLO_SHARDY : TPU_HLO_GSPMD, x.mesh->mesh_rank, x.mesh->mesh, NULL);
  for (int i = 0; i < e->fuse.nnodes && tpu_hlo_ok(H); i++) {
    tpu_node *n = &e->fuse.nodes[i];
    tpu_lower L;
    memset(&L, 0, sizeof L);
    L.hlo = H;
    L.args = n->args;
    L.nargs = n->nargs;
    L.opname = n->row->name;
    L.flags = n->row->flags;
    L.rng_state = TPU_HV_NONE;
    L.precision = e->precision;
    L.value_checks = e->value_checks;
    L.static_offsets = x.mesh != NULL;
    L.fuse = &x;
    L.fn_lookup = tpu_engine_fn_lookup;
    L.fn_ctx = e;
    L.fuse_record = tpu_fuse_record_hook;
    L.fuse_input = tpu_fuse_input_hook;
    x.node = i;
    L.tpu_like = e->tpu_like;
    tpu_hv shared[TPU_MAX_ARGS], shared32[TPU_MAX_ARGS];
    if (n->share) {
      const tpu_node *p = &e->fuse.nodes[n->share_from];
      for (int a = 0; a < n->nargs; a++) {
        shared[a] = n->share >> a & 1 ? p->args[a].value : TPU_HV_NONE;
        shared32[a] = n->share >> a & 1 ? p->args[a].value32 : TPU_HV_NONE;
      }
      L.shared = shared;
      L.shared32 = shared32;
    }
    tpu_lower_run(&L, n->row);
    if (!tpu_hlo_ok(H)) break;
    int j = 0;
    for (int k = 0; k < L.nout; k++) {
      tpu_record *r = NULL;
      if (L.out[k].kind == TPU_OUT_CHECK) {
        if (x.nchk == x.capchk) {
          int cap = x.capchk ? 2 * x.capchk : 8;
          tpu_hv *a = realloc(x.chk, sizeof *a * (size_t)cap);
          if (a) x.chk = a;
          tpu_fcheck *w = a ? realloc(x.chkw, sizeof *w * (size_t)cap) : NULL;
          if (w) x.chkw = w;
          if (!a || !w) {
            x.oom = true;
            continue;
          }
          x.capchk = cap;
        }
        x.chk[x.nchk] = L.outv[k];
        x.chkw[x.nchk++] = (tpu_fcheck){n->row->name, L.out[k].msg, L.out[k].arg, i};
        continue;
      }
      if (L.out[k].kind == TPU_OUT_WRITE) {
        tpu_in_plan p = {TPU_IN_RECORD, L.out[k].arg, L.out[k].item};
        r = tpu_arg_tref(n->args, &p)->rec;
      } else if (L.out[k].kind == TPU_OUT_NEW && j < n->nnew) {
        r = n->outrec[j++];
        if (r) r->fuse_new = true;
        if (r && n->op_id == TPU_OP_tpu_spmd_constraint && n->args[2].nints <= TPU_MAX_RANK) {
          int8_t axes[TPU_MAX_RANK];
          for (int a = 0; a < n->args[2].nints; a++) axes[a] = (int8_t)n->args[2].ints[a];
          r->fuse_sh = tpu_sharding_make(n->args[1].nints, n->args[1].ints, n->args[2].nints, axes);
          r->fuse_has_sh = true;
        }
      }
      if (!r) continue;
      r->fuse_val = L.outv[k];
      r->fuse_def = true;
    }
  }
  int nres = 0;
  tpu_hv *res = malloc(sizeof *res * (size_t)(tab->n + x.nchk + 1));
  int *fout = malloc(sizeof *fout * (size_t)(tab->n ? tab->n : 1));
  tpu_sharding *fsh = x.mesh ? malloc(sizeof *fsh * (size_t)(tab->n ? tab->n : 1)) : NULL;
  int64_t (*fdims)[TPU_MAX_RANK] = x.mesh ? malloc(sizeof *fdims * (size_t)(tab->n ? tab->n : 1)) : NULL;
  /* prop[k]: XLA's partitioner chooses result k's layout (see tpu_spmd_choose) */
  bool *prop = x.mesh ? calloc((size_t)(tab->n + x.nchk + 1), sizeof *prop) : NULL;
  int nprop = 0;
  if (!res || !fout || x.oom || (x.mesh && (!fsh || !fdims || !prop)))
    s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  for (int k = 0; k < tab->n && !s; k++) {
    tpu_record *r = tab->r[k];
    if (r->fuse_def && tpu_record_live(r)) {
      /* A record read and rewritten (a parameter, an optimizer moment) gives
       * its old buffer to the program for the new value: no copy, no second
       * buffer. */
      bool alias = r->fuse_param != TPU_HV_NONE && e->donate && (!x.mesh || r->sh);
      if (alias) tpu_hlo_param_alias(H, r->fuse_param, nres);
      /* the value in the shape of the record's buffer (its global shape over a mesh) */
      res[nres] = r->grank == 1 ? r->fuse_val : tpu_hlo_reshape(H, r->fuse_val, r->grank, r->gdims);
      if (x.mesh) { /* laid out as spmd.c chooses */
        fsh[nres] = tpu_spmd_choose(tab, x.mesh, r);
        memcpy(fdims[nres], r->gdims, sizeof(int64_t) * (size_t)r->grank);
        prop[nres] = tpu_spmd_chosen_by_xla(r);
        if (prop[nres])
          nprop++;
        else
          tpu_hlo_result_sharding(H, nres, &fsh[nres]);
      }
      fout[nres++] = k;
    }
  }
  /* the value checks follow the records (none when no value is live) */
  int nchk = nres ? x.nchk : 0;
  for (int k = 0; k < nchk && !s; k++) {
    res[nres + k] = x.chk[k];
    if (x.mesh) {
      tpu_sharding rep = tpu_sharding_make(x.mesh->mesh_rank, x.mesh->mesh, 0, NULL);
      tpu_hlo_result_sharding(H, nres + k, &rep);
    }
  }
  free(x.chk);
  char *text = NULL;
  size_t len = 0;
  if (!s) s = tpu_hlo_finish(H, res, nres + nchk, &text, &len);
  if (!s && e->dump_hlo) fprintf(stderr, "-- fused program of %d ops\n%s\n", e->fuse.nnodes, text);
  tpu_rt_exec *exec = NULL;
  if (!s && nres) {
    char label[96];
    snprintf(label, sizeof label, "a fused program of %d ops", e->fuse.nnodes);
    int rows = x.mesh ? (int)tpu_sharding_num_devices(x.mesh) : 1;
    tpu_rt_compile_opts o = {.replicas = 1, .partitions = rows, .spmd = true, .shardy = e->shardy};
    o.propagate = nprop ? prop : NULL;
    o.npropagate = nprop ? nres + nchk : 0;
    if (x.mesh) snprintf(label, sizeof label, "a program of %d ops over %d devices", e->fuse.nnodes, rows);
    tpu_fuse_ops_named(e);
    /* on a compile-only mesh (spmd.c) the TPU compiler's program is the only one */
    bool only = x.mesh && tpu_engine_mesh_compile_only(e);
    tpu_rt_module opt = {0};
    s = only ? tpu_engine_aot_compile_only(e, text, len, label, &o, &opt)
             : tpu_engine_compile_with(e, text, len, label, x.mesh ? &o : NULL, &exec);
    if (!s && nprop && !tpu_spmd_read_layouts(e, exec, &opt, x.mesh, nres, nres + nchk, fdims, prop, fsh)) {
      /* a layout a tpu_sharding cannot say: the program again, with the
       * rule's layouts declared */
      for (int k = 0; k < nres; k++)
        if (prop[k]) tpu_hlo_result_sharding(H, k, &fsh[k]);
      tpu_rt_exec_free(exec);
      exec = NULL;
      free(opt.bytes);
      opt.bytes = NULL;
      free(text);
      text = NULL;
      s = tpu_hlo_finish(H, res, nres + nchk, &text, &len);
      o.propagate = NULL;
      o.npropagate = 0;
      if (!s)
        s = only ? tpu_engine_aot_compile_only(e, text, len, label, &o, &opt)
                 : tpu_engine_compile_with(e, text, len, label, &o, &exec);
      atomic_fetch_add(&e->metrics.spmd_layout_fallbacks, 1);
    }
    free(opt.bytes);
    e->aot.what[0] = 0;
  }
  tpu_hlo_free(H);
  free(res);
  free(prop);
  free(text);
  tpu_cache_entry *c = s ? NULL : calloc(1, sizeof *c);
  if (!s && (!c || !(c->key = malloc(sig->n)))) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (s) {
    free(c);
    free(fsh);
    free(fdims);
    free(fout);
    free(x.fin);
    free(x.chkw);
    tpu_rt_exec_free(exec);
    return s;
  }
  memcpy(c->key, sig->p, sig->n);
  c->keylen = sig->n;
  c->hash = h;
  c->exec = exec;
  c->aot = nres ? e->aot.last : -1;
  c->fin = x.fin;
  c->nfin = x.nfin;
  c->fout = fout;
  c->nfout = nres;
  c->fchk = x.chkw;
  c->nfchk = nchk;
  c->spmd = x.mesh != NULL;
  c->spmd_rows = x.mesh ? (int)tpu_sharding_num_devices(x.mesh) : 1;
  c->fsh = fsh;
  c->fdims = fdims;
  if (!tpu_cache_insert(e, c)) {
    tpu_cache_entry_free(c);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  *out = c;
  return NULL;
}

/* A fused program failed to run (out of memory, most often): the error names
 * the recorded op that makes its largest value, and where Python called it
 * when that is known. */
static tpu_status *tpu_fuse_blame(tpu_engine *e, tpu_status *s) {
  const tpu_node *big = NULL;
  int64_t most = -1;
  for (int i = 0; i < e->fuse.nnodes; i++) { /* the records the program makes: no buffer yet */
    const tpu_node *n = &e->fuse.nodes[i];
    for (int a = 0; a < n->nargs; a++) {
      const tpu_arg *g = &n->args[a];
      int m = g->kind == TPU_ARG_TENSOR ? 1 : g->kind == TPU_ARG_TENSORS ? g->nlist : 0;
      for (int j = 0; j < m; j++) {
        const tpu_record *r = g->kind == TPU_ARG_TENSOR ? g->t.rec : g->list[j].rec;
        int64_t bytes = r && !r->buf && !r->shards ? r->numel * (int64_t)tpu_dtype_size(r->dtype) : -1;
        if (bytes > most) most = bytes, big = n;
      }
    }
    for (int j = 0; j < n->nnew; j++) {
      const tpu_record *r = n->outrec[j];
      int64_t bytes = r ? r->numel * (int64_t)tpu_dtype_size(r->dtype) : -1;
      if (bytes > most) most = bytes, big = n;
    }
  }
  if (!big) return tpu_status_prefix(s, "running a fused program of %d ops", e->fuse.nnodes);
  char human[32];
  tpu_bytes_str(most, human, sizeof human);
  return tpu_status_prefix(s, "running a fused program of %d ops (its largest value, %s, made by aten::%s%s%s)",
                           e->fuse.nnodes, human, big->row->name, big->site ? ", called from:\n" : "",
                           big->site ? big->site : "");
}

/* Runs a fused program over a mesh (spmd.c): row d's inputs are the mesh
 * records' shards on device d and copies of everything else; the outputs
 * become the records' shards. */
static tpu_status *tpu_fuse_run_spmd(tpu_engine *e, tpu_cache_entry *c, tpu_rectab *tab) {
  int nin = c->nfin, rows = c->spmd_rows;
  size_t ni = (size_t)rows * (size_t)(nin ? nin : 1);
  tpu_rt_buffer **in = calloc(ni, sizeof *in), **own = calloc(ni, sizeof *own);
  tpu_status *s = (!in || !own) ? tpu_status_new(TPU_ERR_MEMORY, "out of memory") : NULL;
  int call_dev = e->dev;
  e->launch.epoch++;
  /* no program to run on a compile-only mesh: no inputs either */
  for (int k = 0; k < nin && !s && c->exec; k++) {
    const tpu_fin *f = &c->fin[k];
    tpu_node *n = &e->fuse.nodes[f->node];
    tpu_record *r = f->kind == TPU_IN_RECORD ? tab->r[f->rec] : NULL;
    if (r) {
      for (int d = 0; d < rows && !s; d++) s = tpu_spmd_record_input(e, r, d, &in[d * nin + k], &own[d * nin + k]);
      continue;
    }
    tpu_in_plan p = {f->kind, f->arg, f->item};
    for (int d = 0; d < rows && !s; d++) {
      e->dev = d;
      s = tpu_input_buffer(e, &p, n->args, NULL, n->rng_seed, n->rng_offset, &in[d * nin + k], &own[d * nin + k]);
    }
  }
  e->dev = call_dev;
  if (s) s = tpu_status_prefix(s, "running a program over %d devices (an input)", rows);
  tpu_record **dst = s ? NULL : malloc(sizeof *dst * (size_t)(c->nfout ? c->nfout : 1));
  if (!s && !dst) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  for (int k = 0; k < c->nfout && !s; k++) dst[k] = tab->r[c->fout[k]];
  if (!s) s = tpu_spmd_launch(e, c, in, dst, tpu_fcheck_site);
  if (!s) {
    atomic_fetch_add(&e->metrics.fused_programs, 1);
    atomic_fetch_add(&e->metrics.fused_ops, e->fuse.nnodes);
  }
  free(dst);
  for (size_t k = 0; k < ni && own; k++) tpu_rt_buffer_free(own[k]);
  free(in);
  free(own);
  return s;
}

/* Feeds and runs a fused program; its outputs become the records' buffers. */
tpu_status *tpu_fuse_run(tpu_engine *e, tpu_cache_entry *c, tpu_rectab *tab) {
  if (!c->nfout) return NULL; /* every value it would compute is dead */
  if (c->spmd) return tpu_fuse_run_spmd(e, c, tab);
  int nin = c->nfin;
  tpu_rt_buffer **inbuf = calloc((size_t)nin + 1, sizeof *inbuf);
  tpu_rt_buffer **temps = calloc((size_t)nin + 1, sizeof *temps);
  tpu_rt_buffer **outbuf = calloc((size_t)(c->nfout + c->nfchk), sizeof *outbuf);
  tpu_status *s = (!inbuf || !temps || !outbuf) ? tpu_status_new(TPU_ERR_MEMORY, "out of memory") : NULL;
  int ntemp = 0;
  e->launch.epoch++;
  for (int k = 0; k < nin && !s; k++) {
    const tpu_fin *f = &c->fin[k];
    tpu_node *n = &e->fuse.nodes[f->node];
    tpu_in_plan p = {f->kind, f->arg, f->item};
    tpu_record *r = f->kind == TPU_IN_RECORD ? tab->r[f->rec] : NULL;
    s = tpu_input_buffer(e, &p, n->args, r, n->rng_seed, n->rng_offset, &inbuf[k], &temps[ntemp]);
    if (s)
      s = tpu_status_prefix(s, "running a fused program of %d ops (an input of aten::%s)", e->fuse.nnodes,
                            n->row->name);
    else if (temps[ntemp])
      ntemp++;
  }
  if (!s) {
    s = tpu_engine_launch(e, c->exec, inbuf, nin, outbuf, NULL, e->fuse.nnodes);
    if (!s) tpu_engine_aot_ran(e, c->aot);
    if (s) s = tpu_fuse_blame(e, s);
  }
  for (int k = 0; k < ntemp; k++) tpu_rt_buffer_free(temps[k]);
  if (!s) {
    for (int k = 0; k < c->nfout; k++) {
      tpu_record *r = tab->r[c->fout[k]];
      tpu_rt_buffer_free(r->buf);
      r->buf = outbuf[k];
    }
    for (int k = 0; k < c->nfchk; k++)
      tpu_check_push(e, outbuf[c->nfout + k], c->fchk[k], tpu_fcheck_site(e, &c->fchk[k]));
    atomic_fetch_add(&e->metrics.fused_programs, 1);
    atomic_fetch_add(&e->metrics.fused_ops, e->fuse.nnodes);
  }
  free(inbuf);
  free(temps);
  free(outbuf);
  return s;
}

/* A fused program was compiled (recompiles explained): when a program for the
 * same ops is in the cache, say which part of the key differs. */
static void tpu_fuse_explain(tpu_engine *e, tpu_cache_entry *c, const uint64_t ex[4]) {
  memcpy(c->ex, ex, sizeof c->ex);
  c->ex_nodes = e->fuse.nnodes;
  /* of the programs for the same ops, the closest one (fewest parts of the
   * key differ): the explanation does not depend on where the cache put them */
  const tpu_cache_entry *old = NULL;
  int best = 4;
  for (size_t i = 0; i < e->cache.cap; i++) {
    const tpu_cache_entry *o = e->cache.entries[i];
    if (!o || o == c || o->ex_nodes != c->ex_nodes || o->ex[0] != ex[0]) continue;
    int d = (o->ex[1] != ex[1]) + (o->ex[2] != ex[2]) + (o->ex[3] != ex[3]);
    if (d < best) best = d, old = o;
  }
  if (!old) return;
  const char *parts[3];
  int np = 0;
  if (old->ex[1] != ex[1]) parts[np++] = "which tensors the ops read and write";
  if (old->ex[2] != ex[2]) parts[np++] = "which numbers of a torch._foreach_* call are equal";
  if (old->ex[3] != ex[3])
    parts[np++] =
        "which of the tensors it computes are still held when it runs (one kept in one step and not in another)";
  char what[512] = "";
  for (int k = 0, o = 0; k < np; k++) o += snprintf(what + o, sizeof what - (size_t)o, "%s%s", k ? "; " : "", parts[k]);
  char *note = np ? tpu_strfmt(
                        "torchtpu: recompiling a fused program of %d ops (the same ops were compiled before "
                        "into another program): %s differs",
                        e->fuse.nnodes, what)
                  : tpu_strfmt(
                        "torchtpu: recompiling a fused program of %d ops compiled before with the same inputs "
                        "(the program cache was emptied, or the matmul precision changed)",
                        e->fuse.nnodes);
  tpu_msgs_note(&e->msgs, note);
}

/* Whether node n names a record marked needed in this flush (epoch), and if
 * mark, marks all it names. */
static bool tpu_node_needs(tpu_node *n, uint64_t epoch, bool mark) {
  bool hit = false;
  for (int a = 0; a < n->nargs && (mark || !hit); a++) {
    tpu_arg *x = &n->args[a];
    int cnt = x->kind == TPU_ARG_TENSORS ? x->nlist : x->kind == TPU_ARG_TENSOR ? 1 : 0;
    for (int j = 0; j < cnt; j++) {
      tpu_record *r = x->kind == TPU_ARG_TENSORS ? x->list[j].rec : x->t.rec;
      if (!r) continue;
      hit |= r->need_epoch == epoch;
      if (mark) r->need_epoch = epoch;
    }
  }
  for (int j = 0; j < n->nnew && (mark || !hit); j++) {
    hit |= n->outrec[j]->need_epoch == epoch;
    if (mark) n->outrec[j]->need_epoch = epoch;
  }
  return hit;
}

/* Drops the recorded ops whose results nobody needs: an op is kept when a
 * record it names (reads, writes or makes) is live at the flush or named by
 * a kept op after it. The others are released before the program is built,
 * so neither their results nor their inputs take memory (an op on a dead
 * tensor that was never written would otherwise get a buffer of zeros as
 * its input). Not while a graph is captured (its replays decide). */
static void tpu_nodes_prune(tpu_engine *e, uint64_t epoch) {
  if (e->fuse.capturing || e->fuse.nnodes == 0) return;
  bool *keep = calloc((size_t)e->fuse.nnodes, 1);
  if (!keep) return; /* keeping every op is always right */
  for (int i = 0; i < e->fuse.nnodes; i++) {
    tpu_node *n = &e->fuse.nodes[i];
    for (int a = 0; a < n->nargs; a++) {
      tpu_arg *x = &n->args[a];
      int cnt = x->kind == TPU_ARG_TENSORS ? x->nlist : x->kind == TPU_ARG_TENSOR ? 1 : 0;
      for (int j = 0; j < cnt; j++) {
        tpu_record *r = x->kind == TPU_ARG_TENSORS ? x->list[j].rec : x->t.rec;
        if (r && tpu_record_live(r)) r->need_epoch = epoch;
      }
    }
    for (int j = 0; j < n->nnew; j++)
      if (tpu_record_live(n->outrec[j])) n->outrec[j]->need_epoch = epoch;
  }
  int dropped = 0;
  for (int i = e->fuse.nnodes - 1; i >= 0; i--) {
    tpu_node *n = &e->fuse.nodes[i];
    keep[i] = keep[i] || tpu_node_needs(n, epoch, false);
    if (!keep[i]) {
      dropped++;
      continue;
    }
    tpu_node_needs(n, epoch, true);
    if (n->share) keep[n->share_from] = true; /* its program input is read */
  }
  if (dropped) {
    int *at = malloc(sizeof *at * (size_t)e->fuse.nnodes);
    if (at) {
      int w = 0;
      for (int i = 0; i < e->fuse.nnodes; i++) {
        at[i] = w;
        if (keep[i])
          e->fuse.nodes[w++] = e->fuse.nodes[i];
        else
          tpu_node_release(&e->fuse.nodes[i]);
      }
      for (int i = 0; i < w; i++)
        if (e->fuse.nodes[i].share) e->fuse.nodes[i].share_from = at[e->fuse.nodes[i].share_from];
      e->fuse.nnodes = w;
      atomic_fetch_add(&e->metrics.ops_pruned, dropped);
      free(at);
    }
  }
  free(keep);
}

/* Keys the recorded ops and finds (or lowers and compiles) their program;
 * tab receives the flush's record table (the caller frees tab->r). */
tpu_status *tpu_flush_prepare(tpu_engine *e, tpu_flush_reason reason, tpu_rectab *tab, tpu_cache_entry **out) {
  *out = NULL;
  atomic_fetch_add(&e->metrics.flushes[reason], 1);
  uint64_t epoch = ++e->fuse.epoch;
  tpu_nodes_prune(e, epoch);
  tpu_sig sig = {0};
  /* The key: every op's signature and which record each of its tensors
   * names (flush-local ids, in order of first use), then which records are
   * live. The same training step gives the same key every time. */
  tpu_sig_i64(&sig, -1);
  tpu_sig_i64(&sig, e->precision);
  tpu_sig_i64(&sig, e->value_checks); /* programs with and without checks differ */
  /* With recompiles explained, the key's parts are hashed apart too: a
   * program compiled for the same ops as an earlier one says which part
   * differs. */
  uint64_t ex[4] = {0};
  for (int i = 0; i < e->fuse.nnodes; i++) {
    tpu_node *n = &e->fuse.nodes[i];
    size_t at = sig.n;
    tpu_sig_put(&sig, n->sig, n->siglen);
    int64_t share = n->share ? (int64_t)((uint64_t)n->share << 32 | (uint32_t)n->share_from) : 0;
    tpu_sig_i64(&sig, share);
    size_t flow = sig.n;
    for (int a = 0; a < n->nargs; a++) {
      tpu_arg *x = &n->args[a];
      if (x->kind == TPU_ARG_TENSOR && x->t.rec) tpu_sig_i64(&sig, tpu_fuse_id(tab, x->t.rec, epoch));
      if (x->kind == TPU_ARG_TENSORS)
        for (int j = 0; j < x->nlist; j++)
          if (x->list[j].rec) tpu_sig_i64(&sig, tpu_fuse_id(tab, x->list[j].rec, epoch));
    }
    for (int j = 0; j < n->nnew; j++) tpu_sig_i64(&sig, tpu_fuse_id(tab, n->outrec[j], epoch));
    if (e->explain && !sig.oom) {
      ex[0] = tpu_hash64(&ex[0], sizeof ex[0]) ^ tpu_hash64(sig.p + at, n->siglen);
      ex[1] = tpu_hash64(&ex[1], sizeof ex[1]) ^ tpu_hash64(sig.p + flow, sig.n - flow);
      ex[2] = tpu_hash64(&ex[2], sizeof ex[2]) ^ (uint64_t)share;
    }
  }
  size_t live = sig.n;
  for (int k = 0; k < tab->n; k++) tpu_sig_i64(&sig, tpu_record_live(tab->r[k]));
  /* records on a mesh: their layouts and global shapes (spmd.c), and the partitioner */
  bool mesh = false;
  for (int k = 0; k < tab->n; k++) {
    const tpu_record *r = tab->r[k];
    if (!r->sh) continue;
    mesh = true;
    tpu_sig_i64(&sig, k);
    tpu_sig_i64(&sig, r->sh->mesh_rank);
    tpu_sig_put(&sig, r->sh->mesh, sizeof(int64_t) * (size_t)r->sh->mesh_rank);
    tpu_sig_i64(&sig, r->sh->rank);
    tpu_sig_put(&sig, r->sh->dim_axis, (size_t)r->sh->rank);
    tpu_sig_put(&sig, r->gdims, sizeof(int64_t) * (size_t)r->sh->rank);
  }
  if (mesh) tpu_sig_i64(&sig, e->shardy);
  /* over a mesh, views' offsets are constants of the program (L.static_offsets) */
  for (int i = 0; mesh && i < e->fuse.nnodes; i++) {
    const tpu_node *n = &e->fuse.nodes[i];
    for (int a = 0; a < n->nargs; a++) {
      const tpu_arg *x = &n->args[a];
      if (x->kind == TPU_ARG_TENSOR && x->t.rec) tpu_sig_i64(&sig, x->t.offset);
      if (x->kind == TPU_ARG_TENSORS)
        for (int j = 0; j < x->nlist; j++)
          if (x->list[j].rec) tpu_sig_i64(&sig, x->list[j].offset);
    }
  }
  if (e->explain && !sig.oom) ex[3] = tpu_hash64(sig.p + live, sig.n - live);
  tpu_status *s = (sig.oom || tab->oom) ? tpu_status_new(TPU_ERR_MEMORY, "out of memory") : NULL;
  if (!s) {
    uint64_t h = tpu_hash64(sig.p, sig.n);
    *out = tpu_cache_find(e, &sig, h);
    if (*out) {
      atomic_fetch_add(&e->metrics.cache_hits, 1);
    } else {
      atomic_fetch_add(&e->metrics.cache_misses, 1);
      s = tpu_fuse_lower(e, tab, &sig, h, out);
      if (!s && e->explain) tpu_fuse_explain(e, *out, ex);
    }
  }
  tpu_sig_done(&sig);
  return s;
}

/* What a flush during a torch.tpu.graph capture was for, for its error. */
static const char *tpu_flush_what(tpu_flush_reason reason) {
  switch (reason) {
    case TPU_FLUSH_DOWNLOAD:
      return "reading a value the graph computes (.item(), .cpu(), printing, a data-dependent shape)";
    case TPU_FLUSH_UPLOAD: return "copying host data into a tensor the graph writes";
    case TPU_FLUSH_SYNC: return "synchronizing";
    case TPU_FLUSH_CAP: return "recording more ops than TORCHTPU_FUSED_MAX_OPS (raise it)";
    case TPU_FLUSH_DEVICE: return "running ops on another device";
    default: return "changing the eager mode or running a compiled graph";
  }
}

tpu_status *tpu_engine_settle(tpu_engine *e, const tpu_record *rec, tpu_flush_reason reason) {
  return atomic_load(&rec->graph_refs) > 0 ? tpu_engine_flush(e, reason) : NULL;
}

tpu_status *tpu_engine_flush(tpu_engine *e, tpu_flush_reason reason) {
  if (!e->fuse.nnodes) return NULL;
  if (e->fuse.capturing && e->fuse.capture_whole)
    return tpu_status_new(TPU_ERR_RUNTIME,
                          "%s is not allowed while a graph is captured (torch.tpu.graph): the captured ops run "
                          "at replay(), so read or copy values outside the capture",
                          tpu_flush_what(reason));
  if (e->fuse.capturing) e->fuse.capture_split = true;
  tpu_rectab tab = {0};
  tpu_cache_entry *c = NULL;
  int call_dev = e->dev;
  e->dev = e->fuse.dev;
  tpu_status *s = tpu_flush_prepare(e, reason, &tab, &c);
  if (!s) s = tpu_fuse_run(e, c, &tab);
  free(tab.r);
  tpu_nodes_release(e);
  e->dev = call_dev;
  return s;
}

/* At most TPU_STEPS_AHEAD launched steps in flight: the host waits for the oldest. */
void tpu_steps_throttle(tpu_engine *e) {
  while (e->launch.count > TPU_STEPS_AHEAD) tpu_inflight_pop(e);
}

static tpu_status *tpu_engine_launch_step(tpu_engine *e, tpu_flush_reason reason) {
  if (e->mode != TPU_MODE_FUSED || e->fuse.capturing) return NULL; /* a capture is one program */
  tpu_status *s = tpu_engine_flush(e, reason);
  if (!s) tpu_steps_throttle(e);
  return s;
}

tpu_status *tpu_engine_flush_step(tpu_engine *e) { return tpu_engine_launch_step(e, TPU_FLUSH_STEP); }

bool tpu_engine_step_at_optimizer(const tpu_engine *e) {
  return e->step == TPU_STEP_OPTIMIZER || (e->step == TPU_STEP_AUTO && (e->mesh_used || e->tpu_like));
}

tpu_status *tpu_engine_backward_begins(tpu_engine *e) {
  if (e->mode != TPU_MODE_FUSED) return NULL;
  atomic_fetch_add(&e->metrics.backward_passes, 1);
  if (tpu_engine_step_at_optimizer(e)) return NULL; /* the backward pass joins its forward pass's program */
  return tpu_engine_launch_step(e, TPU_FLUSH_BACKWARD);
}

bool tpu_engine_idle(tpu_engine *e) {
  tpu_inflight_reap(e);
  return e->launch.count == 0 && e->fuse.nnodes == 0;
}
