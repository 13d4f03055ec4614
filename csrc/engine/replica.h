/* replica.h: replica-mode collectives (replica.c): one collective over n
 * local devices as one program of n replicas. */
#ifndef TPU_ENGINE_REPLICA_H
#define TPU_ENGINE_REPLICA_H

#include "engine.h"

/* Compiled programs of replica-mode collectives kept. */
#define TPU_RPROGS 32

typedef struct {
  struct tpu_rprog {
    char *text; /* owned: the program's text, its key */
    size_t len;
    tpu_rt_exec *exec; /* owned */
  } progs[TPU_RPROGS]; /* replaced round-robin */
  int next;
} tpu_replicas;

/* Frees the kept programs of replica-mode collectives. */
void tpu_replica_release(tpu_engine *e);

#endif
