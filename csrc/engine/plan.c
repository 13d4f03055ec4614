/* plan.c: graph plans (torch.compile captures and torch.tpu.graph).
 *
 * A plan keeps a flushed recording's program and where each of its inputs
 * and outputs comes from (a graph input's record, a held record, a
 * constant, the generator, a fresh record), so that a later call with
 * inputs of the same layout runs the program directly.
 */
#define _POSIX_C_SOURCE 200809L
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

/* ---- graph plans ------------------------------------------------------------------- */

/* Where a program input comes from, or where a program output goes. */
enum { TPU_SRC_IN, TPU_SRC_HELD, TPU_SRC_CONST, TPU_SRC_RNG, TPU_SRC_NEW };

typedef struct {
  int kind;           /* TPU_SRC_* */
  int idx;            /* graph input, held record or new record */
  uint64_t rng;       /* RNG: the op's offset from the graph's first */
  tpu_rt_buffer *buf; /* CONST: owned */
} tpu_plan_src;

struct tpu_plan {
  tpu_engine *eng; /* NULL once released */
  struct tpu_plan *prev, *next;
  tpu_cache_entry *c; /* referenced */
  int dev;            /* the device it was captured on, and runs on */
  int nops;
  int nin;
  tpu_tref *in;          /* the inputs' layout at capture (records cleared) */
  int *in_alias;         /* the first input sharing its record, -1 for none */
  tpu_sharding *in_sh;   /* the inputs' layouts over a mesh (rank -1: on one device) */
  tpu_hlo_type *in_type; /* the types of the inputs' records (rank -1: none), the program's parameters */
  tpu_record **held;     /* referenced: records the graph reads or writes but does not take as inputs */
  int nheld;
  tpu_plan_src *src;      /* by program input (c->nfin) */
  tpu_plan_src *dst;      /* by program output (c->nfout): IN, HELD or NEW */
  tpu_hlo_type *new_type; /* the new records' types: dtype and buffer shape */
  int nnew;
  uint64_t rng_span;
  int nout;
  tpu_tref *out;      /* the outputs' views at capture */
  tpu_plan_src *osrc; /* by output: IN, HELD or NEW */
};

static void tpu_plan_release(tpu_plan *p) {
  tpu_engine *e = p->eng;
  if (!e) return;
  if (p->prev)
    p->prev->next = p->next;
  else
    e->plans.live = p->next;
  if (p->next) p->next->prev = p->prev;
  p->eng = NULL;
  tpu_cache_entry_free(p->c);
  for (int i = 0; i < p->nheld; i++) tpu_record_unref(p->held[i]);
  if (p->src)
    for (int k = 0; k < p->c->nfin; k++) tpu_rt_buffer_free(p->src[k].buf);
  free(p->in);
  free(p->in_alias);
  free(p->in_sh);
  free(p->in_type);
  free(p->held);
  free(p->src);
  free(p->dst);
  free(p->new_type);
  free(p->out);
  free(p->osrc);
}

void tpu_plans_release(tpu_engine *e) {
  while (e->plans.live) tpu_plan_release(e->plans.live);
}

void tpu_plan_free(tpu_plan *p) {
  if (!p) return;
  tpu_plan_release(p);
  free(p);
}

int tpu_plan_nout(const tpu_plan *p) { return p->nout; }

const tpu_tref *tpu_plan_output(const tpu_plan *p, int j, int *input) {
  *input = p->osrc[j].kind == TPU_SRC_IN ? p->osrc[j].idx : -1;
  return &p->out[j];
}

tpu_status *tpu_engine_capture_begin(tpu_engine *e, int *prev) {
  if (e->fuse.capturing && e->fuse.capture_whole) {
    *prev = -1; /* inside torch.tpu.graph: the graph's ops join that recording */
    return NULL;
  }
  *prev = e->mode;
  tpu_status *s = tpu_engine_flush(e, TPU_FLUSH_MODE);
  if (s) return s;
  e->mode = TPU_MODE_FUSED;
  e->fuse.capturing = true;
  e->fuse.capture_split = false;
  e->fuse.capture_birth = e->reg.made;
  e->fuse.capture_rng = e->rng_offset;
  return NULL;
}

/* Index of r among the plan's held records, added (referenced) if new; -1
 * when out of memory. */
