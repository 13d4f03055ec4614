/* plan.h: graph plans (plan.c): torch.compile captures and torch.tpu.graph,
 * a flushed recording's program kept with where its inputs and outputs come
 * from. */
#ifndef TPU_ENGINE_PLAN_H
#define TPU_ENGINE_PLAN_H

#include "engine.h"

typedef struct {
  struct tpu_plan *live; /* every live plan, released with the engine */
} tpu_plans;

/* Releases every live plan's hold on the engine (the engine is freed). */
void tpu_plans_release(tpu_engine *e);

#endif
