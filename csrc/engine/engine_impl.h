/* engine_impl.h: the engine's private state, shared by its files (never
 * included above the engine).
 *
 * The engine is split by concern, each file using only those below it:
 *   prof.c      the record torch's profiler reads (prof.h): any file below
 *               records into it while a profiling session runs
 *   record.c    the record registry (live records by address, under a mutex)
 *   programs.c  signatures, the in-memory program cache, the disk tier's
 *               glue, lowering one call and compiling
 *   launch.c    program inputs (records, scalar slots, the generator),
 *               launching, the strict mode's ring of events, value checks
 *   fuse.c      fused mode: recording, pruning, keying and running a flush
 *   plan.c      graph plans: torch.compile captures and torch.tpu.graph
 *   fns.c       functions from StableHLO text, by id (tpu::stablehlo_call)
 *   aot.c       compiling every program for a TPU topology as well
 *   engine.c    the facade: the engine's life and settings, one call by
 *               eager mode, uploads, downloads, sync
 */
#ifndef TPU_ENGINE_IMPL_H
#define TPU_ENGINE_IMPL_H

#include <pthread.h>
#include <time.h>

#include "../cache/cache.h"
#include "../lower/lower.h"
#include "engine.h"

/* Launched, unfinished computations kept in strict mode; when full, the
 * oldest is waited for. */
#define TPU_INFLIGHT 256
/* Compiled programs of replica-mode collectives kept (replica.c). */
#define TPU_RPROGS 32