static int tpu_plan_hold(tpu_plan *p, tpu_record *r, int *cap) {
  for (int i = 0; i < p->nheld; i++)
    if (p->held[i] == r) return i;
  if (p->nheld == *cap) {
    int nc = *cap ? 2 * *cap : 8;
    tpu_record **g = realloc(p->held, sizeof *g * (size_t)nc);
    if (!g) return -1;
    p->held = g;
    *cap = nc;
  }
  tpu_record_ref(r);
  p->held[p->nheld] = r;
  return p->nheld++;
}

/* The first input naming record r, or -1. */
static int tpu_input_of(const tpu_tref *ins, int nin, const tpu_record *r) {
  for (int i = 0; i < nin; i++)
    if (ins[i].rec == r) return i;
  return -1;
}

/* Builds the plan of the recorded graph (before it runs: the nodes are
 * still there). NULL with *why when a part of it cannot be replayed. */
static tpu_status *tpu_plan_build(tpu_engine *e, tpu_rectab *tab, tpu_cache_entry *c, const tpu_tref *ins, int nin,
                                  const tpu_tref *outs, int nout, tpu_plan **out, const char **why) {
  *out = NULL;
  uint64_t epoch = e->fuse.epoch;
  int n = tab->n ? tab->n : 1;
  tpu_plan *p = calloc(1, sizeof *p);
  int *cls = calloc((size_t)n, sizeof *cls), *idx = calloc((size_t)n, sizeof *idx);
  int heldcap = 0;
  if (!p || !cls || !idx) goto oom;
  p->eng = e;
  p->dev = e->fuse.dev;
  p->next = e->plans.live;
  if (e->plans.live) e->plans.live->prev = p;
  e->plans.live = p;
  p->c = c;
  c->refs++;
  p->nops = e->fuse.nnodes;
  p->nin = nin;
  p->nout = nout;
  p->rng_span = e->rng_offset - e->fuse.capture_rng;
  p->in = calloc((size_t)(nin ? nin : 1), sizeof *p->in);
  p->in_alias = calloc((size_t)(nin ? nin : 1), sizeof *p->in_alias);
  p->in_sh = calloc((size_t)(nin ? nin : 1), sizeof *p->in_sh);
  p->in_type = calloc((size_t)(nin ? nin : 1), sizeof *p->in_type);
  p->src = calloc((size_t)(c->nfin ? c->nfin : 1), sizeof *p->src);
  p->dst = calloc((size_t)(c->nfout ? c->nfout : 1), sizeof *p->dst);
  p->new_type = calloc((size_t)n + (size_t)nout, sizeof *p->new_type);
  p->out = calloc((size_t)(nout ? nout : 1), sizeof *p->out);
  p->osrc = calloc((size_t)(nout ? nout : 1), sizeof *p->osrc);
  if (!p->in || !p->in_alias || !p->in_sh || !p->in_type || !p->src || !p->dst || !p->new_type || !p->out || !p->osrc)
    goto oom;
  for (int i = 0; i < nin; i++) {
    p->in[i] = ins[i];
    p->in[i].rec = NULL;
    p->in_alias[i] = ins[i].rec ? tpu_input_of(ins, nin, ins[i].rec) : -1;
    if (ins[i].rec && ins[i].rec->sh)
      p->in_sh[i] = *ins[i].rec->sh;
    else
      p->in_sh[i].rank = -1;
    if (ins[i].rec)
      p->in_type[i] = tpu_record_type(ins[i].rec);
    else
      p->in_type[i].rank = -1;
  }
  /* Each record of the flush: made by a recorded op (NEW), a graph input
   * (IN), or something the graph holds (HELD: made before the capture). */
  for (int k = 0; k < tab->n; k++) cls[k] = -1;
  for (int i = 0; i < e->fuse.nnodes; i++)
    for (int j = 0; j < e->fuse.nodes[i].nnew; j++) {
      tpu_record *r = e->fuse.nodes[i].outrec[j];
      if (r->fuse_epoch == epoch) cls[r->fuse_id] = TPU_SRC_NEW;
    }
  for (int k = 0; k < tab->n; k++) {
    if (cls[k] == TPU_SRC_NEW) {
      idx[k] = -1;
      continue;
    }
    int i = tpu_input_of(ins, nin, tab->r[k]);
    if (i >= 0) {
      cls[k] = TPU_SRC_IN;
      idx[k] = i;
    } else if (tab->r[k]->birth < e->fuse.capture_birth || e->fuse.capture_whole) {
      /* a whole-step capture keeps the tensors it made: replays write into them */
      cls[k] = TPU_SRC_HELD;
      if ((idx[k] = tpu_plan_hold(p, tab->r[k], &heldcap)) < 0) goto oom;
    } else if (!tab->r[k]->buf) {
      /* torch.empty in the graph: a fresh record on every call */
      cls[k] = TPU_SRC_NEW;
      p->new_type[p->nnew] = tpu_record_type(tab->r[k]);
      idx[k] = p->nnew++;
    } else {
      *why = "the graph reads a tensor made while it ran, outside its recorded ops";
      goto fail;
    }
  }
  for (int k = 0; k < c->nfin; k++) {
    const tpu_fin *f = &c->fin[k];
    tpu_plan_src *d = &p->src[k];
    if (f->kind == TPU_IN_RECORD) {
      if (cls[f->rec] == TPU_SRC_NEW && idx[f->rec] < 0) {
        *why = "the program reads a value before a recorded op makes it";
        goto fail;
      }
      d->kind = cls[f->rec];
      d->idx = idx[f->rec];
      continue;
    }
    tpu_node *nd = &e->fuse.nodes[f->node];
    if (f->kind == TPU_IN_RNG) {
      d->kind = TPU_SRC_RNG;
      d->rng = nd->rng_offset - e->fuse.capture_rng;
      continue;
    }
    /* Python numbers, view offsets and CPU scalars are fixed by the graph
     * and its inputs' layout: uploaded once. */
    uint8_t bits[16];
    tpu_in_plan ip = {f->kind, f->arg, f->item};
    tpu_dtype dt = tpu_input_bits(&ip, nd->args, bits);
    d->kind = TPU_SRC_CONST;
    tpu_status *s = tpu_engine_h2d(e, p->dev, bits, dt, NULL, 0, &d->buf);
    if (s) {
      tpu_plan_free(p);
      free(cls);
      free(idx);
      return s;
    }
  }
  /* Program outputs: into a graph input's record, a held record, or a new one. */
  int *newof = idx; /* for NEW records: their index among the plan's new records, -1 until one */
  for (int k = 0; k < c->nfout; k++) {
    int r = c->fout[k];
    p->dst[k].kind = cls[r];
    if (cls[r] == TPU_SRC_NEW && e->fuse.capture_whole) {
      p->dst[k].kind = TPU_SRC_HELD;
      if ((p->dst[k].idx = tpu_plan_hold(p, tab->r[r], &heldcap)) < 0) goto oom;
    } else if (cls[r] == TPU_SRC_NEW && newof[r] >= 0) {
      p->dst[k].idx = newof[r];
    } else if (cls[r] == TPU_SRC_NEW) {
      newof[r] = p->nnew;
      p->new_type[p->nnew] = tpu_record_type(tab->r[r]);
      p->dst[k].idx = p->nnew++;
    } else {
      p->dst[k].idx = idx[r];
    }
  }
  for (int j = 0; j < nout; j++) {
    const tpu_tref *t = &outs[j];
    tpu_record *r = t->rec;
    if (t->zero_size || t->host || !r || (t->rec_dtype != TPU_INVALID && t->rec_dtype != t->dtype)) {
      *why = "an output is empty, on the CPU, or reinterprets its storage";
      goto fail;
    }
    p->out[j] = *t;
    p->out[j].rec = NULL;
    tpu_plan_src *o = &p->osrc[j];
    int i = tpu_input_of(ins, nin, r);
    if (r->fuse_epoch == epoch && cls[r->fuse_id] == TPU_SRC_NEW) {
      o->kind = TPU_SRC_NEW;
      o->idx = newof[r->fuse_id];
      if (o->idx < 0) {
        *why = "an output is not computed by the program";
        goto fail;
      }
    } else if (i >= 0) {
      o->kind = TPU_SRC_IN;
      o->idx = i;
    } else if (r->birth < e->fuse.capture_birth) {
      o->kind = TPU_SRC_HELD;
      if ((o->idx = tpu_plan_hold(p, r, &heldcap)) < 0) goto oom;
    } else if (!r->buf && r->fuse_epoch != epoch) {
      o->kind = TPU_SRC_NEW; /* torch.empty returned as it is */
      p->new_type[p->nnew] = tpu_record_type(r);
      o->idx = p->nnew++;
    } else {
      *why = "an output was made while the graph ran, outside its recorded ops";
      goto fail;
    }
  }
  free(cls);
  free(idx);
  *out = p;
  return NULL;
fail:
  tpu_plan_free(p);
  free(cls);
  free(idx);
  return NULL;
oom:
  tpu_plan_free(p);
  free(cls);
  free(idx);
  return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
}

