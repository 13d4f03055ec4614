/* engine.c: records, the program cache, and running one op (debug eager mode).
 *
 * A call is keyed by its signature: the op id and, per argument, everything
 * the lowering depends on (dtypes, shapes, strides, how a view is read,
 * attribute values, the kinds of Python scalars) but no data: scalar values
 * and view offsets are program inputs. On a hit the cached executable runs
 * directly, so the lowering and the StableHLO text are built once per
 * signature.
 *
 * The record registry is an open-addressing set of live record addresses
 * guarded by a mutex: torch frees storages from any thread, with or without
 * the GIL, and a pointer coming back from Python is looked up before use.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine.h"

#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void tpu_nodes_release(tpu_engine *e);

/* Launched, unfinished computations kept in strict mode; when full, the
 * oldest is waited for. */
#define TPU_INFLIGHT 256

typedef struct {
  int refs;      /* the cache's and each plan's; 0 for an entry not yet inserted */
  uint8_t *key;  /* owned signature bytes */
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
} tpu_fcheck;

/* A recorded op (fused mode): a deep copy of its parsed arguments (the
 * records they name are referenced by the graph), its signature and plans,
 * and the records of its new outputs. */
typedef struct {
  const tpu_op_row *row;
  int op_id;
  tpu_arg *args; /* owned: one block holding args, their TENSORS lists, outrec and sig */
  int nargs;
  uint8_t *sig;  /* in the args block */
  size_t siglen;
  tpu_record **outrec; /* in the args block; graph references */
  int nnew;
  uint64_t rng_offset; /* the generator's offset reserved for the op */
  uint32_t group;      /* the foreach call the op is an item of; 0: none */
  uint32_t share;      /* bit a: Python number a is read from node share_from's input */
  int share_from;      /* the group's first node of the same op */
} tpu_node;

/* Small device buffers for scalar inputs (Python numbers, view offsets),
 * keyed by dtype and bit pattern. Program inputs are never donated, so one
 * buffer can serve every call that passes the same value: a loop that reuses
 * a learning rate or an alpha uploads it once. Direct-mapped, owned. */
#define TPU_SCALAR_SLOTS 256
typedef struct {
  tpu_dtype dtype;
  uint8_t bits[16];
  uint64_t epoch; /* the call that last used it */
  tpu_rt_buffer *buf;
} tpu_scalar_slot;

struct tpu_engine {
  tpu_rt *rt; /* owned */
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
  tpu_dcache *disk;   /* owned; NULL when the disk tier is off */
  char *salt;         /* owned */
  bool disk_readonly; /* a write failed: entries are still read, no longer written */
  bool disk_refused_told; /* an untrusted entry was reported (once a process) */
  char *warnings[8];  /* owned, pending for the binding */
  int nwarnings;
  int mode;           /* TPU_MODE_* */
  struct {
    tpu_rt_event *ev; /* owned */
    const char *op;   /* the table's name (static); NULL for a fused program */
  } inflight[TPU_INFLIGHT];
  int ihead, icount;  /* a ring, oldest first */
  tpu_status *deferred; /* owned: the first asynchronous failure, until reported */
  struct {
    tpu_rt_buffer *buf; /* owned: a 0-d pred, true when the check failed */
    tpu_fcheck what;
  } *chk;               /* value checks of launched programs, read at the next sync point */
  int nchk, capchk;
  tpu_node *nodes;      /* fused mode: the recorded ops, in order (owned) */
  int nnodes, capnodes, fuse_cap;
  bool donate;          /* fused programs take the buffers of records they rewrite */
  bool donate_waits;    /* the plugin blocks the host to donate a buffer in use (CPU) */
  bool exact_div;       /* the compiler turns divisions into reciprocal products (CPU) */
  uint64_t fuse_epoch;  /* flushes started */
  uint64_t records_made;
  bool capturing;       /* between tpu_engine_capture_begin and _end */
  bool capture_split;   /* a flush ran during the capture: the recording is not the whole graph */
  bool capture_whole;   /* a torch.tpu.graph capture: nothing may run until it ends */
  uint64_t capture_birth, capture_rng;
  struct tpu_plan *plans; /* every live plan, released with the engine */
  uint32_t fe_group, fe_groups; /* the foreach call recording now (0: none), calls seen */
  int fe_first;                 /* the node its items start at */
  bool explain;                 /* TORCHTPU_EXPLAIN_RECOMPILES */
  char *notes[8];               /* owned: explanations pending for the binding */
  int nnotes;
};

#define TPU_TOMB ((tpu_record *)1)

static int64_t tpu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t tpu_hash_bytes(const void *p, size_t n) { return tpu_hash64(p, n); }

static size_t tpu_ptr_slot(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)(x & (cap - 1));
}

/* ---- engine ------------------------------------------------------------------- */

