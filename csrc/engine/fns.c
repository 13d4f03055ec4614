/* fns.c: functions from StableHLO text (torchtpu.stablehlo_op, jax_op),
 * registered by id. An id is what the row tpu::stablehlo_call takes (an int
 * argument, so it is part of a call's signature); the program text holds the
 * function itself, so the disk tier's key needs no id. Functions are kept
 * until the engine is freed: a program compiled in memory may call any of
 * them. The table grows under its own lock (the lowering may run on any
 * thread). The same text registered twice gets the same id.
 *
 * A compile of a program for the TPU (TORCHTPU_AOT_TOPOLOGY's compile-only
 * target) gives the TPU compiler tpu_engine_retarget's text: each function's
 * TPU form (a Pallas kernel's Mosaic call) in place of the one run here.
 */
#define _POSIX_C_SOURCE 200809L
#include "fns.h"

#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

tpu_status *tpu_engine_fn_register(tpu_engine *e, const char *text, size_t len, const char *target, const char *variant,
                                   size_t vlen, int64_t *id) {
  *id = -1;
  tpu_hlo_fn *f = NULL;
  tpu_status *s = tpu_hlo_fn_parse(text, len, &f);
  if (!s && variant) s = tpu_hlo_fn_add_variant(f, target ? target : "tpu", variant, vlen);
  if (s) {
    tpu_hlo_fn_free(f);
    return s;
  }
  pthread_mutex_lock(&e->fns.lock);
  for (int i = 0; i < e->fns.n && *id < 0; i++)
    if (tpu_hlo_fn_hash(e->fns.list[i]) == tpu_hlo_fn_hash(f) &&
        strcmp(tpu_hlo_fn_text(e->fns.list[i]), tpu_hlo_fn_text(f)) == 0) {
      *id = i;
      if (variant && !tpu_hlo_fn_has_variant(e->fns.list[i], target ? target : "tpu"))
        s = tpu_hlo_fn_add_variant(e->fns.list[i], target ? target : "tpu", variant, vlen);
    }
  if (*id < 0) {
    if (e->fns.n == e->fns.cap) {
      int cap = e->fns.cap ? 2 * e->fns.cap : 16;
      tpu_hlo_fn **q = realloc(e->fns.list, sizeof *q * (size_t)cap);
      if (!q) {
        pthread_mutex_unlock(&e->fns.lock);
        tpu_hlo_fn_free(f);
        return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
      }
      e->fns.list = q;
      e->fns.cap = cap;
    }
    e->fns.list[e->fns.n] = f;
    *id = e->fns.n++;
    f = NULL;
  }
  pthread_mutex_unlock(&e->fns.lock);
  tpu_hlo_fn_free(f);
  return s;
}

const tpu_hlo_fn *tpu_engine_fn(tpu_engine *e, int64_t id) {
  pthread_mutex_lock(&e->fns.lock);
  const tpu_hlo_fn *f = id >= 0 && id < e->fns.n ? e->fns.list[id] : NULL;
  pthread_mutex_unlock(&e->fns.lock);
  return f;
}

const tpu_hlo_fn *tpu_engine_fn_lookup(void *e, int64_t id) { return tpu_engine_fn(e, id); }

tpu_status *tpu_engine_retarget(tpu_engine *e, const char *text, size_t len, const char *target, char **out,
                                size_t *outlen) {
  pthread_mutex_lock(&e->fns.lock);
  tpu_status *s = tpu_hlo_retarget(text, len, (const tpu_hlo_fn *const *)e->fns.list, e->fns.n, target, out, outlen);
  pthread_mutex_unlock(&e->fns.lock);
  return s;
}

tpu_status *tpu_engine_fn_program(tpu_engine *e, int64_t id, const char *target, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  const tpu_hlo_fn *f = tpu_engine_fn(e, id);
  if (!f) return tpu_status_new(TPU_ERR_VALUE, "stablehlo_op: no function has id %lld", (long long)id);
  tpu_hlo *m = tpu_hlo_new();
  if (!m) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  int n = tpu_hlo_fn_nargs(f), r = tpu_hlo_fn_nresults(f);
  tpu_hv *v = malloc(sizeof *v * (size_t)(n + r + 1));
  if (!v) {
    tpu_hlo_free(m);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  for (int i = 0; i < n; i++) v[i] = tpu_hlo_param(m, *tpu_hlo_fn_arg(f, i));
  tpu_hlo_call(m, f, v, n, v + n);
  char *t = NULL;
  size_t l = 0;
  tpu_status *s = tpu_hlo_finish(m, v + n, r, &t, &l);
  free(v);
  tpu_hlo_free(m);
  if (s || !target || !target[0]) {
    *text = t;
    *len = l;
    return s;
  }
  s = tpu_engine_retarget(e, t, l, target, text, len);
  free(t);
  return s;
}

void tpu_fns_init(tpu_fns *f) { pthread_mutex_init(&f->lock, NULL); }

void tpu_fns_free(tpu_fns *f) {
  for (int i = 0; i < f->n; i++) tpu_hlo_fn_free(f->list[i]);
  free(f->list);
  f->list = NULL;
  f->n = f->cap = 0;
  pthread_mutex_destroy(&f->lock);
}