tpu_status *tpu_engine_capture_end(tpu_engine *e, int prev, const tpu_tref *ins, int nin, const tpu_tref *outs,
                                   int nout, tpu_plan **plan, const char **why) {
  if (plan) *plan = NULL;
  *why = NULL;
  if (prev < 0) {
    *why = "it ran inside a torch.tpu.graph capture, which replays it";
    return NULL;
  }
  bool split = e->fuse.capture_split;
  e->fuse.capturing = false;
  tpu_status *s = NULL;
  if (!e->fuse.nnodes) {
    *why = "the graph runs no tpu op";
  } else {
    tpu_rectab tab = {0};
    tpu_cache_entry *c = NULL;
    int call_dev = e->dev;
    e->dev = e->fuse.dev;
    s = tpu_flush_prepare(e, TPU_FLUSH_MODE, &tab, &c);
    if (!s && split) *why = "the graph was run in pieces (a sync point inside it, or TORCHTPU_FUSED_MAX_OPS)";
    if (!s && !split && plan) s = tpu_plan_build(e, &tab, c, ins, nin, outs, nout, plan, why);
    if (!s) s = tpu_fuse_run(e, c, &tab);
    if (s && plan) {
      tpu_plan_free(*plan);
      *plan = NULL;
    }
    free(tab.r);
    tpu_nodes_release(e);
    e->dev = call_dev;
  }
  e->mode = prev;
  return s;
}

