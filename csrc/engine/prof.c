/* prof.c: the profiler's record of the engine's work (prof.h).
 *
 * One buffer for the process, allocated at the first session and never
 * freed: a program's completion callback may come from a plugin thread after
 * its session ended (even after the engine was freed), and then writes into
 * a slot that must still exist. Records are made under a mutex, and only
 * while the session's flag is set (checked again under it): after
 * tpu_prof_stop nothing writes a record, so the snapshot and the next
 * session never race with a writer. A completion writes only its slot's end,
 * by compare-and-swap from the pending mark of its session (minus the
 * session's number): a late completion of an earlier session finds another
 * mark and writes nothing.
 */
#define _GNU_SOURCE
#include "prof.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h>
#endif

/* A completion's argument packs the session and the slot into a pointer. */
_Static_assert(sizeof(void *) >= 8, "the profiler packs a session and a slot into a 64-bit pointer");
#define TPU_PROF_SLOT_BITS 20
_Static_assert(TPU_PROF_CAPACITY <= (1 << TPU_PROF_SLOT_BITS), "slot index bits");

typedef struct {
  tpu_prof_record r;
  _Atomic int64_t end; /* EXECUTE: its completion; -(session) while pending; INT64_MIN: never known */
} tpu_prof_slot;

atomic_uint tpu_prof_mask;
static pthread_mutex_t tpu_prof_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(tpu_prof_slot *) tpu_prof_slots; /* TPU_PROF_CAPACITY of them */
static size_t tpu_prof_n;                       /* used by this session */
static uint32_t tpu_prof_session;               /* sessions started; the pending mark */
static uint32_t tpu_prof_flows;
static uint64_t tpu_prof_dropped;
static atomic_uint_fast64_t tpu_prof_made;
static atomic_int tpu_prof_pending; /* this session's EXECUTEs whose completion has not come */
static _Thread_local uint64_t tpu_prof_corr;
static _Thread_local int32_t tpu_prof_tid;

int64_t tpu_prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int32_t tpu_prof_thread(void) {
#ifdef __linux__
  if (!tpu_prof_tid) tpu_prof_tid = (int32_t)syscall(SYS_gettid);
#endif
  return tpu_prof_tid;
}

void tpu_prof_start(unsigned what) {
  pthread_mutex_lock(&tpu_prof_lock);
  tpu_prof_slot *s = atomic_load(&tpu_prof_slots);
  if (!s) {
    s = calloc(TPU_PROF_CAPACITY, sizeof *s);
    atomic_store(&tpu_prof_slots, s);
  }
  if (s) { /* else out of memory: nothing is recorded */
    if (++tpu_prof_session == 0) tpu_prof_session = 1;
    tpu_prof_n = 0;
    tpu_prof_dropped = 0;
    atomic_store(&tpu_prof_pending, 0);
    atomic_store(&tpu_prof_mask, what & (TPU_PROF_HOST | TPU_PROF_DEVICE));
  }
  pthread_mutex_unlock(&tpu_prof_lock);
}

void tpu_prof_stop(void) {
  pthread_mutex_lock(&tpu_prof_lock);
  atomic_store(&tpu_prof_mask, 0);
  pthread_mutex_unlock(&tpu_prof_lock);
  /* completions on their way (a plugin thread runs the callback after the
   * event is ready, maybe after the host's wait returned): 200 ms at most */
  for (int k = 0; k < 200 && atomic_load(&tpu_prof_pending) > 0; k++) nanosleep(&(struct timespec){0, 1000000}, NULL);
}

void tpu_prof_set_correlation(uint64_t id) { tpu_prof_corr = id; }

uint64_t tpu_prof_total(void) { return atomic_load(&tpu_prof_made); }

/* A new record (the lock held, the session on), or NULL when the buffer is
 * full. end: the EXECUTE's end or pending mark. */
static tpu_prof_slot *tpu_prof_push(tpu_prof_kind kind, int dev, int64_t t0, int64_t t1, int64_t bytes, uint32_t flow,
                                    const char *fmt, va_list ap) {
  if (tpu_prof_n == TPU_PROF_CAPACITY) {
    tpu_prof_dropped++;
    return NULL;
  }
  tpu_prof_slot *s = &atomic_load(&tpu_prof_slots)[tpu_prof_n++];
  tpu_prof_record *r = &s->r;
  r->t0 = t0;
  r->t1 = t1;
  r->bytes = bytes;
  r->corr = tpu_prof_corr;
  r->flow = flow;
  r->tid = tpu_prof_thread();
  r->kind = (int16_t)kind;
  r->dev = (int16_t)dev;
  r->name[0] = 0;
  if (fmt) vsnprintf(r->name, sizeof r->name, fmt, ap);
  atomic_store(&s->end, t1);
  atomic_fetch_add(&tpu_prof_made, 1);
  return s;
}

