/* record.h: the record registry (record.c): every live record by address,
 * under a mutex (torch frees storages from any thread, and a pointer coming
 * back from Python is looked up before use); and what the parts above share
 * about records: a never-written one's zeros, a mesh record's shards, a
 * flush's table of the records it names. */
#ifndef TPU_ENGINE_RECORD_H
#define TPU_ENGINE_RECORD_H

#include <pthread.h>

#include "engine.h"

typedef struct {
  pthread_mutex_t lock;
  tpu_record **slots; /* open addressing; NULL empty, a tombstone deleted */
  size_t cap, used, live;
  uint64_t made; /* records made: each one's birth */
} tpu_registry;

/* The records a flush names, by flush id (fuse.c numbers them). */
typedef struct {
  tpu_record **r; /* borrowed */
  int n, cap;
  bool oom;
} tpu_rectab;

/* false when out of memory. */
bool tpu_registry_init(tpu_registry *g);
/* The engine is freed: records still alive belong to tensors that outlive it
 * (process exit); their buffers are dropped so that the client can be
 * destroyed cleanly. */
void tpu_registry_free(tpu_registry *g);
/* A never-written record reads as zeros: gives it a zero buffer. */
tpu_status *tpu_record_materialize(tpu_engine *e, tpu_record *r);
/* Frees a mesh record's shards and sharding (spmd.c): it is a one-device record again. */
void tpu_record_free_shards(tpu_record *r);

#endif