typedef struct {
  int refs;     /* the cache's and each plan's; 0 for an entry not yet inserted */
  uint8_t *key; /* owned signature bytes */
  size_t keylen;
  uint64_t hash;
  tpu_rt_exec *exec; /* owned */
  tpu_in_plan *in;   /* owned, nin entries */
  int nin;
  tpu_out_plan *out; /* owned, nout entries */
  int nout;
  tpu_ret_plan *ret; /* owned, nret entries */
  int nret;
  int64_t rng_words;
  struct tpu_fin *fin; /* fused programs: owned inputs (nfin), and the record ids of the outputs */
  int nfin;
  int *fout;
  int nfout;
  struct tpu_fcheck *fchk; /* fused programs: owned, the value checks, outputs after the nfout records */
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

struct tpu_engine {
  tpu_rt *rt;       /* owned; NULL until the start */
  tpu_hlo_fn **fns; /* owned: functions from StableHLO text, by id (fns.c) */
  int nfns, capfns;
  pthread_mutex_t fns_lock;
  tpu_rt_options rt_opts; /* the strings owned */
  char *rt_error;         /* owned or NULL: why the runtime cannot start (every start returns it) */
  tpu_code rt_error_code;
  long program_cache_size; /* programs kept in memory before the cache is emptied */
  long maps_limit;         /* vm.max_map_count; -2 until read, -1 unknown */
  long maps_calls;         /* insertions since the mappings were last counted */
  bool value_checks, debug, dump_hlo;
  bool disk_pending;           /* set_disk_cache was called before the start */
  char *disk_dir, *disk_extra; /* owned: its folder and salt, opened at the start */
  int64_t disk_max;
  tpu_scalar_slot scalars[TPU_SCALAR_SLOTS];
  uint64_t epoch; /* calls started */
  tpu_metrics metrics;
  pthread_mutex_t reg_lock;
  tpu_record **reg; /* open addressing; NULL empty, TOMB deleted */
  size_t reg_cap, reg_used, reg_live;
  tpu_cache_entry **cache; /* open addressing on hash, owned entries */
  size_t cache_cap, cache_n;
  uint64_t rng_seed, rng_offset;
  tpu_hlo_precision precision; /* of f32 matmuls and convolutions: part of every key */
  tpu_dcache *disk;            /* owned; NULL when the disk tier is off */
  char *salt;                  /* owned */
  bool disk_readonly;          /* a write failed: entries are still read, no longer written */
  bool disk_refused_told;      /* an untrusted entry was reported (once a process) */
  char *warnings[8];           /* owned, pending for the binding */
  int nwarnings;
  tpu_mode mode;
  int dev;      /* the device of the call, flush or replay in progress */
  int fuse_dev; /* the device of the recorded ops (fused mode) */
  bool shardy;  /* SPMD programs use the Shardy partitioner (else GSPMD) */
  struct {
    tpu_rt_event *ev; /* owned */
    const char *op;   /* the table's name (static); NULL for a fused program */
  } inflight[TPU_INFLIGHT];
  int ihead, icount;    /* a ring, oldest first */
  tpu_status *deferred; /* owned: the first asynchronous failure, until reported */
  struct {
    tpu_rt_buffer *buf; /* owned: a 0-d pred, true when the check failed */
    tpu_fcheck what;
    char *site; /* owned or NULL: where Python called the op */
  } *chk;       /* value checks of launched programs, read at the next sync point */
  int nchk, capchk;
  tpu_where_fn where; /* the caller's Python stack, asked for ops with value checks */
  tpu_node *nodes;    /* fused mode: the recorded ops, in order (owned) */
  int nnodes, capnodes, fuse_cap;
  bool donate;         /* fused programs take the buffers of records they rewrite */
  bool donate_waits;   /* the plugin blocks the host to donate a buffer in use (CPU) */
  bool exact_div;      /* the compiler turns divisions into reciprocal products (CPU) */
  uint64_t fuse_epoch; /* flushes started */
  uint64_t records_made;
  bool capturing;     /* between tpu_engine_capture_begin and _end */
  bool capture_split; /* a flush ran during the capture: the recording is not the whole graph */
  bool capture_whole; /* a torch.tpu.graph capture: nothing may run until it ends */
  uint64_t capture_birth, capture_rng;
  struct tpu_plan *plans;       /* every live plan, released with the engine */
  uint32_t fe_group, fe_groups; /* the foreach call recording now (0: none), calls seen */
  int fe_first;                 /* the node its items start at */
  bool explain;                 /* TORCHTPU_EXPLAIN_RECOMPILES */
  char *notes[8];               /* owned: explanations pending for the binding */
  char *logs[16];               /* owned: compile lines pending for the binding (the newest kept) */
  int nlogs;
  int op_programs[TPU_NUM_OPS]; /* programs compiled for each op row (a second one is a recompile) */
  int recompile;                /* the compile under way is op row's program number recompile + 1 */
  int nnotes;
  struct tpu_rprog {
    char *text; /* owned: the program's text, its key */
    size_t len;
    tpu_rt_exec *exec;  /* owned */
  } rprogs[TPU_RPROGS]; /* replica-mode collectives' programs, replaced round-robin */
  int rprog_next;
  char *aot_plugin, *aot_topology; /* owned: the compile-only target to open at the start (aot.c) */
  bool aot_strict;
  tpu_rt_target *aot;      /* owned; NULL when off */
  char *aot_salt;          /* owned: the disk key's prefix of its programs; NULL: not cached on disk */
  tpu_aot_prog *aot_progs; /* owned, naot entries */
  int naot, capaot;
  bool aot_warned;    /* a refused program was reported (not strict) */
  char aot_what[128]; /* fuse.c: the ops of the flush being compiled, for its AOT name ("" otherwise) */
};

#define TPU_TOMB ((tpu_record *)1) /* a deleted registry slot */

/* A signature being built. p starts as the caller's buffer (an op's
 * signature fits one on the stack: no allocation per op) and moves to the
 * heap when it outgrows it; tpu_sig_done frees what was allocated. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
  bool oom;
  bool heap; /* p is owned */
} tpu_sig;

typedef struct {
  tpu_record **r; /* borrowed records, by flush id */
  int n, cap;
  bool oom;
} tpu_rectab;

/* aot.c: the program (compiled for the plugin) compiled for the TPU target
 * too, when one is set; an error fails the call only in strict mode. */
tpu_status *tpu_engine_aot_compile(tpu_engine *e, const char *text, size_t len, const char *name,
                                   const tpu_rt_compile_opts *o);
tpu_status *tpu_engine_aot_open(tpu_engine *e);
void tpu_engine_aot_free(tpu_engine *e);

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

