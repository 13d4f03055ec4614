/* launch.h: feeding and launching programs (launch.c): program inputs
 * (records, scalar slots, the generator's state), the in-flight ring of
 * strict mode, and the value checks read at the next sync point. */
#ifndef TPU_ENGINE_LAUNCH_H
#define TPU_ENGINE_LAUNCH_H

#include "programs.h"

/* Launched, unfinished computations kept in strict mode; when full, the
 * oldest is waited for. */
#define TPU_INFLIGHT 256

/* Small device buffers for scalar inputs (Python numbers, view offsets),
 * keyed by dtype and bit pattern. Program inputs are never donated, so one
 * buffer can serve every call that passes the same value: a loop that reuses
 * a learning rate or an alpha uploads it once. Direct-mapped, owned. */
#define TPU_SCALAR_SLOTS 256
typedef struct {
  tpu_dtype dtype;
  int dev;
  uint8_t bits[16];
  uint64_t epoch; /* the call that last used it */
  tpu_rt_buffer *buf;
} tpu_scalar_slot;

typedef struct {
  tpu_scalar_slot scalars[TPU_SCALAR_SLOTS];
  uint64_t epoch; /* calls started */
  struct {
    tpu_rt_event *ev; /* owned */
    const char *op;   /* the table's name (static); NULL for a fused program */
  } inflight[TPU_INFLIGHT];
  int head, count;      /* a ring, oldest first */
  tpu_status *deferred; /* owned: the first asynchronous failure, until reported */
  struct {
    tpu_rt_buffer *buf; /* owned: a 0-d pred, true when the check failed */
    tpu_fcheck what;
    char *site; /* owned or NULL: where Python called the op */
  } *chk;       /* value checks of launched programs, read at the next sync point */
  int nchk, capchk;
} tpu_launch;

/* Frees the scalar slots and the check list (after the last wait). */
void tpu_launch_free(tpu_launch *l);
void tpu_inflight_pop(tpu_engine *e);
void tpu_inflight_reap(tpu_engine *e);
tpu_status *tpu_checks_read(tpu_engine *e);
void tpu_check_push(tpu_engine *e, tpu_rt_buffer *b, tpu_fcheck what, char *site);
tpu_status *tpu_engine_wait(tpu_engine *e);
tpu_status *tpu_check_overlap(const tpu_op_row *row, tpu_arg *args, const tpu_cache_entry *c);
tpu_dtype tpu_scalar_bits(const tpu_arg *a, uint8_t bits[16]);
/* The dtype and bytes of a program input that is a value, not a buffer: a
 * Python number (TPU_IN_SCALAR, _SCALAR32), a view's offset (TPU_IN_OFFSET,
 * _OFFSET32) or a CPU scalar (TPU_IN_HOST_TENSOR). */
tpu_dtype tpu_input_bits(const tpu_in_plan *p, tpu_arg *args, uint8_t bits[16]);
tpu_status *tpu_input_buffer(tpu_engine *e, const tpu_in_plan *p, tpu_arg *args, tpu_record *rec, uint64_t rng_seed,
                             uint64_t rng_offset, tpu_rt_buffer **b, tpu_rt_buffer **temp);
tpu_status *tpu_engine_launch(tpu_engine *e, tpu_rt_exec *exec, tpu_rt_buffer **in, int nin, tpu_rt_buffer **out,
                              const char *name, int nops);
/* The profiler's record of exec, which ran to completion on its rows'
 * devices since p0: "<what> over N devices". */
void tpu_prof_rows(tpu_rt_exec *exec, int64_t p0, const char *what);

#endif
