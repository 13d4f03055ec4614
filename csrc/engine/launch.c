/* launch.c: feeding and launching programs.
 *
 * Program inputs are records' buffers, small cached buffers for scalars
 * (Python numbers, view offsets) and the generator's state. Outside debug
 * mode a launched program's completion event joins a ring; a failure is
 * reported at the next sync point, as is a failed value check (a 0-d flag a
 * program computes; see lower.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "launch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

void tpu_launch_free(tpu_launch *l) {
  free(l->chk);
  l->chk = NULL;
  for (int i = 0; i < TPU_SCALAR_SLOTS; i++) tpu_rt_buffer_free(l->scalars[i].buf);
}

/* Waits for the oldest launched computation; keeps its error if it is the
 * first one. */
void tpu_inflight_pop(tpu_engine *e) {
  int k = e->launch.head;
  tpu_status *s = tpu_rt_event_wait(e->rt, e->launch.inflight[k].ev);
  if (s && !e->launch.deferred && e->launch.inflight[k].op)
    e->launch.deferred = tpu_status_prefix(s,
                                           "aten::%s failed (it ran asynchronously in strict eager mode; "
                                           "set TORCHTPU_EAGER=debug to stop at the failing op)",
                                           e->launch.inflight[k].op);
  else if (s && !e->launch.deferred)
    e->launch.deferred = tpu_status_prefix(s,
                                           "a fused program failed (set TORCHTPU_EAGER=debug to stop at the "
                                           "failing op)");
  else
    tpu_status_free(s);
  e->launch.inflight[k].ev = NULL;
  e->launch.head = (e->launch.head + 1) % TPU_INFLIGHT;
  e->launch.count--;
}

/* Frees the finished computations at the front, without blocking. */
void tpu_inflight_reap(tpu_engine *e) {
  while (e->launch.count && tpu_rt_event_ready(e->rt, e->launch.inflight[e->launch.head].ev)) tpu_inflight_pop(e);
}

/* Reads the pending value checks (each waits for its program): the first
 * that failed, as an error naming its op; every check is consumed. */
tpu_status *tpu_checks_read(tpu_engine *e) {
  tpu_status *err = NULL;
  for (int k = 0; k < e->launch.nchk; k++) {
    uint8_t bad = 0;
    tpu_status *s = err ? NULL : tpu_engine_d2h(e, e->launch.chk[k].buf, &bad, 1);
    tpu_rt_buffer_free(e->launch.chk[k].buf);
    if (s)
      tpu_status_free(s); /* the program's own failure is reported by the ring */
    else if (bad && !err && e->launch.chk[k].site)
      err = tpu_status_new((tpu_code)e->launch.chk[k].what.code,
                           "aten::%s: %s\n(raised at a sync point; the op was called from, most recent call last:\n%s)",
                           e->launch.chk[k].what.op, e->launch.chk[k].what.msg, e->launch.chk[k].site);
    else if (bad && !err)
      err = tpu_status_new((tpu_code)e->launch.chk[k].what.code, "aten::%s: %s", e->launch.chk[k].what.op,
                           e->launch.chk[k].what.msg);
    free(e->launch.chk[k].site);
  }
  e->launch.nchk = 0;
  return err;
}

/* Keeps a launched program's check (b and site owned; site may be NULL) for
 * the next sync point; with many pending, they are read now and a failure
 * waits there. */
void tpu_check_push(tpu_engine *e, tpu_rt_buffer *b, tpu_fcheck what, char *site) {
  if (e->launch.nchk == e->launch.capchk) {
    int cap = e->launch.capchk ? 2 * e->launch.capchk : 16;
    void *n = cap <= 4096 ? realloc(e->launch.chk, sizeof *e->launch.chk * (size_t)cap) : NULL;
    if (!n) {
      tpu_status *s = tpu_checks_read(e);
      if (s && !e->launch.deferred)
        e->launch.deferred = s;
      else
        tpu_status_free(s);
    } else {
      e->launch.chk = n;
      e->launch.capchk = cap;
    }
  }
  e->launch.chk[e->launch.nchk].buf = b;
  e->launch.chk[e->launch.nchk].site = site;
  e->launch.chk[e->launch.nchk++].what = what;
}