tpu_status *tpu_engine_graph_begin(tpu_engine *e, int *prev) {
  if (e->fuse.capturing)
    return tpu_status_new(TPU_ERR_RUNTIME, "a graph is already being captured: captures do not nest");
  tpu_status *s = tpu_engine_capture_begin(e, prev);
  if (!s) e->fuse.capture_whole = true;
  return s;
}

bool tpu_engine_graph_capturing(const tpu_engine *e) { return e->fuse.capturing && e->fuse.capture_whole; }

tpu_status *tpu_engine_graph_end(tpu_engine *e, int prev, bool keep, tpu_plan **plan) {
  *plan = NULL;
  tpu_status *s = NULL;
  if (keep && e->fuse.nnodes) {
    tpu_rectab tab = {0};
    tpu_cache_entry *c = NULL;
    const char *why = NULL;
    s = tpu_flush_prepare(e, TPU_FLUSH_MODE, &tab, &c);
    if (!s) s = tpu_plan_build(e, &tab, c, NULL, 0, NULL, 0, plan, &why);
    if (!s && !*plan)
      s = tpu_status_new(TPU_ERR_RUNTIME, "the captured graph cannot be replayed: %s", why ? why : "no plan");
    free(tab.r);
  }
  /* Nothing recorded runs now: the tensors keep their values from before the
   * capture (those made during it have none until the first replay). */
  tpu_nodes_release(e);
  e->fuse.capturing = e->fuse.capture_whole = false;
  e->mode = prev;
  return s;
}

tpu_status *tpu_engine_graph_replay(tpu_engine *e, tpu_plan *p) {
  if (e->fuse.capturing) return tpu_status_new(TPU_ERR_RUNTIME, "replay() of a graph while a graph is being captured");
  tpu_status *s = tpu_plan_run(e, p, NULL, 0, NULL);
  if (!s) tpu_steps_throttle(e);
  return s;
}

static bool tpu_same_view(const tpu_tref *a, const tpu_tref *b) {
  if (a->dtype != b->dtype || a->rank != b->rank || a->host != b->host || a->zero_size != b->zero_size) return false;
  if (memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)a->rank)) return false;
  if (a->zero_size || a->host) return true;
  return !memcmp(a->strides, b->strides, sizeof(int64_t) * (size_t)a->rank) && a->offset == b->offset &&
         a->rec_numel == b->rec_numel && a->rec_dtype == b->rec_dtype;
}

