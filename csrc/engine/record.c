/* record.c: the record registry (record.h).
 *
 * An open-addressing set of live record addresses guarded by a mutex: torch
 * frees storages from any thread, with or without the GIL, and a pointer
 * coming back from Python is looked up before use.
 */
#define _POSIX_C_SOURCE 200809L
#include "record.h"

#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

#define TPU_TOMB ((tpu_record *)1) /* a deleted registry slot */

static size_t tpu_ptr_slot(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)(x & (cap - 1));
}

/* ---- records ------------------------------------------------------------------ */

bool tpu_registry_init(tpu_registry *g) {
  pthread_mutex_init(&g->lock, NULL);
  g->cap = 1024;
  g->slots = calloc(g->cap, sizeof *g->slots);
  return g->slots != NULL;
}

void tpu_registry_free(tpu_registry *g) {
  for (size_t i = 0; i < g->cap; i++) {
    tpu_record *r = g->slots ? g->slots[i] : NULL;
    if (r && r != TPU_TOMB) {
      tpu_rt_buffer_free(r->buf);
      r->buf = NULL;
      r->eng = NULL;
    }
  }
  free(g->slots);
  g->slots = NULL;
  pthread_mutex_destroy(&g->lock);
}

void tpu_record_free_shards(tpu_record *r) {
  if (r->shards)
    for (int64_t d = 0; d < tpu_sharding_num_devices(r->sh); d++) tpu_rt_buffer_free(r->shards[d]);
  free(r->shards);
  free(r->sh);
  r->shards = NULL;
  r->sh = NULL;
}

static bool tpu_reg_grow(tpu_engine *e) {
  size_t cap = e->reg.cap * 2;
  tpu_record **n = calloc(cap, sizeof *n);
  if (!n) return false;
  for (size_t i = 0; i < e->reg.cap; i++) {
    tpu_record *r = e->reg.slots[i];
    if (!r || r == TPU_TOMB) continue;
    size_t j = tpu_ptr_slot(r, cap);
    while (n[j]) j = (j + 1) & (cap - 1);
    n[j] = r;
  }
  free(e->reg.slots);
  e->reg.slots = n;
  e->reg.cap = cap;
  e->reg.used = e->reg.live;
  return true;
}

tpu_record *tpu_record_new(tpu_engine *e, tpu_dtype dt, int64_t numel) {
  return tpu_record_new_on(e, e->dev, dt, numel);
}

tpu_hlo_type tpu_buffer_type(tpu_dtype dt, int rank, const int64_t *dims) {
  int64_t numel = 1;
  for (int i = 0; i < rank; i++) numel *= dims[i];
  if (rank > 1 && rank <= TPU_MAX_RANK && numel > 0) return tpu_hlo_type_make(dt, rank, dims);
  return tpu_hlo_type_make(dt, 1, &numel);
}

tpu_record *tpu_record_new_shaped(tpu_engine *e, int device, tpu_dtype dt, int rank, const int64_t *dims) {
  tpu_hlo_type t = tpu_buffer_type(dt, rank, dims);
  tpu_record *r = tpu_record_new_on(e, device, dt, tpu_hlo_type_numel(&t));
  if (r) {
    r->grank = t.rank;
    memcpy(r->gdims, t.dims, sizeof(int64_t) * (size_t)t.rank);
  }
  return r;
}

tpu_hlo_type tpu_record_type(const tpu_record *r) { return tpu_hlo_type_make(r->dtype, r->grank, r->gdims); }

tpu_record *tpu_record_new_on(tpu_engine *e, int device, tpu_dtype dt, int64_t numel) {
  tpu_record *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->device = device;
  r->grank = 1;
  r->gdims[0] = numel;
  r->magic = TPU_RECORD_MAGIC;
  atomic_init(&r->refs, 1);
  r->dtype = dt;
  r->numel = numel;
  r->eng = e;
  pthread_mutex_lock(&e->reg.lock);
  r->birth = e->reg.made++;
  if ((e->reg.used + 1) * 2 > e->reg.cap && !tpu_reg_grow(e)) {
    pthread_mutex_unlock(&e->reg.lock);
    free(r);
    return NULL;
  }
  size_t j = tpu_ptr_slot(r, e->reg.cap);
  while (e->reg.slots[j] && e->reg.slots[j] != TPU_TOMB) j = (j + 1) & (e->reg.cap - 1);
  if (!e->reg.slots[j]) e->reg.used++;
  e->reg.slots[j] = r;
  e->reg.live++;
  pthread_mutex_unlock(&e->reg.lock);
  atomic_fetch_add(&e->metrics.records_live, 1);
  return r;
}

void tpu_record_ref(tpu_record *r) { atomic_fetch_add(&r->refs, 1); }

void tpu_record_unref(tpu_record *r) {
  if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
  tpu_engine *e = r->eng;
  if (e) {
    pthread_mutex_lock(&e->reg.lock);
    size_t j = tpu_ptr_slot(r, e->reg.cap);
    while (e->reg.slots[j] && e->reg.slots[j] != r) j = (j + 1) & (e->reg.cap - 1);
    if (e->reg.slots[j] == r) {
      e->reg.slots[j] = TPU_TOMB;
      e->reg.live--;
    }
    pthread_mutex_unlock(&e->reg.lock);
    atomic_fetch_sub(&e->metrics.records_live, 1);
  }
  tpu_rt_buffer_free(r->buf);
  tpu_record_free_shards(r);
  r->magic = 0;
  free(r);
}

tpu_record *tpu_engine_find_record(tpu_engine *e, const void *addr) {
  if (!addr) return NULL;
  tpu_record *found = NULL;
  pthread_mutex_lock(&e->reg.lock);
  size_t j = tpu_ptr_slot(addr, e->reg.cap);
  while (e->reg.slots[j]) {
    if ((const void *)e->reg.slots[j] == addr) {
      found = e->reg.slots[j];
      break;
    }
    j = (j + 1) & (e->reg.cap - 1);
  }
  pthread_mutex_unlock(&e->reg.lock);
  return found;
}

/* A never-written record reads as zeros: give it a zero buffer. */
tpu_status *tpu_record_materialize(tpu_engine *e, tpu_record *r) {
  if (r->buf || r->sh) return NULL;
  size_t nb = (size_t)r->numel * tpu_dtype_size(r->dtype);
  void *zeros = calloc(nb ? nb : 1, 1);
  if (!zeros) return tpu_status_new(TPU_ERR_MEMORY, "out of memory allocating %zu bytes", nb);
  tpu_status *s = tpu_engine_h2d(e, r->device, zeros, r->dtype, r->gdims, r->grank, &r->buf);
  free(zeros);
  return s;
}

void tpu_engine_result_release(tpu_engine_result *res) {
  for (int i = 0; i < res->nout; i++) tpu_record_unref(res->outs[i]);
  res->nout = 0;
}