/* Waits for every launched computation; the first error of one (once), then
 * the first failed value check. */
tpu_status *tpu_engine_wait(tpu_engine *e) {
  int64_t p0 = e->launch.count ? tpu_prof_t0() : 0;
  while (e->launch.count) tpu_inflight_pop(e);
  if (p0) tpu_prof_host(TPU_PROF_WAIT, e->dev, p0, 0, NULL);
  tpu_status *s = e->launch.deferred;
  e->launch.deferred = NULL;
  tpu_status *c = e->launch.nchk ? tpu_checks_read(e) : NULL;
  if (!s) return c;
  tpu_status_free(c);
  return s;
}

/* torch's refusals of a write that aliases itself or what the op reads
 * (TensorIterator's memory-overlap checks): checked on every call from the
 * program's plans, which say which tensors it writes and reads. Two views
 * of one record are compared; views whose overlap is too hard to tell are
 * allowed, as in torch. */
tpu_status *tpu_check_overlap(const tpu_op_row *row, tpu_arg *args, const tpu_cache_entry *c) {
  /* the tensors written: in-place and out= writes, then out= tensors that
   * are resized to take a result (for NO_ALIAS ops, any overlap of those
   * with an input is refused: they cannot be the input itself) */
  for (int w = 0; w < c->nout + c->nret; w++) {
    tpu_in_plan wp;
    bool resized = w >= c->nout;
    if (!resized) {
      if (c->out[w].kind != TPU_OUT_WRITE) continue;
      wp = (tpu_in_plan){TPU_IN_RECORD, c->out[w].arg, c->out[w].item};
    } else {
      const tpu_ret_plan *r = &c->ret[w - c->nout];
      /* only ops that refuse any alias (torch lets sum(x, 0, out=x) resize x) */
      if (!(row->flags & TPU_OP_NO_ALIAS) || !r->resize || r->arg < 0 || args[r->arg].kind != TPU_ARG_TENSOR) continue;
      wp = (tpu_in_plan){TPU_IN_RECORD, r->arg, -1};
    }
    const tpu_tref *wt = tpu_arg_tref(args, &wp);
    if (!(row->flags & TPU_OP_FILLS) && tpu_tref_internal_overlap(wt))
      return tpu_status_new(TPU_ERR_RUNTIME,
                            "aten::%s: unsupported operation: more than one element of the "
                            "written-to tensor refers to a single memory location. Please clone() the tensor before "
                            "performing the operation.",
                            row->name);
    for (int k = 0; k < c->nin; k++) {
      const tpu_in_plan *p = &c->in[k];
      if (p->kind != TPU_IN_RECORD || (p->arg == wp.arg && p->item == wp.item)) continue;
      int lap = tpu_tref_overlap(wt, tpu_arg_tref(args, p));
      if (lap == TPU_OVERLAP_PARTIAL || (lap == TPU_OVERLAP_FULL && (resized || (row->flags & TPU_OP_NO_ALIAS))))
        return tpu_status_new(TPU_ERR_RUNTIME,
                              "aten::%s: unsupported operation: some elements of the input tensor "
                              "and the written-to tensor refer to a single memory location. Please clone() the "
                              "tensor before performing the operation.",
                              row->name);
    }
  }
  return NULL;
}

/* A 0-d device buffer holding these bytes, borrowed from the engine's
 * scalar cache for the current call. A slot already used by this call is
 * never evicted: the colliding value gets an owned buffer in *temp instead. */
