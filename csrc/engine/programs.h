/* programs.h: signatures, the program cache (programs.c) and lowering and
 * compiling one call. The memory tier is an open-addressing table of entries
 * keyed by signature bytes; programs missing there are looked up in the disk
 * tier (cache/) before they are compiled, and written to it after. */
#ifndef TPU_ENGINE_PROGRAMS_H
#define TPU_ENGINE_PROGRAMS_H

#include "../cache/cache.h"
#include "../lower/lower.h"
#include "engine.h"

/* An input of a fused program: a record's buffer (rec: its id in the
 * flush's record table), or a recorded op's scalar, host tensor, view
 * offset or RNG state (node, arg, item). */
typedef struct tpu_fin {
  tpu_in_kind kind;
  int node, arg, item, rec;
} tpu_fin;

/* A value check of a fused program: the op it belongs to and its error. */
typedef struct tpu_fcheck {
  const char *op, *msg; /* static */
  int code;
  int node; /* the recorded op's index in the flush (its Python site), or -1 */
} tpu_fcheck;

typedef struct {
  int refs;     /* the cache's and each plan's; 0 for an entry not yet inserted */
  uint8_t *key; /* owned signature bytes */
  size_t keylen;
  uint64_t hash;
  tpu_rt_exec *exec; /* owned */
  int aot;           /* its entry in the TPU target's report (aot_target.c), or -1 */
  tpu_in_plan *in;   /* owned, nin entries */
  int nin;
  tpu_out_plan *out; /* owned, nout entries */
  int nout;
  tpu_ret_plan *ret; /* owned, nret entries */
  int nret;
  int64_t rng_words;
  tpu_fin *fin; /* fused programs: owned inputs (nfin), and the record ids of the outputs */
  int nfin;
  int *fout;
  int nfout;
  tpu_fcheck *fchk; /* fused programs: owned, the value checks, outputs after the nfout records */
  int nfchk;
  /* fused programs compiled while recompiles are explained: hashes of the
   * key's parts (ops, how values flow, shared numbers, what is held) */
  uint64_t ex[4];
  int ex_nodes; /* 0: not recorded */
  /* fused programs over a mesh (spmd.c): the rows (devices), and each record
   * output's sharding and global shape (owned, nfout entries) */
  bool spmd;
  int spmd_rows;
  tpu_sharding *fsh;
  int64_t (*fdims)[TPU_MAX_RANK];
} tpu_cache_entry;

/* The program cache's state: both tiers. */
typedef struct {
  tpu_cache_entry **entries; /* open addressing on hash, owned entries */
  size_t cap, n;
  long max;                    /* programs kept in memory before the cache is emptied */
  long maps_limit;             /* vm.max_map_count; -2 until read, -1 unknown */
  long maps_calls;             /* insertions since the mappings were last counted */
  tpu_dcache *disk;            /* owned; NULL when the disk tier is off */
  char *salt;                  /* owned */
  bool disk_readonly;          /* a write failed: entries are still read, no longer written */
  bool disk_refused_told;      /* an untrusted entry was reported (once a process) */
  bool disk_pending;           /* set_disk_cache was called before the start */
  char *disk_dir, *disk_extra; /* owned: its folder and salt, opened at the start */
  int64_t disk_max;
  int op_programs[TPU_NUM_OPS]; /* programs compiled for each op row (a second one is a recompile) */
  int recompile;                /* the compile under way is op row's program number recompile + 1 */
} tpu_programs;

/* A signature being built. p starts as the caller's buffer (an op's
 * signature fits one on the stack: no allocation per op) and moves to the
 * heap when it outgrows it; tpu_sig_done frees what was allocated. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
  bool oom;
  bool heap; /* p is owned */
} tpu_sig;

/* false when out of memory; max: the memory tier's bound. */
bool tpu_programs_init(tpu_programs *c, long max);
void tpu_programs_free(tpu_programs *c);
/* Opens dir as the disk tier (NULL or "": off), the TPU target's key too;
 * the runtime is open. */
tpu_status *tpu_programs_disk_open(tpu_engine *e, const char *dir, int64_t max_bytes, const char *extra);

void tpu_sig_put(tpu_sig *s, const void *d, size_t n);
void tpu_sig_i64(tpu_sig *s, int64_t v);
void tpu_sig_done(tpu_sig *s);
/* An op's signature: its id and what the lowering depends on in each argument. */
void tpu_sig_build(tpu_sig *s, int op_id, const tpu_arg *args, int nargs);
tpu_cache_entry *tpu_cache_find(tpu_engine *e, const tpu_sig *s, uint64_t h);
/* Inserts c (its first reference); false when out of memory. */
bool tpu_cache_insert(tpu_engine *e, tpu_cache_entry *c);
void tpu_cache_entry_free(tpu_cache_entry *c);
void tpu_classify_views(tpu_arg *args, int nargs);
tpu_status *tpu_engine_compile(tpu_engine *e, const char *text, size_t len, const char *name, tpu_rt_exec **exec);
/* The same with compile options (programs over several devices); NULL: one device. */
tpu_status *tpu_engine_compile_with(tpu_engine *e, const char *text, size_t len, const char *name,
                                    const tpu_rt_compile_opts *o, tpu_rt_exec **exec);
tpu_status *tpu_engine_lower(tpu_engine *e, const tpu_op_row *row, tpu_arg *args, int nargs, tpu_sig *sig, uint64_t h,
                             bool compile, tpu_cache_entry **out);

#endif
