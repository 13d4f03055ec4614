/* aot_target.h: every program compiled for a TPU topology as well
 * (aot_target.c; TORCHTPU_AOT_TOPOLOGY), by the runtime's compile-only target
 * (csrc/runtime/aot.h), and the answers kept for torchtpu.aot_report(). */
#ifndef TPU_ENGINE_AOT_TARGET_H
#define TPU_ENGINE_AOT_TARGET_H

#include "../cache/cache.h"
#include "engine.h"

typedef struct {
  char *plugin, *topology; /* owned: the compile-only target to open at the start */
  bool strict;
  bool mesh_only;        /* TORCHTPU_SPMD_COMPILE_ONLY: programs over a mesh only compiled here */
  tpu_rt_target *target; /* owned; NULL when off */
  /* the program cache's disk tier, set by programs.c: the key's prefix of
   * the target's programs (owned; NULL: not cached on disk), the tier
   * (borrowed; NULL when off), and whether it is still written */
  char *salt;
  tpu_dcache *disk;
  bool disk_readonly;
  tpu_aot_prog *progs; /* owned, n entries */
  int n, cap;
  bool warned;    /* a refused program was reported (not strict) */
  int last;       /* the entry of the program the last compile named (-1: none) */
  char what[128]; /* fuse.c: the ops of the flush being compiled, for its name ("" otherwise) */
} tpu_aot_state;

/* The program (compiled for the plugin) compiled for the TPU target too,
 * when one is set; an error fails the call only in strict mode. */
tpu_status *tpu_engine_aot_compile(tpu_engine *e, const char *text, size_t len, const char *name,
                                   const tpu_rt_compile_opts *o);
/* A program over a mesh on a compile-only mesh (mesh_only): compiled for the
 * target only, its refusal always an error; *opt receives a copy of the
 * program as libtpu optimized it (owned), from which the layouts its
 * partitioner chose are read. Never from the disk tier. */
tpu_status *tpu_engine_aot_compile_only(tpu_engine *e, const char *text, size_t len, const char *name,
                                        const tpu_rt_compile_opts *o, tpu_rt_module *opt);
/* A program of report entry `aot` (tpu_cache_entry.aot) was launched. */
void tpu_engine_aot_ran(tpu_engine *e, int aot);
/* Whether programs over a mesh are compiled for the target only (and the
 * chips a mesh may then span: the target's; 0 when not compile-only). */
int tpu_engine_mesh_compile_only(const tpu_engine *e);
tpu_status *tpu_engine_aot_open(tpu_engine *e);
void tpu_engine_aot_free(tpu_engine *e);

#endif