tpu_status *tpu_engine_new(const tpu_rt_options *opts, tpu_engine **out) {
  *out = NULL;
  tpu_engine *e = calloc(1, sizeof *e);
  if (!e) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  tpu_status *s = tpu_rt_open(opts, &e->rt);
  if (s) {
    free(e);
    return s;
  }
  pthread_mutex_init(&e->reg_lock, NULL);
  e->reg_cap = 1024;
  e->reg = calloc(e->reg_cap, sizeof *e->reg);
  e->cache_cap = 256;
  e->cache = calloc(e->cache_cap, sizeof *e->cache);
  if (!e->reg || !e->cache) {
    tpu_engine_free(e);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  e->rng_seed = TPU_DEFAULT_SEED;
  /* bounds and defaults as in torchtpu/_settings.py, which warns about bad values */
  e->fuse_cap = (int)tpu_env_long("TORCHTPU_FUSED_MAX_OPS", 4096, 1, 1 << 20);
  e->donate = tpu_env_flag("TORCHTPU_DONATE", true);
  tpu_lower_value_checks = tpu_env_flag("TORCHTPU_VALUE_CHECKS", true);
  e->donate_waits = strcmp(tpu_rt_platform_name(e->rt), "cpu") == 0;
  e->exact_div = e->donate_waits;
  e->precision = TPU_HLO_PREC_HIGHEST;
  *out = e;
  return NULL;
}

/* Drops one reference (an entry never inserted has none: freed at once). */
static void tpu_cache_entry_free(tpu_cache_entry *c) {
  if (!c || --c->refs > 0) return;
  free(c->key);
  free(c->in);
  free(c->out);
  free(c->ret);
  free(c->fin);
  free(c->fout);
  free(c->fchk);
  tpu_rt_exec_free(c->exec);
  free(c);
}

static void tpu_plan_release(tpu_plan *p);

void tpu_engine_free(tpu_engine *e) {
  if (!e) return;
  for (int i = 0; i < e->nnotes; i++) free(e->notes[i]);
  while (e->plans) tpu_plan_release(e->plans);
  tpu_nodes_release(e);
  free(e->nodes);
  tpu_status_free(tpu_engine_sync(e));
  free(e->chk);
  tpu_dcache_free(e->disk);
  free(e->salt);
  for (int i = 0; i < e->nwarnings; i++) free(e->warnings[i]);
  for (int i = 0; i < TPU_SCALAR_SLOTS; i++) tpu_rt_buffer_free(e->scalars[i].buf);
  for (size_t i = 0; i < e->cache_cap; i++) tpu_cache_entry_free(e->cache[i]);
  free(e->cache);
  /* Records still alive belong to tensors that outlive the engine (process
   * exit): drop their buffers so the client can be destroyed cleanly. */
  for (size_t i = 0; i < e->reg_cap; i++) {
    tpu_record *r = e->reg ? e->reg[i] : NULL;
    if (r && r != TPU_TOMB) {
      tpu_rt_buffer_free(r->buf);
      r->buf = NULL;
      r->eng = NULL;
    }
  }
  free(e->reg);
  pthread_mutex_destroy(&e->reg_lock);
  tpu_rt_close(e->rt);
  free(e);
}

tpu_rt *tpu_engine_rt(tpu_engine *e) { return e->rt; }
tpu_metrics *tpu_engine_metrics(tpu_engine *e) { return &e->metrics; }
int64_t tpu_engine_cache_size(tpu_engine *e) { return (int64_t)e->cache_n; }

void tpu_engine_set_precision(tpu_engine *e, tpu_hlo_precision p) { e->precision = p; }

/* Waits for the oldest launched computation; keeps its error if it is the
 * first one. */
static void tpu_inflight_pop(tpu_engine *e) {
  int k = e->ihead;
  tpu_status *s = tpu_rt_event_wait(e->rt, e->inflight[k].ev);
  if (s && !e->deferred && e->inflight[k].op)
    e->deferred = tpu_status_prefix(s, "aten::%s failed (it ran asynchronously in strict eager mode; "
                                       "set TORCHTPU_EAGER=debug to stop at the failing op)", e->inflight[k].op);
  else if (s && !e->deferred)
    e->deferred = tpu_status_prefix(s, "a fused program failed (set TORCHTPU_EAGER=debug to stop at the "
                                       "failing op)");
  else
    tpu_status_free(s);
  e->inflight[k].ev = NULL;
  e->ihead = (e->ihead + 1) % TPU_INFLIGHT;
  e->icount--;
}

/* Frees the finished computations at the front, without blocking. */
static void tpu_inflight_reap(tpu_engine *e) {
  while (e->icount && tpu_rt_event_ready(e->rt, e->inflight[e->ihead].ev)) tpu_inflight_pop(e);
}

/* Reads the pending value checks (each waits for its program): the first
 * that failed, as an error naming its op; every check is consumed. */
static tpu_status *tpu_checks_read(tpu_engine *e) {
  tpu_status *err = NULL;
  for (int k = 0; k < e->nchk; k++) {
    uint8_t bad = 0;
    tpu_status *s = err ? NULL : tpu_rt_buffer_to_host(e->rt, e->chk[k].buf, &bad, 1);
    tpu_rt_buffer_free(e->chk[k].buf);
    if (s) tpu_status_free(s); /* the program's own failure is reported by the ring */
    else if (bad && !err)
      err = tpu_status_new((tpu_code)e->chk[k].what.code, "aten::%s: %s", e->chk[k].what.op, e->chk[k].what.msg);
  }
  e->nchk = 0;
  return err;
}

/* Keeps a launched program's check (b owned) for the next sync point; with
 * many pending, they are read now and a failure waits there. */
static void tpu_check_push(tpu_engine *e, tpu_rt_buffer *b, tpu_fcheck what) {
  if (e->nchk == e->capchk) {
    int cap = e->capchk ? 2 * e->capchk : 16;
    void *n = cap <= 4096 ? realloc(e->chk, sizeof *e->chk * (size_t)cap) : NULL;
    if (!n) {
      tpu_status *s = tpu_checks_read(e);
      if (s && !e->deferred) e->deferred = s;
      else tpu_status_free(s);
    } else {
      e->chk = n;
      e->capchk = cap;
    }
  }
  e->chk[e->nchk].buf = b;
  e->chk[e->nchk++].what = what;
}

/* Waits for every launched computation; the first error of one (once), then
 * the first failed value check. */
static tpu_status *tpu_engine_wait(tpu_engine *e) {
  while (e->icount) tpu_inflight_pop(e);
  tpu_status *s = e->deferred;
  e->deferred = NULL;
  tpu_status *c = e->nchk ? tpu_checks_read(e) : NULL;
  if (!s) return c;
  tpu_status_free(c);
  return s;
}

tpu_status *tpu_engine_sync(tpu_engine *e) {
  tpu_status *f = tpu_engine_flush(e, TPU_FLUSH_SYNC);
  if (f) {
    tpu_status_free(e->deferred);
    e->deferred = NULL;
    tpu_status_free(tpu_engine_wait(e));
    return f;
  }
  return tpu_engine_wait(e);
}

void tpu_engine_set_mode(tpu_engine *e, int mode) {
  e->mode = (mode == TPU_MODE_STRICT || mode == TPU_MODE_FUSED) ? mode : TPU_MODE_DEBUG;
}
int tpu_engine_mode(tpu_engine *e) { return e->mode; }

void tpu_engine_foreach(tpu_engine *e, bool begin) {
  if (begin && !++e->fe_groups) e->fe_groups = 1; /* 0 means no call */
  e->fe_group = begin ? e->fe_groups : 0;
  e->fe_first = e->nnodes;
}

void tpu_engine_set_disk_cache(tpu_engine *e, tpu_dcache *dc, const char *salt) {
  tpu_dcache_free(e->disk);
  free(e->salt);
  e->disk = dc;
  e->salt = dc ? strdup(salt ? salt : "") : NULL;
  e->disk_readonly = false;
  e->disk_refused_told = false;
  if (dc && !e->salt) {
    tpu_dcache_free(dc);
    e->disk = NULL;
  }
}

static void tpu_engine_warn(tpu_engine *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tpu_engine_warn(tpu_engine *e, const char *fmt, ...) {
  if (e->nwarnings == (int)(sizeof e->warnings / sizeof e->warnings[0])) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  char *w = strdup(buf);
  if (w) e->warnings[e->nwarnings++] = w;
}

void tpu_engine_set_explain(tpu_engine *e, bool on) { e->explain = on; }

/* The oldest of n owned messages, now the caller's; NULL when none. */
static char *tpu_messages_take(char **q, int *n) {
  if (!*n) return NULL;
  char *w = q[0];
  memmove(q, q + 1, sizeof(char *) * (size_t)(*n - 1));
  (*n)--;
  return w;
}

char *tpu_engine_take_note(tpu_engine *e) { return tpu_messages_take(e->notes, &e->nnotes); }
char *tpu_engine_take_warning(tpu_engine *e) { return tpu_messages_take(e->warnings, &e->nwarnings); }

/* The disk key: salt, a separator no program text holds, then the text. */
static uint8_t *tpu_disk_key(tpu_engine *e, const char *text, size_t len, size_t *keylen) {
  size_t sl = strlen(e->salt);
  uint8_t *k = malloc(sl + 1 + len);
  if (!k) return NULL;
  memcpy(k, e->salt, sl);
  k[sl] = 0;
  memcpy(k + sl + 1, text, len);
  *keylen = sl + 1 + len;
  return k;
}

/* A program from the disk tier, or NULL (a miss, or an entry that could not
 * be used: a damaged one reported and removed, an untrusted one (someone
 * else's, or a MAC that fails) reported once a process and never run; the
 * caller compiles, and its put replaces the entry). */
static tpu_rt_exec *tpu_disk_load(tpu_engine *e, const uint8_t *key, size_t keylen, const char *label) {
  int64_t t0 = tpu_now_ns();
  void *bytes = NULL;
  size_t n = 0;
  char why[512];
  tpu_dc_result r = tpu_dcache_get(e->disk, key, keylen, &bytes, &n, why, sizeof why);
  tpu_rt_exec *exec = NULL;
  if (r == TPU_DC_CORRUPT) {
    atomic_fetch_add(&e->metrics.disk_corrupt, 1);
    tpu_engine_warn(e, "torchtpu: removed a damaged compilation cache entry (%s); recompiling %s", why, label);
  } else if (r == TPU_DC_REFUSED) {
    atomic_fetch_add(&e->metrics.disk_refused, 1);
    if (!e->disk_refused_told) {
      e->disk_refused_told = true;
      tpu_engine_warn(e, "torchtpu: ignored an untrusted compilation cache entry (%s); recompiling %s (further "
                      "untrusted entries in this process are ignored without a warning)", why, label);
    }
  } else if (r == TPU_DC_HIT) {
    tpu_status *s = tpu_rt_exec_deserialize(e->rt, bytes, n, &exec);
    if (s) {
      atomic_fetch_add(&e->metrics.disk_corrupt, 1);
      tpu_engine_warn(e, "torchtpu: the plugin refused a compilation cache entry in %s (%s); removed it, "
                      "recompiling %s", tpu_dcache_dir(e->disk), tpu_status_message(s), label);
      tpu_status_free(s);
      tpu_dcache_remove(e->disk, key, keylen);
      exec = NULL;
    }
  }
  free(bytes);
  atomic_fetch_add(&e->metrics.disk_load_ns, tpu_now_ns() - t0);
  atomic_fetch_add(exec ? &e->metrics.disk_hits : &e->metrics.disk_misses, 1);
  return exec;
}

static void tpu_disk_store(tpu_engine *e, tpu_rt_exec *exec, const uint8_t *key, size_t keylen) {
  if (e->disk_readonly) return;
  void *bytes = NULL;
  size_t n = 0;
  tpu_status *s = tpu_rt_exec_serialize(e->rt, exec, &bytes, &n);
  if (s) {
    /* A plugin that cannot serialize: the disk tier can do nothing. */
    tpu_engine_warn(e, "torchtpu: compiled programs cannot be cached on disk (%s); caching in memory only",
                    tpu_status_message(s));
    tpu_status_free(s);
    e->disk_readonly = true;
    return;
  }
  char why[600];
  int err = tpu_dcache_put(e->disk, key, keylen, bytes, n, why, sizeof why);
  free(bytes);
  if (err) {
    tpu_engine_warn(e, "torchtpu: the compilation cache folder cannot be written (%s); new programs are "
                    "cached in memory only for the rest of this process", why);
    e->disk_readonly = true;
  } else {
    atomic_fetch_add(&e->metrics.disk_writes, 1);
  }
}
tpu_hlo_precision tpu_engine_precision(tpu_engine *e) { return e->precision; }

void tpu_engine_rng_state(tpu_engine *e, uint64_t *seed, uint64_t *offset) {
  *seed = e->rng_seed;
  *offset = e->rng_offset;
}
void tpu_engine_set_rng_state(tpu_engine *e, uint64_t seed, uint64_t offset) {
  e->rng_seed = seed;
  e->rng_offset = offset;
}

/* ---- records ------------------------------------------------------------------ */

static bool tpu_reg_grow(tpu_engine *e) {
  size_t cap = e->reg_cap * 2;
  tpu_record **n = calloc(cap, sizeof *n);
  if (!n) return false;
  for (size_t i = 0; i < e->reg_cap; i++) {
    tpu_record *r = e->reg[i];
    if (!r || r == TPU_TOMB) continue;
    size_t j = tpu_ptr_slot(r, cap);
    while (n[j]) j = (j + 1) & (cap - 1);
    n[j] = r;
  }
  free(e->reg);
  e->reg = n;
  e->reg_cap = cap;
  e->reg_used = e->reg_live;
  return true;
}

tpu_record *tpu_record_new(tpu_engine *e, tpu_dtype dt, int64_t numel) {
  tpu_record *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->magic = TPU_RECORD_MAGIC;
  atomic_init(&r->refs, 1);
  r->dtype = dt;
  r->numel = numel;
  r->eng = e;
  pthread_mutex_lock(&e->reg_lock);
  r->birth = e->records_made++;
  if ((e->reg_used + 1) * 2 > e->reg_cap && !tpu_reg_grow(e)) {
    pthread_mutex_unlock(&e->reg_lock);
    free(r);
    return NULL;
  }
  size_t j = tpu_ptr_slot(r, e->reg_cap);
  while (e->reg[j] && e->reg[j] != TPU_TOMB) j = (j + 1) & (e->reg_cap - 1);
  if (!e->reg[j]) e->reg_used++;
  e->reg[j] = r;
  e->reg_live++;
  pthread_mutex_unlock(&e->reg_lock);
  atomic_fetch_add(&e->metrics.records_live, 1);
  return r;
}

void tpu_record_ref(tpu_record *r) { atomic_fetch_add(&r->refs, 1); }

void tpu_record_unref(tpu_record *r) {
  if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
  tpu_engine *e = r->eng;
  if (e) {
    pthread_mutex_lock(&e->reg_lock);
    size_t j = tpu_ptr_slot(r, e->reg_cap);
    while (e->reg[j] && e->reg[j] != r) j = (j + 1) & (e->reg_cap - 1);
    if (e->reg[j] == r) {
      e->reg[j] = TPU_TOMB;
      e->reg_live--;
    }
    pthread_mutex_unlock(&e->reg_lock);
    atomic_fetch_sub(&e->metrics.records_live, 1);
  }
  tpu_rt_buffer_free(r->buf);
  r->magic = 0;
  free(r);
}

tpu_record *tpu_engine_find_record(tpu_engine *e, const void *addr) {
  if (!addr) return NULL;
  tpu_record *found = NULL;
  pthread_mutex_lock(&e->reg_lock);
  size_t j = tpu_ptr_slot(addr, e->reg_cap);
  while (e->reg[j]) {
    if ((const void *)e->reg[j] == addr) {
      found = e->reg[j];
      break;
    }
    j = (j + 1) & (e->reg_cap - 1);
  }
  pthread_mutex_unlock(&e->reg_lock);
  return found;
}

/* A never-written record reads as zeros: give it a zero buffer. */
static tpu_status *tpu_record_materialize(tpu_engine *e, tpu_record *r) {
  if (r->buf) return NULL;
  size_t nb = (size_t)r->numel * tpu_dtype_size(r->dtype);
  void *zeros = calloc(nb ? nb : 1, 1);
  if (!zeros) return tpu_status_new(TPU_ERR_MEMORY, "out of memory allocating %zu bytes", nb);
  int64_t n = r->numel;
  tpu_status *s = tpu_rt_buffer_from_host(e->rt, zeros, r->dtype, &n, 1, &r->buf);
  free(zeros);
  return s;
}

tpu_status *tpu_engine_upload(tpu_engine *e, tpu_record *rec, const void *data,
                              tpu_dtype dt, int rank, const int64_t *dims) {
  (void)rank;
  (void)dims;
  if (dt != rec->dtype)
    return tpu_status_new(TPU_ERR_TYPE, "upload of %s data into a %s storage",
                          tpu_dtype_name(dt), tpu_dtype_name(rec->dtype));
  if (atomic_load(&rec->graph_refs) > 0) { /* recorded ops read or write it: they run first */
    tpu_status *f = tpu_engine_flush(e, TPU_FLUSH_UPLOAD);
    if (f) return f;
  }
  tpu_rt_buffer *b = NULL;
  int64_t n = rec->numel;
  tpu_status *s = tpu_rt_buffer_from_host(e->rt, data, dt, &n, 1, &b);
  if (s) return s;
  tpu_rt_buffer_free(rec->buf);
  rec->buf = b;
  atomic_fetch_add(&e->metrics.h2d_bytes, (long long)((size_t)n * tpu_dtype_size(dt)));
  return NULL;
}

tpu_status *tpu_engine_download(tpu_engine *e, tpu_record *rec, void *dst,
                                size_t nbytes) {
  /* A sync point: recorded ops run, and a failed asynchronous computation
   * is reported here. Recorded ops (fused mode) run first only when they
   * read or write the record: otherwise it already holds its value (perhaps
   * one a launched program is computing), and they stay recorded for the
   * program that ends the step (the loss read after the optimizer step,
   * computed by the program launched when the backward pass began). */
  tpu_status *s = atomic_load(&rec->graph_refs) > 0 ? tpu_engine_flush(e, TPU_FLUSH_DOWNLOAD) : NULL;
  if (!s) s = tpu_engine_wait(e);
  if (s) return s;
  if (!rec->buf) {
    memset(dst, 0, nbytes);
    return NULL;
  }
  atomic_fetch_add(&e->metrics.d2h_bytes, (long long)nbytes);
  return tpu_rt_buffer_to_host(e->rt, rec->buf, dst, nbytes);
}

/* ---- signatures --------------------------------------------------------------- */

/* A signature being built. p starts as the caller's buffer (an op's
 * signature fits one on the stack: no allocation per op) and moves to the
 * heap when it outgrows it; tpu_sig_done frees what was allocated. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
  bool oom;
  bool heap; /* p is owned */
} tpu_sig;

static void tpu_sig_put(tpu_sig *s, const void *d, size_t n) {
  if (s->oom) return;
  if (s->n + n > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    while (cap < s->n + n) cap *= 2;
    uint8_t *q = s->heap ? realloc(s->p, cap) : malloc(cap);
    if (!q) {
      s->oom = true;
      return;
    }
    if (!s->heap && s->n) memcpy(q, s->p, s->n);
    s->p = q;
    s->cap = cap;
    s->heap = true;
  }
  memcpy(s->p + s->n, d, n);
  s->n += n;
}

static void tpu_sig_done(tpu_sig *s) {
  if (s->heap) free(s->p);
}

static void tpu_sig_i64(tpu_sig *s, int64_t v) { tpu_sig_put(s, &v, sizeof v); }

static void tpu_sig_tensor(tpu_sig *s, const tpu_tref *t) {
  tpu_sig_i64(s, t->host ? -1 - (int64_t)t->dtype : (int64_t)t->dtype);
  if (t->host) return;
  tpu_sig_i64(s, t->rank);
  tpu_sig_put(s, t->sizes, sizeof(int64_t) * (size_t)t->rank);
  tpu_sig_put(s, t->strides, sizeof(int64_t) * (size_t)t->rank);
  tpu_sig_i64(s, t->view);
  tpu_sig_i64(s, t->rec_numel);
  tpu_sig_i64(s, t->rec_dtype);
}

static void tpu_sig_build(tpu_sig *s, int op_id, const tpu_arg *args, int nargs) {
  tpu_sig_i64(s, op_id);
  for (int i = 0; i < nargs; i++) {
    const tpu_arg *a = &args[i];
    tpu_sig_i64(s, (int64_t)a->kind | (a->is_default ? 0x100 : 0));
    switch (a->kind) {
      case TPU_ARG_TENSOR: tpu_sig_tensor(s, &a->t); break;
      case TPU_ARG_TENSORS:
        tpu_sig_i64(s, a->nlist);
        for (int j = 0; j < a->nlist; j++) {
          bool present = a->list[j].rec || a->list[j].host || a->list[j].zero_size;
          tpu_sig_i64(s, present);
          if (present) tpu_sig_tensor(s, &a->list[j]);
        }
        break;
      case TPU_ARG_SCALAR:
        tpu_sig_i64(s, a->skind);
        if (tpu_op_table[op_id].flags & TPU_OP_SCALAR_ATTRS) {
          tpu_sig_put(s, &a->f, sizeof a->f);
          tpu_sig_i64(s, a->i);
        }
        break;
      case TPU_ARG_INT:
      case TPU_ARG_BOOL: tpu_sig_i64(s, a->i); break;
      case TPU_ARG_INTS:
        tpu_sig_i64(s, a->nints);
        tpu_sig_put(s, a->ints, sizeof(int64_t) * (size_t)a->nints);
        break;
      case TPU_ARG_FLOAT: tpu_sig_put(s, &a->f, sizeof a->f); break;
      case TPU_ARG_FLOATS:
        tpu_sig_i64(s, a->nints);
        tpu_sig_put(s, a->floats, sizeof(double) * (size_t)a->nints);
        break;
      case TPU_ARG_DTYPE: tpu_sig_i64(s, a->dtype); break;
      case TPU_ARG_STR: tpu_sig_put(s, a->str, strlen(a->str) + 1); break;
      default: break;
    }
  }
}

/* ---- the cache ------------------------------------------------------------------ */

static tpu_cache_entry *tpu_cache_find(tpu_engine *e, const tpu_sig *s, uint64_t h) {
  size_t j = (size_t)h & (e->cache_cap - 1);
  while (e->cache[j]) {
    tpu_cache_entry *c = e->cache[j];
    if (c->hash == h && c->keylen == s->n && memcmp(c->key, s->p, s->n) == 0) return c;
    j = (j + 1) & (e->cache_cap - 1);
  }
  return NULL;
}

/* Each compiled program holds memory mappings of the plugin's JIT (about
 * three per kernel, and a program may have dozens of kernels); a process may
 * have only vm.max_map_count of them, and past that XLA fails with "Cannot
 * allocate memory" or aborts. Before each insertion the cache is emptied when
 * it holds TORCHTPU_PROGRAM_CACHE_SIZE programs (default 4096) or when the
 * process uses more than half of its mapping limit (counted from
 * /proc/self/maps every 16 compiles; a compile costs far more than the read).
 * Executions finish inside their call, so no program is in use between
 * calls; the next call of an evicted program recompiles it. */
static long tpu_count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char buf[65536];
  long n = 0;
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0)
    for (size_t i = 0; i < k; i++) n += buf[i] == '\n';
  fclose(f);
  return n;
}