bool tpu_plan_matches(const tpu_plan *p, const tpu_tref *ins, int nin) {
  if (!p->eng || nin != p->nin) return false;
  for (int i = 0; i < nin; i++) {
    if (!tpu_same_view(&p->in[i], &ins[i]) || (ins[i].rec && ins[i].rec->device != p->dev)) return false;
    /* a program over a mesh takes each input in the layout it was captured with */
    const tpu_sharding *sh = ins[i].rec ? ins[i].rec->sh : NULL;
    if ((p->in_sh[i].rank < 0) != !sh || (sh && !tpu_sharding_eq(sh, &p->in_sh[i]))) return false;
    /* and its record's buffer in the shape the program takes */
    if (ins[i].rec) {
      tpu_hlo_type t = tpu_record_type(ins[i].rec);
      if (!tpu_hlo_type_eq(&t, &p->in_type[i])) return false;
    }
    int a = ins[i].rec ? tpu_input_of(ins, nin, ins[i].rec) : -1;
    if (a != p->in_alias[i]) return false;
    for (int h = 0; h < p->nheld && ins[i].rec; h++)
      if (p->held[h] == ins[i].rec) return false;
  }
  return true;
}

/* The record a plan's input or output names. */
static tpu_record *tpu_plan_record(tpu_plan *p, const tpu_plan_src *d, const tpu_tref *ins, tpu_record **fresh) {
  return d->kind == TPU_SRC_IN ? ins[d->idx].rec : d->kind == TPU_SRC_HELD ? p->held[d->idx] : fresh[d->idx];
}

/* A replay over a mesh (spmd.c): every row's inputs, then one launch. */
static tpu_status *tpu_plan_run_spmd(tpu_engine *e, tpu_plan *p, const tpu_tref *ins, tpu_record **fresh,
                                     uint64_t rng_base) {
  tpu_cache_entry *c = p->c;
  int nin = c->nfin, rows = c->spmd_rows;
  size_t ni = (size_t)rows * (size_t)(nin ? nin : 1);
  tpu_rt_buffer **in = calloc(ni, sizeof *in), **own = calloc(ni, sizeof *own);
  tpu_record **dst = calloc((size_t)c->nfout + 1, sizeof *dst);
  tpu_status *s = (!in || !own || !dst) ? tpu_status_new(TPU_ERR_MEMORY, "out of memory") : NULL;
  for (int k = 0; k < nin && !s && c->exec; k++) { /* none on a compile-only mesh (spmd.c) */
    const tpu_plan_src *d = &p->src[k];
    for (int r = 0; r < rows && !s; r++) {
      tpu_rt_buffer **b = &in[r * nin + k], **o = &own[r * nin + k];
      if (d->kind == TPU_SRC_CONST) {
        *b = d->buf;
        if (r != p->dev) s = tpu_rt_buffer_copy(e->rt, d->buf, r, o), *b = *o;
      } else if (d->kind == TPU_SRC_RNG) {
        uint64_t st[2];
        tpu_rng_key(e->rng_seed, rng_base + d->rng, st);
        int64_t two = 2;
        s = tpu_engine_h2d(e, r, st, TPU_U64, &two, 1, o);
        *b = *o;
      } else {
        s = tpu_spmd_record_input(e, tpu_plan_record(p, d, ins, fresh), r, b, o);
      }
    }
  }
  for (int k = 0; k < c->nfout && !s; k++) dst[k] = tpu_plan_record(p, &p->dst[k], ins, fresh);
  if (!s) s = tpu_spmd_launch(e, c, in, dst, NULL);
  if (s) s = tpu_status_prefix(s, "running a compiled graph of %d ops", p->nops);
  for (size_t k = 0; k < ni && own; k++) tpu_rt_buffer_free(own[k]);
  free(in);
  free(own);
  free(dst);
  return s;
}

