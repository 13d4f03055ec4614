/* fuse.h: fused mode (fuse.c): the recorded ops, the foreach call recording
 * now, and the capture of a graph (the recording plan.c keeps). */
#ifndef TPU_ENGINE_FUSE_H
#define TPU_ENGINE_FUSE_H

#include "programs.h"
#include "record.h"

/* A recorded op (fused mode): a deep copy of its parsed arguments (the
 * records they name are referenced by the graph), its signature and plans,
 * and the records of its new outputs. */
typedef struct {
  const tpu_op_row *row;
  int op_id;
  tpu_arg *args; /* owned: one block holding args, their TENSORS lists, outrec and sig */
  int nargs;
  uint8_t *sig; /* in the args block */
  size_t siglen;
  tpu_record **outrec; /* in the args block; graph references */
  int nnew;
  uint64_t rng_seed, rng_offset; /* the generator's key when recorded, and the offset reserved for the op */
  uint32_t group;                /* the foreach call the op is an item of; 0: none */
  uint32_t share;                /* bit a: Python number a is read from node share_from's input */
  int share_from;                /* the group's first node of the same op */
  char *site;                    /* owned or NULL: where Python called an op with value checks */
} tpu_node;

typedef struct {
  tpu_node *nodes; /* the recorded ops, in order (owned) */
  int nnodes, capnodes;
  int cap;                      /* TORCHTPU_FUSED_MAX_OPS: a flush when reached */
  int dev;                      /* the device of the recorded ops */
  uint64_t epoch;               /* flushes started */
  uint32_t fe_group, fe_groups; /* the foreach call recording now (0: none), calls seen */
  int fe_first;                 /* the node its items start at */
  bool capturing;               /* between tpu_engine_capture_begin and _end */
  bool capture_split;           /* a flush ran during the capture: the recording is not the whole graph */
  bool capture_whole;           /* a torch.tpu.graph capture: nothing may run until it ends */
  uint64_t capture_birth, capture_rng;
} tpu_fuse;

tpu_status *tpu_engine_record(tpu_engine *e, const tpu_op_row *row, int op_id, tpu_arg *args, int nargs,
                              const tpu_sig *sig, tpu_cache_entry *c, tpu_engine_result *res);
void tpu_nodes_release(tpu_engine *e);
/* The engine is freed: the recorded ops are released, unrun. */
void tpu_fuse_free(tpu_engine *e);
tpu_status *tpu_flush_prepare(tpu_engine *e, tpu_flush_reason reason, tpu_rectab *tab, tpu_cache_entry **out);
tpu_status *tpu_fuse_run(tpu_engine *e, tpu_cache_entry *c, tpu_rectab *tab);
void tpu_steps_throttle(tpu_engine *e);

#endif
