/* prof.h: what the engine did while torch's profiler ran, for its trace
 * (prof.c keeps it; csrc/guard/profiler.cpp, torch's profiler session for the
 * tpu, reads it through csrc/python/prof_api.h).
 *
 * A profiling session (tpu_prof_start .. tpu_prof_stop) keeps records in one
 * bounded buffer: host spans (compiles, launches, transfers, waits at sync
 * points) and the device spans of launched programs, which end when the
 * plugin says their computation completed (tpu_rt_event_on_ready, on a
 * plugin thread). Outside a session each instrumented call reads one flag
 * (tpu_prof_t0) and records nothing. Times are CLOCK_REALTIME nanoseconds,
 * the clock of torch's profiler (c10::getTime).
 *
 * The part above `#ifndef __cplusplus` is plain C that C++ includes too. */
#ifndef TPU_PROF_H
#define TPU_PROF_H

#include <stddef.h>
#include <stdint.h>

/* What a session records (tpu_prof_start's `what`). */
enum {
  TPU_PROF_HOST = 1,  /* host spans: compiles, launches, transfers, waits */
  TPU_PROF_DEVICE = 2 /* device spans: programs from launch to completion, transfers */
};

typedef enum {
  TPU_PROF_COMPILE,  /* host: a program compiled (name: the op, or "fused program of N ops") */
  TPU_PROF_LOAD,     /* host: a program read from the disk cache instead */
  TPU_PROF_LAUNCH,   /* host: a program handed to the plugin (flow: its EXECUTE's) */
  TPU_PROF_EXECUTE,  /* device: a program, from when it could start to its completion */
  TPU_PROF_UPLOAD,   /* host and device: a host-to-device copy of `bytes` */
  TPU_PROF_DOWNLOAD, /* host and device: a device-to-host copy of `bytes` */
  TPU_PROF_WAIT      /* host: a sync point waiting for launched programs */
} tpu_prof_kind;

/* The buffer holds at most this many records a session; later ones are
 * counted as dropped. */
#define TPU_PROF_CAPACITY (1 << 16)

typedef struct {
  int64_t t0, t1; /* start and end (ns); EXECUTE: t1 < 0 when it never completed */
  int64_t bytes;  /* transfers; else 0 */
  uint64_t corr;  /* torch's correlation id of the op the thread ran (0: none) */
  uint32_t flow;  /* a LAUNCH and its program's EXECUTE share it; 0: none */
  int32_t tid;    /* the host thread that made it (the system's id) */
  int16_t kind;   /* tpu_prof_kind */
  int16_t dev;    /* the local device (tpu:<dev>) */
  char name[64];  /* what ran: "aten::add.Tensor", "fused program of 12 ops"; "" for transfers and waits */
} tpu_prof_record;

#ifndef __cplusplus
#include <stdatomic.h>

#include "../runtime/runtime.h"

/* A session: what it records (TPU_PROF_HOST | TPU_PROF_DEVICE); the buffer
 * is emptied. A session started while another runs replaces it. */
void tpu_prof_start(unsigned what);
/* Ends the session: nothing more is recorded. Programs launched in it and
 * still running are waited for briefly (their completion ends their span;
 * torch synchronizes the device first when it profiles it). */
void tpu_prof_stop(void);
/* Copies the session's records (at most cap) into out, in the order they
 * were made; returns how many there are. An EXECUTE starts at its launch or
 * at the completion of the program before it on its device, whichever is
 * later (PJRT reports completions only). *dropped: records the full buffer
 * refused. */
size_t tpu_prof_snapshot(tpu_prof_record *out, size_t cap, uint64_t *dropped);
/* The calling thread's torch op (its profiler's correlation id; 0: none):
 * records made on the thread name it. */
void tpu_prof_set_correlation(uint64_t id);
/* Records made since the process started (a test's witness that nothing is
 * recorded outside a session). */
uint64_t tpu_prof_total(void);

/* The session's TPU_PROF_* bits; 0 outside a session. */
extern atomic_uint tpu_prof_mask;
int64_t tpu_prof_now(void);
/* The start of an instrumented call: its time in a session, else 0 (then the
 * call records nothing: one relaxed load). */
static inline int64_t tpu_prof_t0(void) {
  return atomic_load_explicit(&tpu_prof_mask, memory_order_relaxed) ? tpu_prof_now() : 0;
}

/* The recorders, called with the t0 of tpu_prof_t0 when it was not 0; the
 * end is now. name: printf format (NULL: none). */
/* A host span (COMPILE, LOAD, WAIT; UPLOAD and DOWNLOAD, which are also
 * device spans). */
void tpu_prof_host(tpu_prof_kind kind, int dev, int64_t t0, int64_t bytes, const char *name, ...)
    __attribute__((format(printf, 5, 6)));
/* A program launched on dev: its LAUNCH, and its EXECUTE, which ends when
 * done completes (done NULL: it ran to completion in the call). */
void tpu_prof_launch(tpu_rt *rt, int dev, int64_t t0, tpu_rt_event *done, const char *name, ...)
    __attribute__((format(printf, 5, 6)));
/* A program that ran to completion in the call on each of ndev devices. */
void tpu_prof_ran(const int *devs, int ndev, int64_t t0, const char *name, ...) __attribute__((format(printf, 4, 5)));
#endif

#endif