/* engine.c */
/* A copy of s (NULL stays NULL) in *out; false when out of memory. */
bool tpu_dup(const char *s, char **out);
void tpu_engine_warn(tpu_engine *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* record.c */
/* A never-written record reads as zeros: gives it a zero buffer. */
tpu_status *tpu_record_materialize(tpu_engine *e, tpu_record *r);

/* programs.c */
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

/* launch.c */
void tpu_inflight_pop(tpu_engine *e);
void tpu_inflight_reap(tpu_engine *e);
tpu_status *tpu_checks_read(tpu_engine *e);
void tpu_check_push(tpu_engine *e, tpu_rt_buffer *b, tpu_fcheck what, char *site);
/* A copy of the Python site of a fused program's check, while its recorded
 * ops are at hand (a flush; NULL for a plan's replay). */
char *tpu_fcheck_site(const tpu_engine *e, const tpu_fcheck *w);
tpu_status *tpu_engine_wait(tpu_engine *e);
/* spmd.c */
void tpu_record_free_shards(tpu_record *r);
tpu_status *tpu_spmd_download(tpu_engine *e, tpu_record *rec, void *dst, size_t nbytes);
tpu_status *tpu_spmd_upload(tpu_engine *e, tpu_record *rec, const void *data);
tpu_status *tpu_spmd_mesh(const tpu_rectab *tab, const tpu_sharding **mesh);
tpu_sharding tpu_spmd_choose(const tpu_rectab *tab, const tpu_sharding *mesh, const tpu_record *r);
tpu_status *tpu_spmd_run(tpu_engine *e, tpu_cache_entry *c, tpu_rectab *tab);
tpu_status *tpu_spmd_launch(tpu_engine *e, tpu_cache_entry *c, tpu_rt_buffer **in, tpu_record **dst, bool flush);
tpu_status *tpu_spmd_record_input(tpu_engine *e, tpu_record *r, int d, tpu_rt_buffer **b, tpu_rt_buffer **own);
tpu_status *tpu_check_overlap(const tpu_op_row *row, tpu_arg *args, const tpu_cache_entry *c);
tpu_dtype tpu_scalar_bits(const tpu_arg *a, uint8_t bits[16]);
tpu_status *tpu_input_buffer(tpu_engine *e, const tpu_in_plan *p, tpu_arg *args, tpu_record *rec, uint64_t rng_seed,
                             uint64_t rng_offset, tpu_rt_buffer **b, tpu_rt_buffer **temp);
tpu_status *tpu_engine_launch(tpu_engine *e, tpu_rt_exec *exec, tpu_rt_buffer **in, int nin, tpu_rt_buffer **out,
                              const char *name, int nops);
/* The profiler's record of exec, which ran to completion on its rows'
 * devices since p0: "<what> over N devices". */
void tpu_prof_rows(tpu_rt_exec *exec, int64_t p0, const char *what);

/* fuse.c */
tpu_status *tpu_engine_record(tpu_engine *e, const tpu_op_row *row, int op_id, tpu_arg *args, int nargs,
                              const tpu_sig *sig, tpu_cache_entry *c, tpu_engine_result *res);
void tpu_nodes_release(tpu_engine *e);
tpu_status *tpu_flush_prepare(tpu_engine *e, tpu_flush_reason reason, tpu_rectab *tab, tpu_cache_entry **out);
tpu_status *tpu_fuse_run(tpu_engine *e, tpu_cache_entry *c, tpu_rectab *tab);
void tpu_steps_throttle(tpu_engine *e);

/* replica.c */
/* Frees the kept programs of replica-mode collectives. */
void tpu_replica_release(tpu_engine *e);

/* plan.c */
/* Releases every live plan's hold on the engine (the engine is freed). */
void tpu_plans_release(tpu_engine *e);

/* fns.c: the lowering's lookup of an id's function (ctx: the engine), and
 * freeing them all. */
const tpu_hlo_fn *tpu_engine_fn_lookup(void *e, int64_t id);
void tpu_engine_fns_free(tpu_engine *e);

#endif