static tpu_status *tpu_scalar_buffer(tpu_engine *e, tpu_dtype dt, const void *bytes, tpu_rt_buffer **out,
                                     tpu_rt_buffer **temp) {
  uint8_t key[16] = {0};
  size_t n = tpu_dtype_size(dt);
  memcpy(key, bytes, n);
  uint64_t h = tpu_hash64(key, sizeof key) ^ ((uint64_t)dt + ((uint64_t)e->dev << 8)) * 0x9e3779b97f4a7c15ull;
  tpu_scalar_slot *slot = &e->launch.scalars[h % TPU_SCALAR_SLOTS];
  *temp = NULL;
  if (slot->buf && slot->dtype == dt && slot->dev == e->dev && memcmp(slot->bits, key, sizeof key) == 0) {
    slot->epoch = e->launch.epoch;
    *out = slot->buf;
    return NULL;
  }
  tpu_rt_buffer *b = NULL;
  tpu_status *s = tpu_engine_h2d(e, e->dev, key, dt, NULL, 0, &b);
  if (s) return s;
  if (slot->buf && slot->epoch == e->launch.epoch) {
    *temp = *out = b;
    return NULL;
  }
  slot->epoch = e->launch.epoch;
  tpu_rt_buffer_free(slot->buf);
  slot->buf = b;
  slot->dtype = dt;
  slot->dev = e->dev;
  memcpy(slot->bits, key, sizeof key);
  *out = b;
  return NULL;
}

/* The dtype and bytes of a Python number as a program input. */
tpu_dtype tpu_scalar_bits(const tpu_arg *a, uint8_t bits[16]) {
  memset(bits, 0, 16);
  switch (a->skind) {
    case TPU_SCALAR_BOOL: bits[0] = a->i != 0; return TPU_PRED;
    case TPU_SCALAR_INT: memcpy(bits, &a->i, sizeof a->i); return TPU_S64;
    case TPU_SCALAR_FLOAT: memcpy(bits, &a->f, sizeof a->f); return TPU_F64;
    default: {
      double c[2] = {a->f, a->f_imag};
      memcpy(bits, c, sizeof c);
      return TPU_C128;
    }
  }
}

/* The same as an f32 (TPU_IN_SCALAR32: an int or float argument), rounded
 * as the program's convert to f32 would. */
static tpu_dtype tpu_scalar_bits32(const tpu_arg *a, uint8_t bits[16]) {
  memset(bits, 0, 16);
  float v;
  if (a->skind == TPU_SCALAR_INT) {
    v = (float)a->i; /* to nearest, as the program's s64 -> f32 convert */
  } else if (isfinite(a->f) && fabs(a->f) >= 0x1.ffffffp127) {
    v = a->f < 0 ? -INFINITY : INFINITY; /* past FLT_MAX's rounding interval (a cast there is undefined) */
  } else {
    v = (float)a->f; /* to nearest even, as the program's f64 -> f32 convert */
  }
  memcpy(bits, &v, sizeof v);
  return TPU_F32;
}

tpu_dtype tpu_input_bits(const tpu_in_plan *p, tpu_arg *args, uint8_t bits[16]) {
  if (p->kind == TPU_IN_SCALAR) return tpu_scalar_bits(&args[p->arg], bits);
  if (p->kind == TPU_IN_SCALAR32) return tpu_scalar_bits32(&args[p->arg], bits);
  memset(bits, 0, 16);
  const tpu_tref *t = tpu_arg_tref(args, p);
  if (p->kind == TPU_IN_OFFSET) {
    memcpy(bits, &t->offset, sizeof t->offset);
    return TPU_S64;
  }
  if (p->kind == TPU_IN_OFFSET32) { /* within the record, whose elements fit in 32 bits */
    int32_t off = (int32_t)t->offset;
    memcpy(bits, &off, sizeof off);
    return TPU_S32;
  }
  memcpy(bits, t->host_bytes, tpu_dtype_size(t->dtype)); /* TPU_IN_HOST_TENSOR */
  return t->dtype;
}

/* The device buffer of one program input: borrowed (a record's buffer, a
 * cached scalar), or owned in *temp (a colliding scalar, the RNG state).
 * rec: the record of a RECORD input; rng_seed, rng_offset: the generator's
 * key and the offset reserved for the call. */