static bool tpu_maps_near_limit(void) {
  static long limit = -2, calls = 0;
  if (limit == -2) {
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    limit = -1;
    if (f) {
      if (fscanf(f, "%ld", &limit) != 1) limit = -1;
      fclose(f);
    }
  }
  if (limit <= 0 || calls++ % 16) return false;
  long n = tpu_count_lines("/proc/self/maps");
  return n > limit / 2;
}

static void tpu_cache_bound(tpu_engine *e) {
  static long limit = 0;
  if (!limit) {
    limit = tpu_env_long("TORCHTPU_PROGRAM_CACHE_SIZE", 4096, 1, 1 << 20);
  }
  if ((long)e->cache_n < limit && !tpu_maps_near_limit()) return;
  for (size_t i = 0; i < e->cache_cap; i++) {
    tpu_cache_entry_free(e->cache[i]);
    e->cache[i] = NULL;
  }
  e->cache_n = 0;
  atomic_fetch_add(&e->metrics.cache_evictions, 1);
}

static bool tpu_cache_insert(tpu_engine *e, tpu_cache_entry *c) {
  tpu_cache_bound(e);
  if ((e->cache_n + 1) * 2 > e->cache_cap) {
    size_t cap = e->cache_cap * 2;
    tpu_cache_entry **n = calloc(cap, sizeof *n);
    if (!n) return false;
    for (size_t i = 0; i < e->cache_cap; i++) {
      tpu_cache_entry *x = e->cache[i];
      if (!x) continue;
      size_t j = (size_t)x->hash & (cap - 1);
      while (n[j]) j = (j + 1) & (cap - 1);
      n[j] = x;
    }
    free(e->cache);
    e->cache = n;
    e->cache_cap = cap;
  }
  size_t j = (size_t)c->hash & (e->cache_cap - 1);
  while (e->cache[j]) j = (j + 1) & (e->cache_cap - 1);
  e->cache[j] = c;
  c->refs = 1;
  e->cache_n++;
  return true;
}

/* ---- one call ------------------------------------------------------------------- */

static void tpu_classify_views(tpu_arg *args, int nargs) {
  for (int i = 0; i < nargs; i++) {
    if (args[i].kind == TPU_ARG_TENSOR && !args[i].t.host)
      args[i].t.view = tpu_lower_view_kind(&args[i].t);
    if (args[i].kind == TPU_ARG_TENSORS)
      for (int j = 0; j < args[i].nlist; j++)
        if (args[i].list[j].rec) args[i].list[j].view = tpu_lower_view_kind(&args[i].list[j]);
  }
}

/* Compile program text through the disk tier. *exec is owned by the caller. */
static tpu_status *tpu_engine_compile(tpu_engine *e, const char *text, size_t len, const char *name,
                                      tpu_rt_exec **exec) {
  *exec = NULL;
  uint8_t *dkey = NULL;
  size_t dkeylen = 0;
  if (e->disk && (dkey = tpu_disk_key(e, text, len, &dkeylen))) *exec = tpu_disk_load(e, dkey, dkeylen, name);
  tpu_status *s = NULL;
  if (!*exec) {
    int64_t t0 = tpu_now_ns();
    s = tpu_rt_compile(e->rt, text, len, exec);
    atomic_fetch_add(&e->metrics.compile_ns, tpu_now_ns() - t0);
#ifdef __GLIBC__
    /* XLA's compiler frees most of what it allocated; give it back to the
     * system instead of keeping it in the process's heap. After every
     * compile, small ones too: strict mode compiles a hundred small programs
     * in a training run's first step, and the heap kept 25-35 MB of their
     * freed memory (GPT: peak 490 MB without, 474 with). A trim costs about
     * 1 ms; a compile 10 ms or more. */
    malloc_trim(0);
#endif
    atomic_fetch_add(&e->metrics.programs_compiled, 1);
    if (!s && dkey) tpu_disk_store(e, *exec, dkey, dkeylen);
  }
  free(dkey);
  if (s) {
    s = tpu_status_prefix(s, "compiling %s", name);
    if (getenv("TORCHTPU_DEBUG")) fprintf(stderr, "%s\n", text);
  }
  return s;
}

/* Lower one call. With compile, the program is compiled; without, only the
 * plans are kept (fused mode records the op; a later eager call of the same
 * signature compiles it). A found plan-only entry is passed in *out and
 * gets its program. */
