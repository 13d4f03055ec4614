/* fns.h: functions from StableHLO text, by id (fns.c; tpu::stablehlo_call's
 * argument), kept until the engine is freed. */
#ifndef TPU_ENGINE_FNS_H
#define TPU_ENGINE_FNS_H

#include <pthread.h>

#include "engine.h"

typedef struct {
  pthread_mutex_t lock; /* the lowering may run on any thread */
  tpu_hlo_fn **list;    /* owned, by id */
  int n, cap;
} tpu_fns;

void tpu_fns_init(tpu_fns *f);
void tpu_fns_free(tpu_fns *f);
/* The lowering's lookup of an id's function (ctx: the engine). */
const tpu_hlo_fn *tpu_engine_fn_lookup(void *e, int64_t id);

#endif