void tpu_prof_host(tpu_prof_kind kind, int dev, int64_t t0, int64_t bytes, const char *name, ...) {
  int64_t t1 = tpu_prof_now();
  bool copy = kind == TPU_PROF_UPLOAD || kind == TPU_PROF_DOWNLOAD; /* a device span too */
  pthread_mutex_lock(&tpu_prof_lock);
  unsigned m = atomic_load(&tpu_prof_mask);
  if ((m & TPU_PROF_HOST) || (copy && m)) {
    va_list ap;
    va_start(ap, name);
    tpu_prof_push(kind, dev, t0, t1, bytes, 0, name, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&tpu_prof_lock);
}

/* A new flow id (the lock held); never 0, which means none. */
static uint32_t tpu_prof_flow(void) {
  if (++tpu_prof_flows == 0) tpu_prof_flows = 1;
  return tpu_prof_flows;
}

/* A program's completion: the end of its EXECUTE, if the slot still waits
 * for it in the same session. */
static void tpu_prof_done(void *user) {
  uintptr_t code = (uintptr_t)user;
  tpu_prof_slot *s = &atomic_load(&tpu_prof_slots)[code & ((1u << TPU_PROF_SLOT_BITS) - 1)];
  int64_t pending = -(int64_t)(code >> TPU_PROF_SLOT_BITS);
  if (atomic_compare_exchange_strong(&s->end, &pending, tpu_prof_now())) atomic_fetch_sub(&tpu_prof_pending, 1);
}

void tpu_prof_launch(tpu_rt *rt, int dev, int64_t t0, tpu_rt_event *done, const char *name, ...) {
  int64_t t1 = tpu_prof_now();
  va_list ap;
  tpu_prof_slot *x = NULL;
  uintptr_t code = 0;
  pthread_mutex_lock(&tpu_prof_lock);
  unsigned m = atomic_load(&tpu_prof_mask);
  uint32_t flow = m ? tpu_prof_flow() : 0;
  if (m & TPU_PROF_HOST) {
    va_start(ap, name);
    tpu_prof_push(TPU_PROF_LAUNCH, dev, t0, t1, 0, flow, name, ap);
    va_end(ap);
  }
  if (m & TPU_PROF_DEVICE) {
    va_start(ap, name);
    x = tpu_prof_push(TPU_PROF_EXECUTE, dev, t0, done ? -(int64_t)tpu_prof_session : t1, 0, flow, name, ap);
    va_end(ap);
    if (x && done) {
      code = ((uintptr_t)tpu_prof_session << TPU_PROF_SLOT_BITS) | (uintptr_t)(x - atomic_load(&tpu_prof_slots));
      atomic_fetch_add(&tpu_prof_pending, 1);
    }
  }
  pthread_mutex_unlock(&tpu_prof_lock);
  if (!code) return;
  tpu_status *s = tpu_rt_event_on_ready(rt, done, tpu_prof_done, (void *)code);
  if (s) { /* the plugin cannot say when it completes: the span is left out */
    tpu_status_free(s);
    int64_t pending = -(int64_t)(code >> TPU_PROF_SLOT_BITS);
    if (atomic_compare_exchange_strong(&x->end, &pending, INT64_MIN)) atomic_fetch_sub(&tpu_prof_pending, 1);
  }
}

void tpu_prof_ran(const int *devs, int ndev, int64_t t0, const char *name, ...) {
  int64_t t1 = tpu_prof_now();
  va_list ap;
  pthread_mutex_lock(&tpu_prof_lock);
  unsigned m = atomic_load(&tpu_prof_mask);
  uint32_t flow = m ? tpu_prof_flow() : 0;
  if ((m & TPU_PROF_HOST) && ndev > 0) {
    va_start(ap, name);
    tpu_prof_push(TPU_PROF_LAUNCH, devs[0], t0, t1, 0, flow, name, ap);
    va_end(ap);
  }
  for (int k = 0; k < ndev && (m & TPU_PROF_DEVICE); k++) {
    va_start(ap, name);
    tpu_prof_push(TPU_PROF_EXECUTE, devs[k], t0, t1, 0, k ? 0 : flow, name, ap); /* one arrow: to the first */
    va_end(ap);
  }
  pthread_mutex_unlock(&tpu_prof_lock);
}

/* Devices whose programs' starts are placed after the previous completion. */
#define TPU_PROF_DEVS 64

size_t tpu_prof_snapshot(tpu_prof_record *out, size_t cap, uint64_t *dropped) {
  int64_t last[TPU_PROF_DEVS] = {0}; /* the latest completion seen on each device */
  pthread_mutex_lock(&tpu_prof_lock);
  tpu_prof_slot *s = atomic_load(&tpu_prof_slots);
  size_t n = s ? tpu_prof_n : 0;
  for (size_t k = 0; k < n && k < cap; k++) {
    tpu_prof_record r = s[k].r;
    if (r.kind == TPU_PROF_EXECUTE) {
      r.t1 = atomic_load(&s[k].end);
      if (r.t1 < 0) r.t1 = -1; /* never completed (or not known): left out by the reader */
      /* launched while the device still ran the previous program: it
       * started when that one completed (devices run their programs in
       * launch order; one that overlapped keeps its launch time) */
      if (r.t1 >= 0 && r.dev >= 0 && r.dev < TPU_PROF_DEVS) {
        if (last[r.dev] > r.t0 && last[r.dev] <= r.t1) r.t0 = last[r.dev];
        if (r.t1 > last[r.dev]) last[r.dev] = r.t1;
      }
    }
    out[k] = r;
  }
  if (dropped) *dropped = tpu_prof_dropped;
  pthread_mutex_unlock(&tpu_prof_lock);
  return n;
}