tpu_status *tpu_input_buffer(tpu_engine *e, const tpu_in_plan *p, tpu_arg *args, tpu_record *rec, uint64_t rng_seed,
                             uint64_t rng_offset, tpu_rt_buffer **b, tpu_rt_buffer **temp) {
  *b = *temp = NULL;
  switch (p->kind) {
    case TPU_IN_RECORD: {
      tpu_status *s = tpu_record_materialize(e, rec);
      *b = rec->buf;
      return s;
    }
    case TPU_IN_SCALAR:
    case TPU_IN_SCALAR32:
    case TPU_IN_HOST_TENSOR:
    case TPU_IN_OFFSET:
    case TPU_IN_OFFSET32: {
      uint8_t bits[16];
      tpu_dtype dt = tpu_input_bits(p, args, bits);
      return tpu_scalar_buffer(e, dt, bits, b, temp);
    }
    case TPU_IN_RNG: {
      uint64_t st[2];
      tpu_rng_key(rng_seed, rng_offset, st);
      int64_t two = 2;
      tpu_status *s = tpu_engine_h2d(e, e->dev, st, TPU_U64, &two, 1, b);
      *temp = *b;
      return s;
    }
  }
  return tpu_status_new(TPU_ERR_RUNTIME, "unknown program input kind %d", (int)p->kind);
}

/* The profiler's record of a launch: one op's program, or a fused one. */
static void tpu_prof_launch_what(tpu_engine *e, int64_t p0, tpu_rt_event *done, const char *name, int nops) {
  if (name)
    tpu_prof_launch(e->rt, e->dev, p0, done, "aten::%s", name);
  else
    tpu_prof_launch(e->rt, e->dev, p0, done, "fused program of %d ops", nops);
}

/* The profiler's record of a program over several devices that ran to
 * completion in the call (each row's device runs it). */
void tpu_prof_rows(tpu_rt_exec *exec, int64_t p0, const char *what) {
  int devs[256], n = tpu_rt_exec_rows(exec);
  if (n > 256) n = 256;
  for (int r = 0; r < n; r++) devs[r] = tpu_rt_exec_row_device(exec, r);
  tpu_prof_ran(devs, n, p0, "%s over %d devices", what, tpu_rt_exec_rows(exec));
}

/* Runs exec: to completion in debug mode, else launched (the completion
 * event joins the in-flight ring under `name`, the op's table name or NULL
 * for a fused program of nops ops, for error messages and the profiler). */
tpu_status *tpu_engine_launch(tpu_engine *e, tpu_rt_exec *exec, tpu_rt_buffer **in, int nin, tpu_rt_buffer **out,
                              const char *name, int nops) {
  int64_t t0 = tpu_now_ns(), p0 = tpu_prof_t0();
  tpu_status *s;
  if (e->mode != TPU_MODE_DEBUG) {
    tpu_inflight_reap(e);
    if (e->launch.count == TPU_INFLIGHT) tpu_inflight_pop(e);
    tpu_rt_event *done = NULL;
    /* The CPU plugin blocks the caller when it is given a buffer that a
     * running computation still reads: with computations in flight, a
     * program that would take its inputs' buffers writes new ones instead,
     * so that the host runs ahead (other plugins order donation on the
     * device and always donate). */
    s = tpu_rt_execute_on(e->rt, exec, e->dev, in, nin, out, &done, e->launch.count && e->donate_waits);
    if (p0 && !s) tpu_prof_launch_what(e, p0, done, name, nops);
    if (done) {
      int k = (e->launch.head + e->launch.count) % TPU_INFLIGHT;
      e->launch.inflight[k].ev = done;
      e->launch.inflight[k].op = name;
      e->launch.count++;
    }
  } else {
    s = tpu_rt_execute_on(e->rt, exec, e->dev, in, nin, out, NULL, false);
    if (p0 && !s) tpu_prof_launch_what(e, p0, NULL, name, nops);
  }
  atomic_fetch_add(&e->metrics.execute_ns, tpu_now_ns() - t0);
  return s;
}