static tpu_status *tpu_engine_lower(tpu_engine *e, const tpu_op_row *row,
                                    tpu_arg *args, int nargs, tpu_sig *sig,
                                    uint64_t h, bool compile, tpu_cache_entry **out) {
  tpu_lower L;
  memset(&L, 0, sizeof L);
  L.hlo = tpu_hlo_new();
  if (!L.hlo) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  tpu_hlo_set_exact_division(L.hlo, e->exact_div);
  L.args = args;
  L.nargs = nargs;
  L.opname = row->name;
  L.flags = row->flags;
  L.rng_state = TPU_HV_NONE;
  L.precision = e->precision;
  tpu_lower_run(&L, row);
  char *text = NULL;
  size_t len = 0;
  tpu_status *s = tpu_hlo_finish(L.hlo, L.outv, L.nout, &text, &len);
  tpu_hlo_free(L.hlo);
  if (s && strncmp(tpu_status_message(s), "stablehlo.", 10) == 0 && tpu_status_code(s) != TPU_ERR_MEMORY) {
    /* The builder refused what an emitter built: an input the emitter does
     * not check for. A RuntimeError naming the op, never another type. */
    tpu_status *r = tpu_status_new(TPU_ERR_RUNTIME, "aten::%s: these arguments are not supported on tpu (the "
                                   "lowering built an invalid program: %s)", row->name, tpu_status_message(s));
    tpu_status_free(s);
    return r;
  }
  if (s) return s;
  if (compile && getenv("TORCHTPU_DUMP_HLO")) fprintf(stderr, "-- %s\n%s\n", row->name, text);
  tpu_rt_exec *exec = NULL;
  char label[160];
  snprintf(label, sizeof label, "aten::%s", row->name);
  if (compile) s = tpu_engine_compile(e, text, len, label, &exec);
  free(text);
  if (s) return s;
  if (*out) { /* a plan-only entry of this signature: the plans are the same */
    (*out)->exec = exec;
    return NULL;
  }
  tpu_cache_entry *c = calloc(1, sizeof *c);
  if (!c) {
    tpu_rt_exec_free(exec);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  c->exec = exec;
  c->nin = L.nin;
  c->in = malloc(sizeof(tpu_in_plan) * (size_t)(L.nin ? L.nin : 1));
  c->key = malloc(sig->n);
  if (!c->in || !c->key) {
    tpu_cache_entry_free(c);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  memcpy(c->in, L.in, sizeof(tpu_in_plan) * (size_t)L.nin);
  memcpy(c->key, sig->p, sig->n);
  c->keylen = sig->n;
  c->hash = h;
  c->nout = L.nout;
  c->nret = L.nret;
  c->out = malloc(sizeof(tpu_out_plan) * (size_t)(L.nout ? L.nout : 1));
  c->ret = malloc(sizeof(tpu_ret_plan) * (size_t)(L.nret ? L.nret : 1));
  if (!c->out || !c->ret) {
    tpu_cache_entry_free(c);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  memcpy(c->out, L.out, sizeof(tpu_out_plan) * (size_t)L.nout);
  memcpy(c->ret, L.ret, sizeof(tpu_ret_plan) * (size_t)L.nret);
  c->rng_words = L.rng_words;
  if (!tpu_cache_insert(e, c)) {
    tpu_cache_entry_free(c);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  *out = c;
  return NULL;
}

static tpu_tref *tpu_arg_tref(tpu_arg *args, const tpu_in_plan *p) {
  tpu_arg *a = &args[p->arg];
  return p->item >= 0 ? &a->list[p->item] : &a->t;
}

/* torch's refusals of a write that aliases itself or what the op reads
 * (TensorIterator's memory-overlap checks): checked on every call from the
 * program's plans, which say which tensors it writes and reads. Two views
 * of one record are compared; views whose overlap is too hard to tell are
 * allowed, as in torch. */
static tpu_status *tpu_check_overlap(const tpu_op_row *row, tpu_arg *args, const tpu_cache_entry *c) {
  /* the tensors written: in-place and out= writes, then out= tensors that
   * are resized to take a result (for NO_ALIAS ops, any overlap of those
   * with an input is refused: they cannot be the input itself) */
  for (int w = 0; w < c->nout + c->nret; w++) {
    tpu_in_plan wp;
    bool resized = w >= c->nout;
    if (!resized) {
      if (c->out[w].kind != TPU_OUT_WRITE) continue;
      wp = (tpu_in_plan){TPU_IN_RECORD, c->out[w].arg, c->out[w].item};
    } else {
      const tpu_ret_plan *r = &c->ret[w - c->nout];
      /* only ops that refuse any alias (torch lets sum(x, 0, out=x) resize x) */
      if (!(row->flags & TPU_OP_NO_ALIAS) || !r->resize || r->arg < 0 || args[r->arg].kind != TPU_ARG_TENSOR)
        continue;
      wp = (tpu_in_plan){TPU_IN_RECORD, r->arg, -1};
    }
    const tpu_tref *wt = tpu_arg_tref(args, &wp);
    if (!(row->flags & TPU_OP_FILLS) && tpu_tref_internal_overlap(wt))
      return tpu_status_new(TPU_ERR_RUNTIME, "aten::%s: unsupported operation: more than one element of the "
                            "written-to tensor refers to a single memory location. Please clone() the tensor before "
                            "performing the operation.", row->name);
    for (int k = 0; k < c->nin; k++) {
      const tpu_in_plan *p = &c->in[k];
      if (p->kind != TPU_IN_RECORD || (p->arg == wp.arg && p->item == wp.item)) continue;
      int lap = tpu_tref_overlap(wt, tpu_arg_tref(args, p));
      if (lap == TPU_OVERLAP_PARTIAL || (lap == TPU_OVERLAP_FULL && (resized || (row->flags & TPU_OP_NO_ALIAS))))
        return tpu_status_new(TPU_ERR_RUNTIME, "aten::%s: unsupported operation: some elements of the input tensor "
                              "and the written-to tensor refer to a single memory location. Please clone() the "
                              "tensor before performing the operation.", row->name);
    }
  }
  return NULL;
}

/* A 0-d device buffer holding these bytes, borrowed from the engine's
 * scalar cache for the current call. A slot already used by this call is
 * never evicted: the colliding value gets an owned buffer in *temp instead. */
static tpu_status *tpu_scalar_buffer(tpu_engine *e, tpu_dtype dt, const void *bytes, tpu_rt_buffer **out,
                                     tpu_rt_buffer **temp) {
  uint8_t key[16] = {0};
  size_t n = tpu_dtype_size(dt);
  memcpy(key, bytes, n);
  uint64_t h = tpu_hash_bytes(key, sizeof key) ^ (uint64_t)dt * 0x9e3779b97f4a7c15ull;
  tpu_scalar_slot *slot = &e->scalars[h % TPU_SCALAR_SLOTS];
  *temp = NULL;
  if (slot->buf && slot->dtype == dt && memcmp(slot->bits, key, sizeof key) == 0) {
    slot->epoch = e->epoch;
    *out = slot->buf;
    return NULL;
  }
  tpu_rt_buffer *b = NULL;
  tpu_status *s = tpu_rt_buffer_from_host(e->rt, key, dt, NULL, 0, &b);
  if (s) return s;
  if (slot->buf && slot->epoch == e->epoch) {
    *temp = *out = b;
    return NULL;
  }
  slot->epoch = e->epoch;
  tpu_rt_buffer_free(slot->buf);
  slot->buf = b;
  slot->dtype = dt;
  memcpy(slot->bits, key, sizeof key);
  *out = b;
  return NULL;
}

/* The dtype and bytes of a Python number as a program input. */
static tpu_dtype tpu_scalar_bits(const tpu_arg *a, uint8_t bits[16]) {
  memset(bits, 0, 16);
  switch (a->skind) {
    case TPU_SCALAR_BOOL: bits[0] = a->i != 0; return TPU_PRED;
    case TPU_SCALAR_INT: memcpy(bits, &a->i, sizeof a->i); return TPU_S64;
    case TPU_SCALAR_FLOAT: memcpy(bits, &a->f, sizeof a->f); return TPU_F64;
    default: {
      double c[2] = {a->f, a->f_imag};
      memcpy(bits, c, sizeof c);
      return TPU_C128;
    }
  }
}

static tpu_status *tpu_scalar_upload(tpu_engine *e, const tpu_arg *a, tpu_rt_buffer **out, tpu_rt_buffer **temp) {
  uint8_t bits[16];
  tpu_dtype dt = tpu_scalar_bits(a, bits);
  return tpu_scalar_buffer(e, dt, bits, out, temp);
}

/* The device buffer of one program input: borrowed (a record's buffer, a
 * cached scalar), or owned in *temp (a colliding scalar, the RNG state).
 * rec: the record of a RECORD input; rng_offset: the generator's offset
 * reserved for the call. */
static tpu_status *tpu_input_buffer(tpu_engine *e, const tpu_in_plan *p, tpu_arg *args, tpu_record *rec,
                                    uint64_t rng_offset, tpu_rt_buffer **b, tpu_rt_buffer **temp) {
  *b = *temp = NULL;
  switch (p->kind) {
    case TPU_IN_RECORD: {
      tpu_status *s = tpu_record_materialize(e, rec);
      *b = rec->buf;
      return s;
    }
    case TPU_IN_SCALAR: return tpu_scalar_upload(e, &args[p->arg], b, temp);
    case TPU_IN_HOST_TENSOR: {
      tpu_tref *t = tpu_arg_tref(args, p);
      return tpu_scalar_buffer(e, t->dtype, t->host_bytes, b, temp);
    }
    case TPU_IN_OFFSET: {
      int64_t off = tpu_arg_tref(args, p)->offset;
      return tpu_scalar_buffer(e, TPU_S64, &off, b, temp);
    }
    case TPU_IN_RNG: {
      uint64_t st[2] = {e->rng_seed, rng_offset};
      int64_t two = 2;
      tpu_status *s = tpu_rt_buffer_from_host(e->rt, st, TPU_U64, &two, 1, b);
      *temp = *b;
      return s;
    }
  }
  return tpu_status_new(TPU_ERR_RUNTIME, "unknown program input kind %d", (int)p->kind);
}

/* Runs exec: to completion in debug mode, else launched (the completion
 * event joins the in-flight ring under `name`, the op's table name or NULL
 * for a fused program, for error messages). */
static tpu_status *tpu_engine_launch(tpu_engine *e, tpu_rt_exec *exec, tpu_rt_buffer **in, int nin,
                                     tpu_rt_buffer **out, const char *name) {
  int64_t t0 = tpu_now_ns();
  tpu_status *s;
  if (e->mode != TPU_MODE_DEBUG) {
    tpu_inflight_reap(e);
    if (e->icount == TPU_INFLIGHT) tpu_inflight_pop(e);
    tpu_rt_event *done = NULL;
    /* The CPU plugin blocks the caller when it is given a buffer that a
     * running computation still reads: with computations in flight, a
     * program that would take its inputs' buffers writes new ones instead,
     * so that the host runs ahead (other plugins order donation on the
     * device and always donate). */
    if (e->icount && e->donate_waits) s = tpu_rt_execute_keep(e->rt, exec, in, nin, out, &done);
    else s = tpu_rt_execute_async(e->rt, exec, in, nin, out, &done);
    if (done) {
      int k = (e->ihead + e->icount) % TPU_INFLIGHT;
      e->inflight[k].ev = done;
      e->inflight[k].op = name;
      e->icount++;
    }
  } else {
    s = tpu_rt_execute(e->rt, exec, in, nin, out);
  }
  atomic_fetch_add(&e->metrics.execute_ns, tpu_now_ns() - t0);
  return s;
}

/* ---- fused mode ------------------------------------------------------------------ */

static void tpu_graph_ref(tpu_record *r) {
  tpu_record_ref(r);
  atomic_fetch_add(&r->graph_refs, 1);
}

static void tpu_graph_unref(tpu_record *r) {
  atomic_fetch_sub(&r->graph_refs, 1);
  tpu_record_unref(r);
}

/* Something besides the recording holds the record (a tensor, a result
 * being returned): its final value must be computed. */
static bool tpu_record_live(tpu_record *r) { return atomic_load(&r->refs) > atomic_load(&r->graph_refs); }

static void tpu_node_release(tpu_node *n) {
  for (int i = 0; i < n->nargs; i++) {
    tpu_arg *a = &n->args[i];
    if (a->kind == TPU_ARG_TENSOR && a->t.rec) tpu_graph_unref(a->t.rec);
    if (a->kind == TPU_ARG_TENSORS)
      for (int j = 0; j < a->nlist; j++)
        if (a->list[j].rec) tpu_graph_unref(a->list[j].rec);
  }
  for (int j = 0; j < n->nnew; j++) tpu_graph_unref(n->outrec[j]);
  free(n->args); /* the node's one block: args, lists, outrec, sig */
}

static void tpu_nodes_release(tpu_engine *e) {
  for (int i = 0; i < e->nnodes; i++) tpu_node_release(&e->nodes[i]);
  e->nnodes = 0;
  e->fe_first = 0; /* a foreach call's later items start the next recording */
}

/* A Python number that the group's first node of the same op takes in the
 * same place with the same bits (the same scalar passed with every tensor of
 * a foreach list, or equal items of a scalar list) is read from that node's
 * program input. Equal bits are what makes sharing right; the flush's key
 * holds the choice, so a step that shares differently is another program. */
static void tpu_node_share(const tpu_engine *e, tpu_node *n) {
  for (int j = e->fe_first; j < e->nnodes; j++) {
    const tpu_node *p = &e->nodes[j];
    if (p->group != n->group || p->op_id != n->op_id || p->nargs != n->nargs) continue;
    for (int a = 0; a < n->nargs; a++) {
      if (n->args[a].kind != TPU_ARG_SCALAR || p->args[a].kind != TPU_ARG_SCALAR) continue;
      uint8_t x[16], y[16];
      if (tpu_scalar_bits(&n->args[a], x) == tpu_scalar_bits(&p->args[a], y) && !memcmp(x, y, sizeof x))
        n->share |= 1u << a;
    }
    n->share_from = j;
    return;
  }
}

/* Record one op: its outputs are new records without buffers, returned at
 * once; nothing runs. */
static tpu_status *tpu_engine_record(tpu_engine *e, const tpu_op_row *row, int op_id, tpu_arg *args, int nargs,
                                     const tpu_sig *sig, tpu_cache_entry *c, tpu_engine_result *res) {
  if (e->nnodes >= e->fuse_cap) {
    tpu_status *s = tpu_engine_flush(e, TPU_FLUSH_CAP);
    if (s) return s;
  }
  if (e->nnodes == e->capnodes) {
    int cap = e->capnodes ? 2 * e->capnodes : 256;
    tpu_node *g = realloc(e->nodes, sizeof *g * (size_t)cap);
    if (!g) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    e->nodes = g;
    e->capnodes = cap;
  }
  tpu_node *n = &e->nodes[e->nnodes];
  memset(n, 0, sizeof *n);
  int nnew = 0;
  for (int k = 0; k < c->nout; k++) nnew += c->out[k].kind == TPU_OUT_NEW;
  /* One block per node (ops are recorded by the hundred per step): the
   * arguments, their tensor lists, the output records, the signature. */
  size_t nlist = 0;
  for (int i = 0; i < nargs; i++)
    if (args[i].kind == TPU_ARG_TENSORS) nlist += (size_t)args[i].nlist;
  size_t at = sizeof(tpu_arg) * (size_t)nargs, lt = sizeof(tpu_tref) * nlist, ot = sizeof(tpu_record *) * (size_t)nnew;
  uint8_t *block = malloc(at + lt + ot + sig->n + 1);
  if (!block) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  n->args = (tpu_arg *)block;
  tpu_tref *lists = (tpu_tref *)(block + at);
  n->outrec = (tpu_record **)(block + at + lt);
  n->sig = block + at + lt + ot;
  for (int i = 0; i < nargs; i++) memcpy(&n->args[i], &args[i], tpu_arg_size(&args[i]));
  if (nnew) memset(n->outrec, 0, ot);
  for (int i = 0; i < nargs; i++) {
    tpu_arg *a = &n->args[i];
    if (a->kind != TPU_ARG_TENSORS) continue;
    if (a->nlist) memcpy(lists, args[i].list, sizeof *lists * (size_t)a->nlist);
    a->list = lists;
    lists += a->nlist;
  }
  n->row = row;
  n->op_id = op_id;
  n->nargs = nargs;
  memcpy(n->sig, sig->p, sig->n);
  n->siglen = sig->n;
  n->group = e->fe_group;
  if (n->group) tpu_node_share(e, n);
  for (int i = 0; i < nargs; i++) {
    tpu_arg *a = &n->args[i];
    if (a->kind == TPU_ARG_TENSOR && a->t.rec) tpu_graph_ref(a->t.rec);
    if (a->kind == TPU_ARG_TENSORS)
      for (int j = 0; j < a->nlist; j++)
        if (a->list[j].rec) tpu_graph_ref(a->list[j].rec);
  }
  for (int k = 0; k < c->nout; k++) {
    const tpu_out_plan *o = &c->out[k];
    if (o->kind != TPU_OUT_NEW) continue;
    tpu_record *r = tpu_record_new(e, o->type.dtype, tpu_hlo_type_numel(&o->type));
    if (!r) {
      n->nnew = res->nout;
      tpu_node_release(n);
      tpu_engine_result_release(res);
      return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    }
    tpu_graph_ref(r);
    n->outrec[res->nout] = r;
    res->outs[res->nout] = r; /* the caller's reference */
    res->types[res->nout] = o->type;
    res->nout++;
  }
  n->nnew = nnew;
  n->rng_offset = e->rng_offset;
  e->rng_offset += (uint64_t)c->rng_words;
  res->nret = c->nret;
  memcpy(res->ret, c->ret, sizeof(tpu_ret_plan) * (size_t)c->nret);
  e->nnodes++;
  return NULL;
}

/* The flush's state, seen by the lowering hooks. */
typedef struct {
  tpu_fin *fin; /* owned until moved into the cache entry */
  int nfin, capfin;
  int node;     /* the op being lowered */
  bool oom;
  tpu_hv *chk;       /* owned: the ops' value checks */
  tpu_fcheck *chkw;  /* owned until moved into the cache entry: their errors */
  int nchk, capchk;
} tpu_fuse_ctx;

static void tpu_fuse_add(tpu_fuse_ctx *x, tpu_fin f) {
  if (x->nfin == x->capfin) {
    int cap = x->capfin ? 2 * x->capfin : 64;
    tpu_fin *g = realloc(x->fin, sizeof *g * (size_t)cap);
    if (!g) {
      x->oom = true;
      return;
    }
    x->fin = g;
    x->capfin = cap;
  }
  x->fin[x->nfin++] = f;
}

static tpu_hv tpu_fuse_record_hook(tpu_lower *L, tpu_record *rec) {
  tpu_fuse_ctx *x = L->fuse;
  if (rec->fuse_val != TPU_HV_NONE) return rec->fuse_val;
  tpu_fuse_add(x, (tpu_fin){TPU_IN_RECORD, x->node, -1, -1, rec->fuse_id});
  int64_t n = rec->numel;
  rec->fuse_val = rec->fuse_param = tpu_hlo_param(L->hlo, tpu_hlo_type_make(rec->dtype, 1, &n));
  return rec->fuse_val;
}

static void tpu_fuse_input_hook(tpu_lower *L, tpu_in_kind kind, int arg, int item) {
  tpu_fuse_ctx *x = L->fuse;
  tpu_fuse_add(x, (tpu_fin){kind, x->node, arg, item, -1});
}

typedef struct {
  tpu_record **r; /* borrowed records, by flush id */
  int n, cap;
  bool oom;
} tpu_rectab;

static int tpu_fuse_id(tpu_rectab *t, tpu_record *r, uint64_t epoch) {
  if (r->fuse_epoch == epoch) return r->fuse_id;
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 128;
    tpu_record **g = realloc(t->r, sizeof *g * (size_t)cap);
    if (!g) {
      t->oom = true;
      return -1;
    }
    t->r = g;
    t->cap = cap;
  }
  r->fuse_epoch = epoch;
  r->fuse_id = t->n;
  r->fuse_val = r->fuse_param = TPU_HV_NONE;
  r->fuse_def = false;
  t->r[t->n++] = r;
  return r->fuse_id;
}

/* Lowers the recorded ops into one program (compiled through the cache
 * tiers) and builds the entry that says how to feed and unpack it. */
static tpu_status *tpu_fuse_lower(tpu_engine *e, tpu_rectab *tab, const tpu_sig *sig, uint64_t h,
                                  tpu_cache_entry **out) {
  *out = NULL;
  tpu_fuse_ctx x = {0};
  tpu_hlo *H = tpu_hlo_new();
  if (!H) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  tpu_hlo_set_exact_division(H, e->exact_div);
  tpu_status *s = NULL;
  for (int i = 0; i < e->nnodes && tpu_hlo_ok(H); i++) {
    tpu_node *n = &e->nodes[i];
    tpu_lower L;
    memset(&L, 0, sizeof L);
    L.hlo = H;
    L.args = n->args;
    L.nargs = n->nargs;
    L.opname = n->row->name;
    L.flags = n->row->flags;
    L.rng_state = TPU_HV_NONE;
    L.precision = e->precision;
    L.fuse = &x;
    L.fuse_record = tpu_fuse_record_hook;
    L.fuse_input = tpu_fuse_input_hook;
    x.node = i;
    tpu_hv shared[TPU_MAX_ARGS];
    if (n->share) {
      const tpu_node *p = &e->nodes[n->share_from];
      for (int a = 0; a < n->nargs; a++) shared[a] = n->share >> a & 1 ? p->args[a].value : TPU_HV_NONE;
      L.shared = shared;
    }
    tpu_lower_run(&L, n->row);
    if (!tpu_hlo_ok(H)) break;
    int j = 0;
    for (int k = 0; k < L.nout; k++) {
      tpu_record *r = NULL;
      if (L.out[k].kind == TPU_OUT_CHECK) {
        if (x.nchk == x.capchk) {
          int cap = x.capchk ? 2 * x.capchk : 8;
          tpu_hv *a = realloc(x.chk, sizeof *a * (size_t)cap);
          if (a) x.chk = a;
          tpu_fcheck *w = a ? realloc(x.chkw, sizeof *w * (size_t)cap) : NULL;
          if (w) x.chkw = w;
          if (!a || !w) {
            x.oom = true;
            continue;
          }
          x.capchk = cap;
        }
        x.chk[x.nchk] = L.outv[k];
        x.chkw[x.nchk++] = (tpu_fcheck){n->row->name, L.out[k].msg, L.out[k].arg};
        continue;
      }
      if (L.out[k].kind == TPU_OUT_WRITE) {
        tpu_in_plan p = {TPU_IN_RECORD, L.out[k].arg, L.out[k].item};
        r = tpu_arg_tref(n->args, &p)->rec;
      } else if (L.out[k].kind == TPU_OUT_NEW && j < n->nnew) {
        r = n->outrec[j++];
      }
      if (!r) continue;
      r->fuse_val = L.outv[k];
      r->fuse_def = true;
    }
  }
  int nres = 0;
  tpu_hv *res = malloc(sizeof *res * (size_t)(tab->n + x.nchk + 1));
  int *fout = malloc(sizeof *fout * (size_t)(tab->n ? tab->n : 1));
  if (!res || !fout || x.oom) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  for (int k = 0; k < tab->n && !s; k++) {
    tpu_record *r = tab->r[k];
    if (r->fuse_def && tpu_record_live(r)) {
      /* A record read and rewritten (a parameter, an optimizer moment) gives
       * its old buffer to the program for the new value: no copy, no second
       * buffer. */
      if (r->fuse_param != TPU_HV_NONE && e->donate) tpu_hlo_param_alias(H, r->fuse_param, nres);
      res[nres] = r->fuse_val;
      fout[nres++] = k;
    }
  }
  /* the value checks follow the records (none when no value is live) */
  int nchk = nres ? x.nchk : 0;
  for (int k = 0; k < nchk && !s; k++) res[nres + k] = x.chk[k];
  free(x.chk);
  char *text = NULL;
  size_t len = 0;
  if (!s) s = tpu_hlo_finish(H, res, nres + nchk, &text, &len);
  tpu_hlo_free(H);
  free(res);
  if (!s && getenv("TORCHTPU_DUMP_HLO")) fprintf(stderr, "-- fused program of %d ops\n%s\n", e->nnodes, text);
  tpu_rt_exec *exec = NULL;
  if (!s && nres) {
    char label[96];
    snprintf(label, sizeof label, "a fused program of %d ops", e->nnodes);
    s = tpu_engine_compile(e, text, len, label, &exec);
  }
  free(text);
  tpu_cache_entry *c = s ? NULL : calloc(1, sizeof *c);
  if (!s && (!c || !(c->key = malloc(sig->n)))) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (s) {
    free(c);
    free(fout);
    free(x.fin);
    free(x.chkw);
    tpu_rt_exec_free(exec);
    return s;
  }
  memcpy(c->key, sig->p, sig->n);
  c->keylen = sig->n;
  c->hash = h;
  c->exec = exec;
  c->fin = x.fin;
  c->nfin = x.nfin;
  c->fout = fout;
  c->nfout = nres;
  c->fchk = x.chkw;
  c->nfchk = nchk;
  if (!tpu_cache_insert(e, c)) {
    tpu_cache_entry_free(c);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  *out = c;
  return NULL;
}

/* Feeds and runs a fused program; its outputs become the records' buffers. */
static tpu_status *tpu_fuse_run(tpu_engine *e, tpu_cache_entry *c, tpu_rectab *tab) {
  if (!c->nfout) return NULL; /* every value it would compute is dead */
  int nin = c->nfin;
  tpu_rt_buffer **inbuf = calloc((size_t)nin + 1, sizeof *inbuf);
  tpu_rt_buffer **temps = calloc((size_t)nin + 1, sizeof *temps);
  tpu_rt_buffer **outbuf = calloc((size_t)(c->nfout + c->nfchk), sizeof *outbuf);
  tpu_status *s = (!inbuf || !temps || !outbuf) ? tpu_status_new(TPU_ERR_MEMORY, "out of memory") : NULL;
  int ntemp = 0;
  e->epoch++;
  for (int k = 0; k < nin && !s; k++) {
    const tpu_fin *f = &c->fin[k];
    tpu_node *n = &e->nodes[f->node];
    tpu_in_plan p = {f->kind, f->arg, f->item};
    tpu_record *r = f->kind == TPU_IN_RECORD ? tab->r[f->rec] : NULL;
    s = tpu_input_buffer(e, &p, n->args, r, n->rng_offset, &inbuf[k], &temps[ntemp]);
    if (s) s = tpu_status_prefix(s, "running a fused program of %d ops (an input of aten::%s)", e->nnodes, n->row->name);
    else if (temps[ntemp]) ntemp++;
  }
  if (!s) {
    s = tpu_engine_launch(e, c->exec, inbuf, nin, outbuf, NULL);
    if (s) s = tpu_status_prefix(s, "running a fused program of %d ops", e->nnodes);
  }
  for (int k = 0; k < ntemp; k++) tpu_rt_buffer_free(temps[k]);
  if (!s) {
    for (int k = 0; k < c->nfout; k++) {
      tpu_record *r = tab->r[c->fout[k]];
      tpu_rt_buffer_free(r->buf);
      r->buf = outbuf[k];
    }
    for (int k = 0; k < c->nfchk; k++) tpu_check_push(e, outbuf[c->nfout + k], c->fchk[k]);
    atomic_fetch_add(&e->metrics.fused_programs, 1);
    atomic_fetch_add(&e->metrics.fused_ops, e->nnodes);
  }
  free(inbuf);
  free(temps);
  free(outbuf);
  return s;
}

/* A fused program was compiled (recompiles explained): when a program for the
 * same ops is in the cache, say which part of the key differs. */
static void tpu_fuse_explain(tpu_engine *e, tpu_cache_entry *c, const uint64_t ex[4]) {
  memcpy(c->ex, ex, sizeof c->ex);
  c->ex_nodes = e->nnodes;
  const tpu_cache_entry *old = NULL;
  for (size_t i = 0; i < e->cache_cap && !old; i++) {
    const tpu_cache_entry *o = e->cache[i];
    if (o && o != c && o->ex_nodes == c->ex_nodes && o->ex[0] == ex[0]) old = o;
  }
  if (!old || e->nnotes == (int)(sizeof e->notes / sizeof e->notes[0])) return;
  const char *parts[3];
  int np = 0;
  if (old->ex[1] != ex[1]) parts[np++] = "which tensors the ops read and write";
  if (old->ex[2] != ex[2]) parts[np++] = "which numbers of a torch._foreach_* call are equal";
  if (old->ex[3] != ex[3])
    parts[np++] = "which of the tensors it computes are still held when it runs (one kept in one step and not in another)";
  char what[512] = "";
  for (int k = 0, o = 0; k < np; k++) o += snprintf(what + o, sizeof what - (size_t)o, "%s%s", k ? "; " : "", parts[k]);
  char *note = np ? tpu_strfmt("torchtpu: recompiling a fused program of %d ops (the same ops were compiled before "
                               "into another program): %s differs",
                               e->nnodes, what)
                  : tpu_strfmt("torchtpu: recompiling a fused program of %d ops compiled before with the same inputs "
                               "(the program cache was emptied, or the matmul precision changed)",
                               e->nnodes);
  if (note) e->notes[e->nnotes++] = note;
}

/* Keys the recorded ops and finds (or lowers and compiles) their program;
 * tab receives the flush's record table (the caller frees tab->r). */
/* Whether node n names a record marked needed in this flush (epoch), and if
 * mark, marks all it names. */
static bool tpu_node_needs(tpu_node *n, uint64_t epoch, bool mark) {
  bool hit = false;
  for (int a = 0; a < n->nargs && (mark || !hit); a++) {
    tpu_arg *x = &n->args[a];
    int cnt = x->kind == TPU_ARG_TENSORS ? x->nlist : x->kind == TPU_ARG_TENSOR ? 1 : 0;
    for (int j = 0; j < cnt; j++) {
      tpu_record *r = x->kind == TPU_ARG_TENSORS ? x->list[j].rec : x->t.rec;
      if (!r) continue;
      hit |= r->need_epoch == epoch;
      if (mark) r->need_epoch = epoch;
    }
  }
  for (int j = 0; j < n->nnew && (mark || !hit); j++) {
    hit |= n->outrec[j]->need_epoch == epoch;
    if (mark) n->outrec[j]->need_epoch = epoch;
  }
  return hit;
}

/* Drops the recorded ops whose results nobody needs: an op is kept when a
 * record it names (reads, writes or makes) is live at the flush or named by
 * a kept op after it. The others are released before the program is built,
 * so neither their results nor their inputs take memory (an op on a dead
 * tensor that was never written would otherwise get a buffer of zeros as
 * its input). Not while a graph is captured (its replays decide). */
static void tpu_nodes_prune(tpu_engine *e, uint64_t epoch) {
  if (e->capturing || e->nnodes == 0) return;
  bool *keep = calloc((size_t)e->nnodes, 1);
  if (!keep) return; /* keeping every op is always right */
  for (int i = 0; i < e->nnodes; i++) {
    tpu_node *n = &e->nodes[i];
    for (int a = 0; a < n->nargs; a++) {
      tpu_arg *x = &n->args[a];
      int cnt = x->kind == TPU_ARG_TENSORS ? x->nlist : x->kind == TPU_ARG_TENSOR ? 1 : 0;
      for (int j = 0; j < cnt; j++) {
        tpu_record *r = x->kind == TPU_ARG_TENSORS ? x->list[j].rec : x->t.rec;
        if (r && tpu_record_live(r)) r->need_epoch = epoch;
      }
    }
    for (int j = 0; j < n->nnew; j++)
      if (tpu_record_live(n->outrec[j])) n->outrec[j]->need_epoch = epoch;
  }
  int dropped = 0;
  for (int i = e->nnodes - 1; i >= 0; i--) {
    tpu_node *n = &e->nodes[i];
    keep[i] = keep[i] || tpu_node_needs(n, epoch, false);
    if (!keep[i]) {
      dropped++;
      continue;
    }
    tpu_node_needs(n, epoch, true);
    if (n->share) keep[n->share_from] = true; /* its program input is read */
  }
  if (dropped) {
    int *at = malloc(sizeof *at * (size_t)e->nnodes);
    if (at) {
      int w = 0;
      for (int i = 0; i < e->nnodes; i++) {
        at[i] = w;
        if (keep[i]) e->nodes[w++] = e->nodes[i];
        else tpu_node_release(&e->nodes[i]);
      }
      for (int i = 0; i < w; i++)
        if (e->nodes[i].share) e->nodes[i].share_from = at[e->nodes[i].share_from];
      e->nnodes = w;
      atomic_fetch_add(&e->metrics.ops_pruned, dropped);
      free(at);
    }
  }
  free(keep);
}

static tpu_status *tpu_flush_prepare(tpu_engine *e, int reason, tpu_rectab *tab, tpu_cache_entry **out) {
  *out = NULL;
  atomic_fetch_add(&e->metrics.flushes[reason], 1);
  uint64_t epoch = ++e->fuse_epoch;
  tpu_nodes_prune(e, epoch);
  tpu_sig sig = {0};
  /* The key: every op's signature and which record each of its tensors
   * names (flush-local ids, in order of first use), then which records are
   * live. The same training step gives the same key every time. */
  tpu_sig_i64(&sig, -1);
  tpu_sig_i64(&sig, e->precision);
  tpu_sig_i64(&sig, tpu_lower_value_checks); /* programs with and without checks differ */
  /* With recompiles explained, the key's parts are hashed apart too: a
   * program compiled for the same ops as an earlier one says which part
   * differs. */
  uint64_t ex[4] = {0};
  for (int i = 0; i < e->nnodes; i++) {
    tpu_node *n = &e->nodes[i];
    size_t at = sig.n;
    tpu_sig_put(&sig, n->sig, n->siglen);
    int64_t share = n->share ? (int64_t)((uint64_t)n->share << 32 | (uint32_t)n->share_from) : 0;
    tpu_sig_i64(&sig, share);
    size_t flow = sig.n;
    for (int a = 0; a < n->nargs; a++) {
      tpu_arg *x = &n->args[a];
      if (x->kind == TPU_ARG_TENSOR && x->t.rec) tpu_sig_i64(&sig, tpu_fuse_id(tab, x->t.rec, epoch));
      if (x->kind == TPU_ARG_TENSORS)
        for (int j = 0; j < x->nlist; j++)
          if (x->list[j].rec) tpu_sig_i64(&sig, tpu_fuse_id(tab, x->list[j].rec, epoch));
    }
    for (int j = 0; j < n->nnew; j++) tpu_sig_i64(&sig, tpu_fuse_id(tab, n->outrec[j], epoch));
    if (e->explain && !sig.oom) {
      ex[0] = tpu_hash64(&ex[0], sizeof ex[0]) ^ tpu_hash64(sig.p + at, n->siglen);
      ex[1] = tpu_hash64(&ex[1], sizeof ex[1]) ^ tpu_hash64(sig.p + flow, sig.n - flow);
      ex[2] = tpu_hash64(&ex[2], sizeof ex[2]) ^ (uint64_t)share;
    }
  }
  size_t live = sig.n;
  for (int k = 0; k < tab->n; k++) tpu_sig_i64(&sig, tpu_record_live(tab->r[k]));
  if (e->explain && !sig.oom) ex[3] = tpu_hash64(sig.p + live, sig.n - live);
  tpu_status *s = (sig.oom || tab->oom) ? tpu_status_new(TPU_ERR_MEMORY, "out of memory") : NULL;
  if (!s) {
    uint64_t h = tpu_hash_bytes(sig.p, sig.n);
    *out = tpu_cache_find(e, &sig, h);
    if (*out) {
      atomic_fetch_add(&e->metrics.cache_hits, 1);
    } else {
      atomic_fetch_add(&e->metrics.cache_misses, 1);
      s = tpu_fuse_lower(e, tab, &sig, h, out);
      if (!s && e->explain) tpu_fuse_explain(e, *out, ex);
    }
  }
  tpu_sig_done(&sig);
  return s;
}

/* What a flush during a torch.tpu.graph capture was for, for its error. */
static const char *tpu_flush_what(int reason) {
  switch (reason) {
    case TPU_FLUSH_DOWNLOAD: return "reading a value the graph computes (.item(), .cpu(), printing, a data-dependent shape)";
    case TPU_FLUSH_UPLOAD: return "copying host data into a tensor the graph writes";
    case TPU_FLUSH_SYNC: return "synchronizing";
    case TPU_FLUSH_CAP: return "recording more ops than TORCHTPU_FUSED_MAX_OPS (raise it)";
    default: return "changing the eager mode or running a compiled graph";
  }
}

tpu_status *tpu_engine_flush(tpu_engine *e, int reason) {
  if (!e->nnodes) return NULL;
  if (e->capturing && e->capture_whole)
    return tpu_status_new(TPU_ERR_RUNTIME,
                          "%s is not allowed while a graph is captured (torch.tpu.graph): the captured ops run "
                          "at replay(), so read or copy values outside the capture",
                          tpu_flush_what(reason));
  if (e->capturing) e->capture_split = true;
  tpu_rectab tab = {0};
  tpu_cache_entry *c = NULL;
  tpu_status *s = tpu_flush_prepare(e, reason, &tab, &c);
  if (!s) s = tpu_fuse_run(e, c, &tab);
  free(tab.r);
  tpu_nodes_release(e);
  return s;
}

/* At most TPU_STEPS_AHEAD launched steps in flight: the host waits for the oldest. */
static void tpu_steps_throttle(tpu_engine *e) {
  while (e->icount > TPU_STEPS_AHEAD) tpu_inflight_pop(e);
}

static tpu_status *tpu_engine_launch_step(tpu_engine *e, int reason) {
  if (e->mode != TPU_MODE_FUSED || e->capturing) return NULL; /* a capture is one program */
  tpu_status *s = tpu_engine_flush(e, reason);
  if (!s) tpu_steps_throttle(e);
  return s;
}

tpu_status *tpu_engine_flush_step(tpu_engine *e) { return tpu_engine_launch_step(e, TPU_FLUSH_STEP); }

tpu_status *tpu_engine_backward_begins(tpu_engine *e) {
  if (e->mode != TPU_MODE_FUSED) return NULL;
  atomic_fetch_add(&e->metrics.backward_passes, 1);
  return tpu_engine_launch_step(e, TPU_FLUSH_BACKWARD);
}

bool tpu_engine_idle(tpu_engine *e) {
  tpu_inflight_reap(e);
  return e->icount == 0 && e->nnodes == 0;
}

/* zero_ of a whole small record is an upload of zeros, not a program: a
 * program per new shape would be compiled (autograd zero-fills gradients of
 * every shape it meets). In fused mode too when no recorded op reads or writes
 * the record (a new one: an optimizer's state made at its first step), so that
 * the first step's program is the steady step's program, whose inputs that
 * state is, and not a second program with the zeros inside (one compile less,
 * and the memory XLA takes for it); never inside a capture, which must redo
 * the zeroing at each replay. */
enum { TPU_FILL_UPLOAD_MAX = 1 << 20 };

static bool tpu_fill_by_upload(const tpu_engine *e, int op_id, const tpu_arg *args, int nargs) {
  if (op_id != TPU_OP_zero_ || nargs < 1 || args[0].kind != TPU_ARG_TENSOR || e->capturing) return false;
  const tpu_tref *t = &args[0].t;
  if (!t->rec || t->host || t->zero_size || t->offset != 0) return false;
  if (e->mode == TPU_MODE_FUSED && atomic_load(&t->rec->graph_refs) > 0) return false;
  if (t->rec_dtype != TPU_INVALID && t->rec_dtype != t->dtype) return false;
  int64_t numel = 1, want = 1;
  for (int d = t->rank - 1; d >= 0; d--) {
    if (t->sizes[d] != 1 && t->strides[d] != want) return false;
    want *= t->sizes[d];
    numel *= t->sizes[d];
  }
  return numel == t->rec_numel && (size_t)numel * tpu_dtype_size(t->dtype) <= TPU_FILL_UPLOAD_MAX;
}

tpu_status *tpu_engine_call(tpu_engine *e, const tpu_op_row *row, int op_id,
                            tpu_arg *args, int nargs, tpu_engine_result *res) {
  res->nout = res->nret = 0; /* only the counted entries are read (12 KB: not cleared) */
  atomic_fetch_add(&e->metrics.ops_dispatched, 1);
  if (row->flags & TPU_OP_FILL_VALUE) /* checked on every call: the value is not part of the program */
    for (int i = 1; i < nargs; i++) {
      tpu_status *s = tpu_scalar_check(&args[i], args[0].t.dtype);
      if (s) return s;
    }
  if (row->flags & TPU_OP_CHECK_ARGS) {
    tpu_status *s = tpu_check_args(row->name, args, nargs);
    if (s) return s;
  }
  if (tpu_fill_by_upload(e, op_id, args, nargs)) {
    tpu_record *r = args[0].t.rec;
    void *zeros = calloc((size_t)r->numel * tpu_dtype_size(r->dtype) + 1, 1);
    if (!zeros) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    tpu_status *s = tpu_engine_upload(e, r, zeros, r->dtype, 1, &r->numel);
    free(zeros);
    if (s) return s;
    res->nret = 1;
    res->ret[0] = (tpu_ret_plan){.is_arg = true, .index = 0, .item = -1};
    return NULL;
  }
  tpu_classify_views(args, nargs);
  uint8_t sigbuf[1024];
  tpu_sig sig = {sigbuf, 0, sizeof sigbuf, false, false};
  tpu_sig_build(&sig, op_id, args, nargs);
  tpu_sig_i64(&sig, e->precision);
  tpu_sig_i64(&sig, tpu_lower_value_checks); /* programs with and without checks differ */
  if (sig.oom) {
    tpu_sig_done(&sig);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  uint64_t h = tpu_hash_bytes(sig.p, sig.n);
  tpu_cache_entry *c = tpu_cache_find(e, &sig, h);
  tpu_status *s = NULL;
  bool fused = e->mode == TPU_MODE_FUSED;
  if (c && (c->exec || fused)) {
    atomic_fetch_add(&e->metrics.cache_hits, 1);
  } else {
    atomic_fetch_add(&e->metrics.cache_misses, 1);
    s = tpu_engine_lower(e, row, args, nargs, &sig, h, !fused, &c);
  }
  if (!s) s = tpu_check_overlap(row, args, c);
  if (!s && fused) s = tpu_engine_record(e, row, op_id, args, nargs, &sig, c, res);
  tpu_sig_done(&sig);
  if (s || fused) return s;

  tpu_rt_buffer *inbuf[TPU_MAX_INS];
  tpu_rt_buffer *temps[TPU_MAX_INS + 1] = {0};
  int ntemp = 0;
  e->epoch++;
  uint64_t rng_offset = e->rng_offset;
  for (int k = 0; k < c->nin && !s; k++) {
    const tpu_in_plan *p = &c->in[k];
    tpu_record *r = p->kind == TPU_IN_RECORD ? tpu_arg_tref(args, p)->rec : NULL;
    if (p->kind == TPU_IN_RNG) e->rng_offset += (uint64_t)c->rng_words;
    s = tpu_input_buffer(e, p, args, r, rng_offset, &inbuf[k], &temps[ntemp]);
    if (s) s = tpu_status_prefix(s, "running aten::%s (an input)", row->name);
    else if (temps[ntemp]) ntemp++;
  }
  tpu_rt_buffer *outbuf[TPU_MAX_OUTS] = {0};
  if (!s) {
    s = tpu_engine_launch(e, c->exec, inbuf, c->nin, outbuf, row->name);
    if (s) s = tpu_status_prefix(s, "running aten::%s", row->name);
  }
  for (int k = 0; k < ntemp; k++) tpu_rt_buffer_free(temps[k]);
  if (s) return s;

  /* Writes first replace the records' buffers; new outputs become records. */
  int nnew = 0;
  for (int k = 0; k < c->nout; k++) {
    const tpu_out_plan *o = &c->out[k];
    if (o->kind == TPU_OUT_WRITE) {
      tpu_in_plan p = {TPU_IN_RECORD, o->arg, o->item};
      tpu_record *r = tpu_arg_tref(args, &p)->rec;
      tpu_rt_buffer_free(r->buf);
      r->buf = outbuf[k];
      outbuf[k] = NULL;
    } else if (o->kind == TPU_OUT_NEW) {
      tpu_record *r = tpu_record_new(e, o->type.dtype, tpu_hlo_type_numel(&o->type));
      if (!r) {
        s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
        break;
      }
      r->buf = outbuf[k];
      outbuf[k] = NULL;
      res->outs[nnew] = r;
      res->types[nnew] = o->type;
      nnew++;
    } else if (o->kind == TPU_OUT_CHECK && outbuf[k]) {
      tpu_check_push(e, outbuf[k], (tpu_fcheck){row->name, o->msg, o->arg});
      outbuf[k] = NULL;
    }
  }
  for (int k = 0; k < c->nout; k++) tpu_rt_buffer_free(outbuf[k]);
  if (!s && e->mode == TPU_MODE_DEBUG && e->nchk) s = tpu_checks_read(e); /* debug: raised by the op */
  res->nout = nnew;
  res->nret = c->nret;
  memcpy(res->ret, c->ret, sizeof(tpu_ret_plan) * (size_t)c->nret);
  if (s) tpu_engine_result_release(res);
  return s;
}

void tpu_engine_result_release(tpu_engine_result *res) {
  for (int i = 0; i < res->nout; i++) tpu_record_unref(res->outs[i]);
  res->nout = 0;
}

/* ---- graph plans ------------------------------------------------------------------- */

/* Where a program input comes from, or where a program output goes. */
enum { TPU_SRC_IN, TPU_SRC_HELD, TPU_SRC_CONST, TPU_SRC_RNG, TPU_SRC_NEW };

typedef struct {
  int kind;             /* TPU_SRC_* */
  int idx;              /* graph input, held record or new record */
  uint64_t rng;         /* RNG: the op's offset from the graph's first */
  tpu_rt_buffer *buf;   /* CONST: owned */
} tpu_plan_src;

struct tpu_plan {
  tpu_engine *eng;      /* NULL once released */
  struct tpu_plan *prev, *next;
  tpu_cache_entry *c;   /* referenced */
  int nops;
  int nin;
  tpu_tref *in;         /* the inputs' layout at capture (records cleared) */
  int *in_alias;        /* the first input sharing its record, -1 for none */
  tpu_record **held;    /* referenced: records the graph reads or writes but does not take as inputs */
  int nheld;
  tpu_plan_src *src;    /* by program input (c->nfin) */
  tpu_plan_src *dst;    /* by program output (c->nfout): IN, HELD or NEW */
  tpu_dtype *new_dt;    /* the new records' dtypes and sizes */
  int64_t *new_numel;
  int nnew;
  uint64_t rng_span;
  int nout;
  tpu_tref *out;        /* the outputs' views at capture */
  tpu_plan_src *osrc;   /* by output: IN, HELD or NEW */
};

static void tpu_plan_release(tpu_plan *p) {
  tpu_engine *e = p->eng;
  if (!e) return;
  if (p->prev) p->prev->next = p->next;
  else e->plans = p->next;
  if (p->next) p->next->prev = p->prev;
  p->eng = NULL;
  tpu_cache_entry_free(p->c);
  for (int i = 0; i < p->nheld; i++) tpu_record_unref(p->held[i]);
  if (p->src)
    for (int k = 0; k < p->c->nfin; k++) tpu_rt_buffer_free(p->src[k].buf);
  free(p->in);
  free(p->in_alias);
  free(p->held);
  free(p->src);
  free(p->dst);
  free(p->new_dt);
  free(p->new_numel);
  free(p->out);
  free(p->osrc);
}

void tpu_plan_free(tpu_plan *p) {
  if (!p) return;
  tpu_plan_release(p);
  free(p);
}

int tpu_plan_nout(const tpu_plan *p) { return p->nout; }

const tpu_tref *tpu_plan_output(const tpu_plan *p, int j, int *input) {
  *input = p->osrc[j].kind == TPU_SRC_IN ? p->osrc[j].idx : -1;
  return &p->out[j];
}

tpu_status *tpu_engine_capture_begin(tpu_engine *e, int *prev) {
  if (e->capturing && e->capture_whole) {
    *prev = -1; /* inside torch.tpu.graph: the graph's ops join that recording */
    return NULL;
  }
  *prev = e->mode;
  tpu_status *s = tpu_engine_flush(e, TPU_FLUSH_MODE);
  if (s) return s;
  e->mode = TPU_MODE_FUSED;
  e->capturing = true;
  e->capture_split = false;
  e->capture_birth = e->records_made;
  e->capture_rng = e->rng_offset;
  return NULL;
}

/* Index of r among the plan's held records, added (referenced) if new; -1
 * when out of memory. */
static int tpu_plan_hold(tpu_plan *p, tpu_record *r, int *cap) {
  for (int i = 0; i < p->nheld; i++)
    if (p->held[i] == r) return i;
  if (p->nheld == *cap) {
    int nc = *cap ? 2 * *cap : 8;
    tpu_record **g = realloc(p->held, sizeof *g * (size_t)nc);
    if (!g) return -1;
    p->held = g;
    *cap = nc;
  }
  tpu_record_ref(r);
  p->held[p->nheld] = r;
  return p->nheld++;
}

/* The first input naming record r, or -1. */
static int tpu_input_of(const tpu_tref *ins, int nin, const tpu_record *r) {
  for (int i = 0; i < nin; i++)
    if (ins[i].rec == r) return i;
  return -1;
}

/* Builds the plan of the recorded graph (before it runs: the nodes are
 * still there). NULL with *why when a part of it cannot be replayed. */
static tpu_status *tpu_plan_build(tpu_engine *e, tpu_rectab *tab, tpu_cache_entry *c, const tpu_tref *ins,
                                  int nin, const tpu_tref *outs, int nout, tpu_plan **out, const char **why) {
  *out = NULL;
  uint64_t epoch = e->fuse_epoch;
  int n = tab->n ? tab->n : 1;
  tpu_plan *p = calloc(1, sizeof *p);
  int *cls = calloc((size_t)n, sizeof *cls), *idx = calloc((size_t)n, sizeof *idx);
  int heldcap = 0;
  if (!p || !cls || !idx) goto oom;
  p->eng = e;
  p->next = e->plans;
  if (e->plans) e->plans->prev = p;
  e->plans = p;
  p->c = c;
  c->refs++;
  p->nops = e->nnodes;
  p->nin = nin;
  p->nout = nout;
  p->rng_span = e->rng_offset - e->capture_rng;
  p->in = calloc((size_t)(nin ? nin : 1), sizeof *p->in);
  p->in_alias = calloc((size_t)(nin ? nin : 1), sizeof *p->in_alias);
  p->src = calloc((size_t)(c->nfin ? c->nfin : 1), sizeof *p->src);
  p->dst = calloc((size_t)(c->nfout ? c->nfout : 1), sizeof *p->dst);
  p->new_dt = calloc((size_t)n + (size_t)nout, sizeof *p->new_dt);
  p->new_numel = calloc((size_t)n + (size_t)nout, sizeof *p->new_numel);
  p->out = calloc((size_t)(nout ? nout : 1), sizeof *p->out);
  p->osrc = calloc((size_t)(nout ? nout : 1), sizeof *p->osrc);
  if (!p->in || !p->in_alias || !p->src || !p->dst || !p->new_dt || !p->new_numel || !p->out || !p->osrc) goto oom;
  for (int i = 0; i < nin; i++) {
    p->in[i] = ins[i];
    p->in[i].rec = NULL;
    p->in_alias[i] = ins[i].rec ? tpu_input_of(ins, nin, ins[i].rec) : -1;
  }
  /* Each record of the flush: made by a recorded op (NEW), a graph input
   * (IN), or something the graph holds (HELD: made before the capture). */
  for (int k = 0; k < tab->n; k++) cls[k] = -1;
  for (int i = 0; i < e->nnodes; i++)
    for (int j = 0; j < e->nodes[i].nnew; j++) {
      tpu_record *r = e->nodes[i].outrec[j];
      if (r->fuse_epoch == epoch) cls[r->fuse_id] = TPU_SRC_NEW;
    }
  for (int k = 0; k < tab->n; k++) {
    if (cls[k] == TPU_SRC_NEW) {
      idx[k] = -1;
      continue;
    }
    int i = tpu_input_of(ins, nin, tab->r[k]);
    if (i >= 0) {
      cls[k] = TPU_SRC_IN;
      idx[k] = i;
    } else if (tab->r[k]->birth < e->capture_birth || e->capture_whole) {
      /* a whole-step capture keeps the tensors it made: replays write into them */
      cls[k] = TPU_SRC_HELD;
      if ((idx[k] = tpu_plan_hold(p, tab->r[k], &heldcap)) < 0) goto oom;
    } else if (!tab->r[k]->buf) {
      /* torch.empty in the graph: a fresh record on every call */
      cls[k] = TPU_SRC_NEW;
      p->new_dt[p->nnew] = tab->r[k]->dtype;
      p->new_numel[p->nnew] = tab->r[k]->numel;
      idx[k] = p->nnew++;
    } else {
      *why = "the graph reads a tensor made while it ran, outside its recorded ops";
      goto fail;
    }
  }
  for (int k = 0; k < c->nfin; k++) {
    const tpu_fin *f = &c->fin[k];
    tpu_plan_src *d = &p->src[k];
    if (f->kind == TPU_IN_RECORD) {
      if (cls[f->rec] == TPU_SRC_NEW && idx[f->rec] < 0) {
        *why = "the program reads a value before a recorded op makes it";
        goto fail;
      }
      d->kind = cls[f->rec];
      d->idx = idx[f->rec];
      continue;
    }
    tpu_node *nd = &e->nodes[f->node];
    if (f->kind == TPU_IN_RNG) {
      d->kind = TPU_SRC_RNG;
      d->rng = nd->rng_offset - e->capture_rng;
      continue;
    }
    /* Python numbers, view offsets and CPU scalars are fixed by the graph
     * and its inputs' layout: uploaded once. */
    uint8_t bits[16] = {0};
    tpu_dtype dt;
    tpu_in_plan ip = {f->kind, f->arg, f->item};
    if (f->kind == TPU_IN_SCALAR) {
      dt = tpu_scalar_bits(&nd->args[f->arg], bits);
    } else if (f->kind == TPU_IN_OFFSET) {
      dt = TPU_S64;
      memcpy(bits, &tpu_arg_tref(nd->args, &ip)->offset, sizeof(int64_t));
    } else {
      tpu_tref *t = tpu_arg_tref(nd->args, &ip);
      dt = t->dtype;
      memcpy(bits, t->host_bytes, tpu_dtype_size(dt));
    }
    d->kind = TPU_SRC_CONST;
    tpu_status *s = tpu_rt_buffer_from_host(e->rt, bits, dt, NULL, 0, &d->buf);
    if (s) {
      tpu_plan_free(p);
      free(cls);
      free(idx);
      return s;
    }
  }
  /* Program outputs: into a graph input's record, a held record, or a new one. */
  int *newof = idx; /* for NEW records: their index among the plan's new records, -1 until one */
  for (int k = 0; k < c->nfout; k++) {
    int r = c->fout[k];
    p->dst[k].kind = cls[r];
    if (cls[r] == TPU_SRC_NEW && e->capture_whole) {
      p->dst[k].kind = TPU_SRC_HELD;
      if ((p->dst[k].idx = tpu_plan_hold(p, tab->r[r], &heldcap)) < 0) goto oom;
    } else if (cls[r] == TPU_SRC_NEW && newof[r] >= 0) {
      p->dst[k].idx = newof[r];
    } else if (cls[r] == TPU_SRC_NEW) {
      newof[r] = p->nnew;
      p->new_dt[p->nnew] = tab->r[r]->dtype;
      p->new_numel[p->nnew] = tab->r[r]->numel;
      p->dst[k].idx = p->nnew++;
    } else {
      p->dst[k].idx = idx[r];
    }
  }
  for (int j = 0; j < nout; j++) {
    const tpu_tref *t = &outs[j];
    tpu_record *r = t->rec;
    if (t->zero_size || t->host || !r || (t->rec_dtype != TPU_INVALID && t->rec_dtype != t->dtype)) {
      *why = "an output is empty, on the CPU, or reinterprets its storage";
      goto fail;
    }
    p->out[j] = *t;
    p->out[j].rec = NULL;
    tpu_plan_src *o = &p->osrc[j];
    int i = tpu_input_of(ins, nin, r);
    if (r->fuse_epoch == epoch && cls[r->fuse_id] == TPU_SRC_NEW) {
      o->kind = TPU_SRC_NEW;
      o->idx = newof[r->fuse_id];
      if (o->idx < 0) {
        *why = "an output is not computed by the program";
        goto fail;
      }
    } else if (i >= 0) {
      o->kind = TPU_SRC_IN;
      o->idx = i;
    } else if (r->birth < e->capture_birth) {
      o->kind = TPU_SRC_HELD;
      if ((o->idx = tpu_plan_hold(p, r, &heldcap)) < 0) goto oom;
    } else if (!r->buf && r->fuse_epoch != epoch) {
      o->kind = TPU_SRC_NEW; /* torch.empty returned as it is */
      p->new_dt[p->nnew] = r->dtype;
      p->new_numel[p->nnew] = r->numel;
      o->idx = p->nnew++;
    } else {
      *why = "an output was made while the graph ran, outside its recorded ops";
      goto fail;
    }
  }
  free(cls);
  free(idx);
  *out = p;
  return NULL;
fail:
  tpu_plan_free(p);
  free(cls);
  free(idx);
  return NULL;
oom:
  tpu_plan_free(p);
  free(cls);
  free(idx);
  return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
}

tpu_status *tpu_engine_capture_end(tpu_engine *e, int prev, const tpu_tref *ins, int nin, const tpu_tref *outs,
                                   int nout, tpu_plan **plan, const char **why) {
  if (plan) *plan = NULL;
  *why = NULL;
  if (prev < 0) {
    *why = "it ran inside a torch.tpu.graph capture, which replays it";
    return NULL;
  }
  bool split = e->capture_split;
  e->capturing = false;
  tpu_status *s = NULL;
  if (!e->nnodes) {
    *why = "the graph runs no tpu op";
  } else {
    tpu_rectab tab = {0};
    tpu_cache_entry *c = NULL;
    s = tpu_flush_prepare(e, TPU_FLUSH_MODE, &tab, &c);
    if (!s && split) *why = "the graph was run in pieces (a sync point inside it, or TORCHTPU_FUSED_MAX_OPS)";
    if (!s && !split && plan) s = tpu_plan_build(e, &tab, c, ins, nin, outs, nout, plan, why);
    if (!s) s = tpu_fuse_run(e, c, &tab);
    if (s && plan) {
      tpu_plan_free(*plan);
      *plan = NULL;
    }
    free(tab.r);
    tpu_nodes_release(e);
  }
  e->mode = prev;
  return s;
}

tpu_status *tpu_engine_graph_begin(tpu_engine *e, int *prev) {
  if (e->capturing)
    return tpu_status_new(TPU_ERR_RUNTIME, "a graph is already being captured: captures do not nest");
  tpu_status *s = tpu_engine_capture_begin(e, prev);
  if (!s) e->capture_whole = true;
  return s;
}

bool tpu_engine_graph_capturing(const tpu_engine *e) { return e->capturing && e->capture_whole; }

tpu_status *tpu_engine_graph_end(tpu_engine *e, int prev, bool keep, tpu_plan **plan) {
  *plan = NULL;
  tpu_status *s = NULL;
  if (keep && e->nnodes) {
    tpu_rectab tab = {0};
    tpu_cache_entry *c = NULL;
    const char *why = NULL;
    s = tpu_flush_prepare(e, TPU_FLUSH_MODE, &tab, &c);
    if (!s) s = tpu_plan_build(e, &tab, c, NULL, 0, NULL, 0, plan, &why);
    if (!s && !*plan)
      s = tpu_status_new(TPU_ERR_RUNTIME, "the captured graph cannot be replayed: %s", why ? why : "no plan");
    free(tab.r);
  }
  /* Nothing recorded runs now: the tensors keep their values from before the
   * capture (those made during it have none until the first replay). */
  tpu_nodes_release(e);
  e->capturing = e->capture_whole = false;
  e->mode = prev;
  return s;
}

tpu_status *tpu_engine_graph_replay(tpu_engine *e, tpu_plan *p) {
  if (e->capturing) return tpu_status_new(TPU_ERR_RUNTIME, "replay() of a graph while a graph is being captured");
  tpu_status *s = tpu_plan_run(e, p, NULL, 0, NULL);
  if (!s) tpu_steps_throttle(e);
  return s;
}

static bool tpu_same_view(const tpu_tref *a, const tpu_tref *b) {
  if (a->dtype != b->dtype || a->rank != b->rank || a->host != b->host || a->zero_size != b->zero_size) return false;
  if (memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)a->rank)) return false;
  if (a->zero_size || a->host) return true;
  return !memcmp(a->strides, b->strides, sizeof(int64_t) * (size_t)a->rank) && a->offset == b->offset &&
         a->rec_numel == b->rec_numel && a->rec_dtype == b->rec_dtype;
}

bool tpu_plan_matches(const tpu_plan *p, const tpu_tref *ins, int nin) {
  if (!p->eng || nin != p->nin) return false;
  for (int i = 0; i < nin; i++) {
    if (!tpu_same_view(&p->in[i], &ins[i])) return false;
    int a = ins[i].rec ? tpu_input_of(ins, nin, ins[i].rec) : -1;
    if (a != p->in_alias[i]) return false;
    for (int h = 0; h < p->nheld && ins[i].rec; h++)
      if (p->held[h] == ins[i].rec) return false;
  }
  return true;
}

tpu_status *tpu_plan_run(tpu_engine *e, tpu_plan *p, const tpu_tref *ins, int nin, tpu_record **outs) {
  if (p->eng != e || nin != p->nin) return tpu_status_new(TPU_ERR_RUNTIME, "a graph plan was run on other inputs");
  tpu_status *s = tpu_engine_flush(e, TPU_FLUSH_MODE);
  if (s) return s;
  tpu_cache_entry *c = p->c;
  uint64_t rng_base = e->rng_offset;
  e->rng_offset += p->rng_span;
  int nin_p = c->nfin;
  tpu_rt_buffer **inbuf = calloc((size_t)nin_p + 1, sizeof *inbuf);
  tpu_rt_buffer **temps = calloc((size_t)nin_p + 1, sizeof *temps);
  tpu_rt_buffer **outbuf = calloc((size_t)(c->nfout + c->nfchk) + 1, sizeof *outbuf);
  tpu_record **fresh = calloc((size_t)p->nnew + 1, sizeof *fresh);
  if (!inbuf || !temps || !outbuf || !fresh) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  int ntemp = 0;
  e->epoch++;
  for (int m = 0; m < p->nnew && !s; m++)
    if (!(fresh[m] = tpu_record_new(e, p->new_dt[m], p->new_numel[m])))
      s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  for (int k = 0; k < nin_p && !s; k++) {
    const tpu_plan_src *d = &p->src[k];
    tpu_record *r = NULL;
    switch (d->kind) {
      case TPU_SRC_IN: r = ins[d->idx].rec; break;
      case TPU_SRC_NEW: r = fresh[d->idx]; break;
      case TPU_SRC_HELD: r = p->held[d->idx]; break;
      case TPU_SRC_CONST: inbuf[k] = d->buf; break;
      default: {
        uint64_t st[2] = {e->rng_seed, rng_base + d->rng};
        int64_t two = 2;
        s = tpu_rt_buffer_from_host(e->rt, st, TPU_U64, &two, 1, &inbuf[k]);
        if (!s) temps[ntemp++] = inbuf[k];
      }
    }
    if (r) {
      s = tpu_record_materialize(e, r);
      inbuf[k] = r->buf;
    }
  }
  if (!s && c->nfout) {
    s = tpu_engine_launch(e, c->exec, inbuf, nin_p, outbuf, NULL);
    if (s) s = tpu_status_prefix(s, "running a compiled graph of %d ops", p->nops);
  }
  for (int k = 0; k < ntemp; k++) tpu_rt_buffer_free(temps[k]);
  if (!s) {
    for (int k = 0; k < c->nfout; k++) {
      const tpu_plan_src *d = &p->dst[k];
      tpu_record *r = d->kind == TPU_SRC_IN ? ins[d->idx].rec : d->kind == TPU_SRC_HELD ? p->held[d->idx] : fresh[d->idx];
      tpu_rt_buffer_free(r->buf);
      r->buf = outbuf[k];
    }
    for (int k = 0; k < c->nfchk; k++) tpu_check_push(e, outbuf[c->nfout + k], c->fchk[k]);
    for (int j = 0; j < p->nout; j++) {
      const tpu_plan_src *o = &p->osrc[j];
      outs[j] = o->kind == TPU_SRC_IN ? ins[o->idx].rec : o->kind == TPU_SRC_HELD ? p->held[o->idx] : fresh[o->idx];
      tpu_record_ref(outs[j]);
    }
    atomic_fetch_add(&e->metrics.graph_replays, 1);
    atomic_fetch_add(&e->metrics.fused_programs, 1);
    atomic_fetch_add(&e->metrics.fused_ops, p->nops);
    atomic_fetch_add(&e->metrics.cache_hits, 1);
  }
  for (int m = 0; m < p->nnew && fresh; m++)
    if (fresh[m]) tpu_record_unref(fresh[m]);
  free(inbuf);
  free(temps);
  free(outbuf);
  free(fresh);
  return s;
}
