/* engine_impl.h: the engine's state, composed of its parts' (never included
 * above the engine), and the inline helpers every part shares.
 *
 * The engine is a stack of files, each calling only those below it
 * (tools/engine_graph.py checks it); each part declares its state and what
 * it lends the parts above in its own header:
 *   prof.c        the record torch's profiler reads (prof.h): any file above
 *                 records into it while a profiling session runs
 *   msgs.c        messages pending for the binding: warnings, notes, compile
 *                 log lines (msgs.h)
 *   record.c      the record registry (live records by address, under a
 *                 mutex), record helpers, a flush's record table (record.h)
 *   fns.c         functions from StableHLO text, by id (fns.h)
 *   aot_target.c  compiling every program for a TPU topology as well
 *                 (aot_target.h)
 *   programs.c    signatures, the program cache's memory and disk tiers,
 *                 lowering one call and compiling (programs.h)
 *   launch.c      program inputs (records, scalar slots, the generator),
 *                 launching, the strict mode's ring of events, value checks
 *                 (launch.h)
 *   spmd.c        tensors laid over a mesh, programs over its devices (spmd.h)
 *   fuse.c        fused mode: recording, pruning, keying and running a flush;
 *                 captures (fuse.h)
 *   plan.c        graph plans: torch.compile captures and torch.tpu.graph
 *                 (plan.h)
 *   replica.c     replica-mode collectives (replica.h)
 *   engine.c      the facade: the engine's life and settings, one call by
 *                 eager mode, uploads, downloads, transfers, meshes, sync
 */
#ifndef TPU_ENGINE_IMPL_H
#define TPU_ENGINE_IMPL_H

#include <time.h>

#include "aot_target.h"
#include "engine.h"
#include "fns.h"
#include "fuse.h"
#include "launch.h"
#include "msgs.h"
#include "plan.h"
#include "programs.h"
#include "record.h"
#include "replica.h"
#include "spmd.h"

struct tpu_engine {
  /* the facade's: the runtime and the settings every part reads */
  tpu_rt *rt;             /* owned; NULL until the start */
  tpu_rt_options rt_opts; /* the strings owned */
  char *rt_error;         /* owned or NULL: why the runtime cannot start (every start returns it) */
  tpu_code rt_error_code;
  tpu_metrics metrics;
  tpu_mode mode;
  int dev; /* the device of the call, flush or replay in progress */
  bool value_checks, debug, dump_hlo;
  bool explain;                /* TORCHTPU_EXPLAIN_RECOMPILES */
  bool shardy;                 /* SPMD programs use the Shardy partitioner (else GSPMD) */
  bool donate;                 /* fused programs take the buffers of records they rewrite */
  tpu_step_boundary step;      /* fused mode: where a step's program ends */
  bool mesh_used;              /* a tensor was laid over a mesh (TPU_STEP_AUTO) */
  bool tpu_like;               /* a TPU, or compiling for one (TORCHTPU_AOT_TOPOLOGY): TPU_STEP_AUTO */
  bool donate_waits;           /* the plugin blocks the host to donate a buffer in use (CPU) */
  bool exact_div;              /* the compiler turns divisions into reciprocal products (CPU) */
  tpu_hlo_precision precision; /* of f32 matmuls and convolutions: part of every key */
  uint64_t rng_seed, rng_offset;
  tpu_where_fn where; /* the caller's Python stack, asked for ops with value checks */
  /* the parts', bottom first */
  tpu_msgs msgs;
  tpu_registry reg;
  tpu_fns fns;
  tpu_aot_state aot;
  tpu_programs cache;
  tpu_launch launch;
  tpu_fuse fuse;
  tpu_plans plans;
  tpu_replicas replica;
};

static inline int64_t tpu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Copies between host and device, each a transfer of the profiler's record
 * while it runs (prof.h). h2d: onto local device dev; d2h: from b's device. */
static inline tpu_status *tpu_engine_h2d(tpu_engine *e, int dev, const void *data, tpu_dtype dt, const int64_t *dims,
                                         int rank, tpu_rt_buffer **out) {
  int64_t p0 = tpu_prof_t0();
  tpu_status *s = tpu_rt_buffer_from_host_on(e->rt, dev, data, dt, dims, rank, out);
  if (p0 && !s) {
    int64_t n = (int64_t)tpu_dtype_size(dt);
    for (int k = 0; k < rank; k++) n *= dims[k];
    tpu_prof_host(TPU_PROF_UPLOAD, dev, p0, n, NULL);
  }
  return s;
}
static inline tpu_status *tpu_engine_d2h(tpu_engine *e, tpu_rt_buffer *b, void *dst, size_t nbytes) {
  int64_t p0 = tpu_prof_t0();
  tpu_status *s = tpu_rt_buffer_to_host(e->rt, b, dst, nbytes);
  if (p0 && !s) tpu_prof_host(TPU_PROF_DOWNLOAD, tpu_rt_buffer_device(b), p0, (int64_t)nbytes, NULL);
  return s;
}

/* The tensor a program input names: an argument, or an item of a list. */
static inline tpu_tref *tpu_arg_tref(tpu_arg *args, const tpu_in_plan *p) {
  tpu_arg *a = &args[p->arg];
  return p->item >= 0 ? &a->list[p->item] : &a->t;
}

/* The generator state a program's rng_bit_generator starts from: the seed
 * (Threefry's key) and a counter made from the op's offset. An op moves the
 * offset on by the words it draws (numel + 1 a draw); one offset unit is
 * TPU_RNG_COUNTERS Threefry counters of 2 words each. DTensor moves the
 * offset itself, by elements, CUDA's convention (a shard starts at its index
 * x its numel, rounded up to 4: torch.distributed.tensor._random); 32 words
 * an element cover every sampler (8 at most: a float64 truncated normal),
 * so the shards of a sharded random op never draw the same bits. */
enum { TPU_RNG_COUNTERS = 16 };
static inline void tpu_rng_key(uint64_t seed, uint64_t offset, uint64_t st[2]) {
  st[0] = seed;
  st[1] = offset * (uint64_t)TPU_RNG_COUNTERS; /* wraps after 2^60 units: harmless */
}

#endif