tpu_status *tpu_plan_run(tpu_engine *e, tpu_plan *p, const tpu_tref *ins, int nin, tpu_record **outs) {
  if (p->eng != e || nin != p->nin) return tpu_status_new(TPU_ERR_RUNTIME, "a graph plan was run on other inputs");
  for (int i = 0; i < p->nheld; i++) /* the inputs were checked by the bindings */
    if (p->held[i]->freed)
      return tpu_status_new(TPU_ERR_RUNTIME,
                            "a captured graph uses a tpu storage whose memory was freed (FSDP's "
                            "free_storage) and not allocated again");
  for (int i = 0; i < nin; i++)
    if (ins[i].rec && ins[i].rec->device != p->dev)
      return tpu_status_new(TPU_ERR_RUNTIME,
                            "Expected all tensors to be on the same device: a graph captured on tpu:%d was given an "
                            "input on tpu:%d",
                            p->dev, ins[i].rec->device);
  tpu_status *s = tpu_engine_flush(e, TPU_FLUSH_MODE);
  if (s) return s;
  int call_dev = e->dev;
  e->dev = p->dev;
  tpu_cache_entry *c = p->c;
  uint64_t rng_base = e->rng_offset;
  e->rng_offset += p->rng_span;
  int nin_p = c->nfin;
  tpu_rt_buffer **inbuf = calloc((size_t)nin_p + 1, sizeof *inbuf);
  tpu_rt_buffer **temps = calloc((size_t)nin_p + 1, sizeof *temps);
  tpu_rt_buffer **outbuf = calloc((size_t)(c->nfout + c->nfchk) + 1, sizeof *outbuf);
  tpu_record **fresh = calloc((size_t)p->nnew + 1, sizeof *fresh);
  if (!inbuf || !temps || !outbuf || !fresh) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  int ntemp = 0;
  e->launch.epoch++;
  for (int m = 0; m < p->nnew && !s; m++)
    if (!(fresh[m] = tpu_record_new_shaped(e, e->dev, p->new_type[m].dtype, p->new_type[m].rank, p->new_type[m].dims)))
      s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (c->spmd) {
    if (!s) s = tpu_plan_run_spmd(e, p, ins, fresh, rng_base);
    goto done;
  }
  for (int k = 0; k < nin_p && !s; k++) {
    const tpu_plan_src *d = &p->src[k];
    tpu_record *r = NULL;
    switch (d->kind) {
      case TPU_SRC_IN: r = ins[d->idx].rec; break;
      case TPU_SRC_NEW: r = fresh[d->idx]; break;
      case TPU_SRC_HELD: r = p->held[d->idx]; break;
      case TPU_SRC_CONST: inbuf[k] = d->buf; break;
      default: {
        uint64_t st[2];
        tpu_rng_key(e->rng_seed, rng_base + d->rng, st);
        int64_t two = 2;
        s = tpu_engine_h2d(e, p->dev, st, TPU_U64, &two, 1, &inbuf[k]);
        if (!s) temps[ntemp++] = inbuf[k];
      }
    }
    if (r) {
      s = tpu_record_materialize(e, r);
      inbuf[k] = r->buf;
    }
  }
  if (!s && c->nfout) {
    s = tpu_engine_launch(e, c->exec, inbuf, nin_p, outbuf, NULL, p->nops);
    if (!s) tpu_engine_aot_ran(e, c->aot);
    if (s) s = tpu_status_prefix(s, "running a compiled graph of %d ops", p->nops);
  }
  for (int k = 0; k < ntemp; k++) tpu_rt_buffer_free(temps[k]);
  if (!s) {
    for (int k = 0; k < c->nfout; k++) {
      const tpu_plan_src *d = &p->dst[k];
      tpu_record *r = d->kind == TPU_SRC_IN     ? ins[d->idx].rec
                      : d->kind == TPU_SRC_HELD ? p->held[d->idx]
                                                : fresh[d->idx];
      tpu_rt_buffer_free(r->buf);
      r->buf = outbuf[k];
    }
    for (int k = 0; k < c->nfchk; k++) tpu_check_push(e, outbuf[c->nfout + k], c->fchk[k], NULL);
  }
done:
  if (!s) {
    for (int j = 0; j < p->nout; j++) {
      const tpu_plan_src *o = &p->osrc[j];
      outs[j] = o->kind == TPU_SRC_IN ? ins[o->idx].rec : o->kind == TPU_SRC_HELD ? p->held[o->idx] : fresh[o->idx];
      tpu_record_ref(outs[j]);
    }
    atomic_fetch_add(&e->metrics.graph_replays, 1);
    atomic_fetch_add(&e->metrics.fused_programs, 1);
    atomic_fetch_add(&e->metrics.fused_ops, p->nops);
    atomic_fetch_add(&e->metrics.cache_hits, 1);
  }
  for (int m = 0; m < p->nnew && fresh; m++)
    if (fresh[m]) tpu_record_unref(fresh[m]);
  free(inbuf);
  free(temps);
  free(outbuf);
  free(fresh);
  e->dev = call_dev;
  return s;
}
