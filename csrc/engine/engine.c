/* engine.c: the engine's facade, the top of its stack: its life and
 * settings, one call by eager mode, uploads, downloads, transfers, tensors
 * moved onto a mesh, and sync; the entry points that settle recorded ops
 * (fuse.c) before they call down.
 *
 * A call is keyed by its signature (programs.c): the op id and, per
 * argument, everything the lowering depends on but no data, so that scalar
 * values and view offsets are program inputs. On a hit the cached program
 * runs directly. Debug mode waits for it, strict mode leaves it in flight
 * (launch.c), fused mode only records the op (fuse.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"

const char *const tpu_mode_names[TPU_MODE_COUNT] = {
#define X(id, name) name,
    TPU_MODES(X)
#undef X
};

const char *const tpu_flush_names[TPU_FLUSH_COUNT] = {
#define X(id, name) name,
    TPU_FLUSH_REASONS(X)
#undef X
};

void tpu_engine_options_init(tpu_engine_options *o) {
  memset(o, 0, sizeof *o);
  o->mode = TPU_MODE_STRICT;
  o->fuse_cap = 4096;
  o->program_cache_size = 4096;
  o->donate = true;
  o->value_checks = true;
}

tpu_status *tpu_engine_new(const tpu_engine_options *o, tpu_engine **out) {
  *out = NULL;
  tpu_engine *e = calloc(1, sizeof *e);
  if (!e) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  tpu_fns_init(&e->fns);
  bool ok = tpu_registry_init(&e->reg);
  ok = tpu_programs_init(&e->cache, o->program_cache_size > 0 ? o->program_cache_size : 1) && ok;
  e->rt_opts = o->rt;
  ok = ok && tpu_dup(o->rt.plugin_path, (char **)&e->rt_opts.plugin_path) &&
       tpu_dup(o->rt.platform, (char **)&e->rt_opts.platform) && tpu_dup(o->rt_error, &e->rt_error);
  if (!ok) {
    tpu_engine_free(e);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  e->rt_error_code = TPU_ERR_RUNTIME;
  e->rng_seed = TPU_DEFAULT_SEED;
  e->mode = o->mode < TPU_MODE_COUNT ? o->mode : TPU_MODE_STRICT;
  e->fuse.cap = o->fuse_cap > 0 ? o->fuse_cap : 1;
  e->donate = o->donate;
  e->step = o->step;
  e->shardy = true;
  e->value_checks = o->value_checks;
  e->explain = o->explain;
  e->debug = o->debug;
  e->dump_hlo = o->dump_hlo;
  e->precision = TPU_HLO_PREC_HIGHEST;
  *out = e;
  return NULL;
}

bool tpu_engine_started(const tpu_engine *e) { return e->rt != NULL; }

tpu_status *tpu_engine_start(tpu_engine *e) {
  if (e->rt) return NULL;
  if (e->rt_error) return tpu_status_new(e->rt_error_code, "%s", e->rt_error);
  if (!e->rt_opts.plugin_path)
    return tpu_status_new(TPU_ERR_RUNTIME, "torchtpu runtime is not initialised (import torchtpu first)");
  tpu_status *s = tpu_engine_aot_open(e);
  if (!s) s = tpu_rt_open(&e->rt_opts, &e->rt);
  if (s) { /* every later use raises the same error */
    e->rt_error_code = tpu_status_code(s);
    e->rt_error = strdup(tpu_status_message(s));
    return s;
  }
  e->donate_waits = strcmp(tpu_rt_platform_name(e->rt), "cpu") == 0;
  e->tpu_like = strcmp(tpu_rt_platform_name(e->rt), "tpu") == 0 || e->aot.target != NULL;
  e->exact_div = e->donate_waits;
  if (e->cache.disk_pending) {
    e->cache.disk_pending = false;
    tpu_status *c = tpu_programs_disk_open(e, e->cache.disk_dir, e->cache.disk_max, e->cache.disk_extra);
    if (c) { /* an unusable folder: programs stay cached in memory */
      tpu_msgs_warn(&e->msgs, "torchtpu: compilation cache disabled (%s); programs are cached in memory only",
                    tpu_status_message(c));
      tpu_status_free(c);
    }
  }
  return NULL;
}
void tpu_engine_free(tpu_engine *e) {
  if (!e) return;
  tpu_plans_release(e);
  tpu_fuse_free(e);
  tpu_replica_release(e);
  tpu_status_free(tpu_engine_sync(e));
  tpu_launch_free(&e->launch);
  tpu_programs_free(&e->cache);
  tpu_msgs_free(&e->msgs);
  tpu_registry_free(&e->reg);
  tpu_rt_close(e->rt);
  tpu_fns_free(&e->fns);
  tpu_engine_aot_free(e);
  free((char *)e->rt_opts.plugin_path);
  free((char *)e->rt_opts.platform);
  free(e->rt_error);
  free(e);
}

tpu_rt *tpu_engine_rt(tpu_engine *e) { return e->rt; }
tpu_metrics *tpu_engine_metrics(tpu_engine *e) { return &e->metrics; }
int64_t tpu_engine_cache_size(tpu_engine *e) { return (int64_t)e->cache.n; }

void tpu_engine_set_precision(tpu_engine *e, tpu_hlo_precision p) { e->precision = p; }

tpu_status *tpu_engine_sync(tpu_engine *e) {
  tpu_status *f = tpu_engine_flush(e, TPU_FLUSH_SYNC);
  if (f) {
    tpu_status_free(e->launch.deferred);
    e->launch.deferred = NULL;
    tpu_status_free(tpu_engine_wait(e));
    return f;
  }
  return tpu_engine_wait(e);
}

void tpu_engine_set_where(tpu_engine *e, tpu_where_fn where) { e->where = where; }

void tpu_engine_set_mode(tpu_engine *e, tpu_mode mode) { e->mode = mode; }
tpu_mode tpu_engine_mode(tpu_engine *e) { return e->mode; }
void tpu_engine_set_value_checks(tpu_engine *e, bool on) { e->value_checks = on; }
bool tpu_engine_value_checks(const tpu_engine *e) { return e->value_checks; }

char *tpu_engine_take_note(tpu_engine *e) { return tpu_msgs_take(&e->msgs, TPU_MSG_NOTE); }
char *tpu_engine_take_log(tpu_engine *e) { return tpu_msgs_take(&e->msgs, TPU_MSG_LOG); }
char *tpu_engine_take_warning(tpu_engine *e) { return tpu_msgs_take(&e->msgs, TPU_MSG_WARNING); }

tpu_hlo_precision tpu_engine_precision(tpu_engine *e) { return e->precision; }

void tpu_engine_rng_state(tpu_engine *e, uint64_t *seed, uint64_t *offset) {
  *seed = e->rng_seed;
  *offset = e->rng_offset;
}
void tpu_engine_set_rng_state(tpu_engine *e, uint64_t seed, uint64_t offset) {
  e->rng_seed = seed;
  e->rng_offset = offset;
}

tpu_status *tpu_engine_upload(tpu_engine *e, tpu_record *rec, const void *data, tpu_dtype dt, int rank,
                              const int64_t *dims) {
  (void)rank;
  (void)dims;
  if (dt != rec->dtype)
    return tpu_status_new(TPU_ERR_TYPE, "upload of %s data into a %s storage", tpu_dtype_name(dt),
                          tpu_dtype_name(rec->dtype));
  tpu_status *f = tpu_engine_settle(e, rec, TPU_FLUSH_UPLOAD); /* recorded ops read or write it: they run first */
  if (f) return f;
  if (rec->sh) return tpu_spmd_upload(e, rec, data);
  tpu_rt_buffer *b = NULL;
  int64_t n = rec->numel;
  tpu_status *s = tpu_engine_h2d(e, rec->device, data, dt, rec->gdims, rec->grank, &b); /* in the record's shape */
  if (s) return s;
  tpu_rt_buffer_free(rec->buf);
  rec->buf = b;
  atomic_fetch_add(&e->metrics.h2d_bytes, (long long)((size_t)n * tpu_dtype_size(dt)));
  return NULL;
}

tpu_status *tpu_engine_download(tpu_engine *e, tpu_record *rec, void *dst, size_t nbytes) {
  /* A sync point: recorded ops run, and a failed asynchronous computation
   * is reported here. Recorded ops (fused mode) run first only when they
   * read or write the record: otherwise it already holds its value (perhaps
   * one a launched program is computing), and they stay recorded for the
   * program that ends the step (the loss read after the optimizer step,
   * computed by the program launched when the backward pass began). */
  tpu_status *s = tpu_engine_settle(e, rec, TPU_FLUSH_DOWNLOAD);
  if (!s) s = tpu_engine_wait(e);
  if (s) return s;
  if (rec->sh) {
    atomic_fetch_add(&e->metrics.d2h_bytes, (long long)nbytes);
    return tpu_spmd_download(e, rec, dst, nbytes);
  }
  if (!rec->buf) {
    memset(dst, 0, nbytes);
    return NULL;
  }
  atomic_fetch_add(&e->metrics.d2h_bytes, (long long)nbytes);
  return tpu_engine_d2h(e, rec->buf, dst, nbytes);
}

tpu_status *tpu_engine_host_memory(tpu_engine *e, tpu_record *rec, void **addr, size_t *nbytes) {
  *addr = NULL;
  *nbytes = 0;
  if (e->fuse.capturing) return NULL; /* a capture records writes; this one it could not replay */
  tpu_status *s = tpu_engine_settle(e, rec, TPU_FLUSH_DOWNLOAD);
  if (!s) s = tpu_engine_wait(e); /* nothing launched reads the buffer while the host writes it */
  if (s) return s;
  if (rec->sh || !rec->buf || rec->freed) return NULL;
  s = tpu_rt_buffer_host_memory(e->rt, rec->buf, addr);
  if (s || !*addr) return s;
  *nbytes = tpu_rt_buffer_nbytes(rec->buf);
  atomic_fetch_add(&e->metrics.host_views, 1);
  return NULL;
}

tpu_status *tpu_engine_storage_free(tpu_engine *e, tpu_record *rec) {
  if (e->fuse.capturing)
    return tpu_status_new(TPU_ERR_RUNTIME, "freeing a tpu storage's memory inside a graph capture is not supported");
  tpu_status *f = tpu_engine_settle(e, rec, TPU_FLUSH_FREE); /* recorded ops read or write it: they run first */
  if (f) return f;
  /* A launched program still using the buffer keeps it until it finishes
   * (the plugin holds its own reference), as when a write swaps it. */
  tpu_rt_buffer_free(rec->buf);
  tpu_record_free_shards(rec);
  rec->buf = NULL;
  rec->freed = true;
  return NULL;
}

void tpu_engine_storage_alloc(tpu_engine *e, tpu_record *rec) {
  (void)e;
  rec->freed = false;
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
  if (op_id != TPU_OP_zero_ || nargs < 1 || args[0].kind != TPU_ARG_TENSOR || e->fuse.capturing) return false;
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

/* The current device is the calling thread's, as CUDA's is: torch's device
 * guard sets it on autograd's worker threads (one per device), which must not
 * move the device of the thread that called backward. A new thread starts on
 * device 0. */
static _Thread_local int tpu_thread_device;

/* The device a call runs on: its tensors' (all on one, as torch requires),
 * else its device argument's (a factory; i holds index + 1, 0 for none),
 * else the current device; *mesh: whether it reads a tensor laid over a mesh. */
static tpu_status *tpu_call_device(tpu_engine *e, const tpu_arg *args, int nargs, bool *mesh) {
  int dev = -1, hint = -1;
  *mesh = false;
  for (int i = 0; i < nargs; i++) {
    const tpu_arg *a = &args[i];
    int n = a->kind == TPU_ARG_TENSOR ? 1 : a->kind == TPU_ARG_TENSORS ? a->nlist : 0;
    if (a->kind == TPU_ARG_IGNORED && a->i > 0 && hint < 0) hint = (int)a->i - 1;
    for (int j = 0; j < n; j++) {
      const tpu_tref *t = a->kind == TPU_ARG_TENSOR ? &a->t : &a->list[j];
      if (!t->rec) continue;
      *mesh |= t->rec->sh != NULL; /* the call then runs as a program over the mesh (spmd.c) */
      if (dev < 0)
        dev = t->rec->device;
      else if (t->rec->device != dev)
        return tpu_status_new(TPU_ERR_RUNTIME,
                              "Expected all tensors to be on the same device, but found at least two devices, "
                              "tpu:%d and tpu:%d!",
                              dev, t->rec->device);
    }
  }
  if (dev < 0) dev = hint >= 0 ? hint : tpu_thread_device;
  int n = tpu_rt_device_count(e->rt);
  if (dev >= n) return tpu_status_new(TPU_ERR_RUNTIME, "tpu:%d: invalid device ordinal (%d local devices)", dev, n);
  e->dev = dev;
  return NULL;
}

tpu_status *tpu_engine_device_count(tpu_engine *e, int *n) {
  *n = 0;
  tpu_status *s = tpu_engine_start(e);
  if (!s) *n = tpu_rt_device_count(e->rt);
  return s;
}

tpu_status *tpu_engine_set_device(tpu_engine *e, int device) {
  int n;
  tpu_status *s = tpu_engine_device_count(e, &n);
  if (s) return s;
  if (device < 0 || device >= n)
    return tpu_status_new(TPU_ERR_RUNTIME, "tpu:%d: invalid device ordinal (%d local devices)", device, n);
  tpu_thread_device = device;
  return NULL;
}

int tpu_engine_current_device(const tpu_engine *e) {
  (void)e;
  return tpu_thread_device;
}

int tpu_engine_thread_device(void) { return tpu_thread_device; }
void tpu_engine_select_device(int device) { tpu_thread_device = device; }

void tpu_engine_set_shardy(tpu_engine *e, bool shardy) { e->shardy = shardy; }

tpu_status *tpu_engine_transfer(tpu_engine *e, tpu_record *src, int device, tpu_record **out) {
  *out = NULL;
  int n = tpu_rt_device_count(e->rt);
  if (device < 0 || device >= n)
    return tpu_status_new(TPU_ERR_RUNTIME, "tpu:%d: invalid device ordinal (%d local devices)", device, n);
  tpu_status *f = tpu_engine_settle(e, src, TPU_FLUSH_DEVICE); /* recorded ops write it: they run first */
  if (f) return f;
  tpu_record *r = tpu_record_new_shaped(e, device, src->dtype, src->grank, src->gdims);
  if (!r) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (src->sh) { /* off a mesh: gathered on the host */
    size_t nb = (size_t)src->numel * tpu_dtype_size(src->dtype);
    void *host = malloc(nb ? nb : 1);
    tpu_status *s = host ? tpu_engine_download(e, src, host, nb) : tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    if (!s) s = tpu_engine_upload(e, r, host, src->dtype, 1, &src->numel);
    free(host);
    if (s) {
      tpu_record_unref(r);
      return s;
    }
    *out = r;
    return NULL;
  }
  int call_dev = e->dev;
  e->dev = src->device;
  tpu_status *s = tpu_record_materialize(e, src);
  e->dev = call_dev;
  if (!s) s = tpu_rt_buffer_copy(e->rt, src->buf, device, &r->buf);
  if (s) {
    tpu_record_unref(r);
    return s;
  }
  atomic_fetch_add(&e->metrics.d2d_bytes, (long long)((size_t)src->numel * tpu_dtype_size(src->dtype)));
  *out = r;
  return NULL;
}

/* ---- meshes (spmd.c): a tensor onto a mesh, and a new one laid out as another ---- */

/* The sharding's checks against a global shape of numel elements. */
static tpu_status *tpu_shard_check(tpu_engine *e, const tpu_sharding *sh, const int64_t *gdims, int64_t want) {
  int64_t numel = 1;
  for (int i = 0; i < sh->rank; i++) numel *= gdims[i];
  if (numel != want)
    return tpu_status_new(TPU_ERR_VALUE, "shard: a shape of %lld elements for a storage of %lld", (long long)numel,
                          (long long)want);
  tpu_status *s = tpu_sharding_check(sh, gdims);
  if (s) return s;
  int64_t n = tpu_sharding_num_devices(sh);
  int only = tpu_engine_mesh_compile_only(e); /* a compile-only mesh spans the TPU topology's chips */
  if (only && n > only)
    return tpu_status_new(TPU_ERR_VALUE, "a mesh of %lld devices; TPU topology %s has %d chips", (long long)n,
                          e->aot.topology, only);
  if (!only && n > tpu_rt_device_count(e->rt))
    return tpu_status_new(TPU_ERR_VALUE, "a mesh of %lld devices; this process has %d (TORCHTPU_NUM_DEVICES)",
                          (long long)n, tpu_rt_device_count(e->rt));
  return NULL;
}

tpu_status *tpu_engine_shard_host(tpu_engine *e, const void *host, tpu_dtype dt, const tpu_sharding *sh,
                                  const int64_t *gdims, tpu_record **out) {
  *out = NULL;
  int64_t numel = 1;
  for (int i = 0; i < sh->rank; i++) numel *= gdims[i];
  tpu_status *s = tpu_shard_check(e, sh, gdims, numel);
  if (s) return s;
  e->mesh_used = true;
  int64_t n = tpu_sharding_num_devices(sh);
  tpu_record *r = tpu_record_new_on(e, 0, dt, numel);
  if (!r) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  r->sh = malloc(sizeof *r->sh);
  r->shards = calloc((size_t)n, sizeof *r->shards);
  if (!r->sh || !r->shards) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (!s) {
    *r->sh = *sh;
    r->grank = sh->rank;
    memcpy(r->gdims, gdims, sizeof(int64_t) * (size_t)sh->rank);
    s = tpu_shards_from_host(e, sh, gdims, dt, host, r->shards);
  }
  if (s) {
    tpu_record_unref(r);
    return s;
  }
  *out = r;
  return NULL;
}

tpu_status *tpu_engine_shard(tpu_engine *e, tpu_record *src, const tpu_sharding *sh, const int64_t *gdims,
                             tpu_record **out) {
  *out = NULL;
  tpu_status *s = tpu_shard_check(e, sh, gdims, src->numel);
  if (s) return s;
  size_t nb = (size_t)src->numel * tpu_dtype_size(src->dtype);
  void *host = malloc(nb ? nb : 1);
  if (!host) return tpu_status_new(TPU_ERR_MEMORY, "out of memory allocating %zu bytes", nb);
  s = tpu_engine_download(e, src, host, nb);
  if (!s) s = tpu_engine_shard_host(e, host, src->dtype, sh, gdims, out);
  free(host);
  return s;
}

tpu_status *tpu_engine_mesh_like(tpu_engine *e, tpu_record *src, tpu_dtype dt, tpu_record **out) {
  *out = NULL;
  size_t nb = (size_t)src->numel * tpu_dtype_size(dt);
  int64_t n = tpu_sharding_num_devices(src->sh);
  void *zeros = calloc(nb ? nb : 1, 1);
  tpu_record *r = zeros ? tpu_record_new_on(e, 0, dt, src->numel) : NULL;
  tpu_status *s = NULL;
  if (r) {
    r->sh = malloc(sizeof *r->sh);
    r->shards = calloc((size_t)n, sizeof *r->shards);
  }
  if (!r || !r->sh || !r->shards) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (!s) {
    *r->sh = *src->sh;
    r->grank = src->grank;
    memcpy(r->gdims, src->gdims, sizeof r->gdims);
    s = tpu_shards_from_host(e, r->sh, r->gdims, dt, zeros, r->shards);
  }
  free(zeros);
  if (s) {
    tpu_record_unref(r);
    return s;
  }
  *out = r;
  return NULL;
}

static tpu_status *tpu_engine_call_on(tpu_engine *e, const tpu_op_row *row, int op_id, tpu_arg *args, int nargs,
                                      tpu_engine_result *res);

/* One call. A random op given a generator of its own draws from that
 * generator's state (swapped in for the call, the default generator's put
 * back after; a fused op keeps the seed it was recorded with). A capture
 * replays the default generator's offsets, so it refuses one. */
tpu_status *tpu_engine_call(tpu_engine *e, const tpu_op_row *row, int op_id, tpu_arg *args, int nargs,
                            tpu_engine_result *res) {
  tpu_rng *gen = NULL;
  for (int i = 0; i < nargs && !gen; i++)
    if (args[i].kind == TPU_ARG_IGNORED) gen = args[i].gen;
  if (!gen) return tpu_engine_call_on(e, row, op_id, args, nargs, res);
  if (e->fuse.capturing)
    return tpu_status_new(TPU_ERR_RUNTIME,
                          "aten::%s: a torch.Generator of its own cannot be captured by torch.tpu.graph or a "
                          "compiled graph (a replay draws from the default tpu generator); draw from the default "
                          "generator (torch.manual_seed) inside the capture",
                          row->name);
  uint64_t seed = e->rng_seed, offset = e->rng_offset;
  e->rng_seed = gen->seed;
  e->rng_offset = gen->offset;
  tpu_status *s = tpu_engine_call_on(e, row, op_id, args, nargs, res);
  gen->offset = e->rng_offset;
  e->rng_seed = seed;
  e->rng_offset = offset;
  return s;
}

static tpu_status *tpu_engine_call_on(tpu_engine *e, const tpu_op_row *row, int op_id, tpu_arg *args, int nargs,
                                      tpu_engine_result *res) {
  res->nout = res->nret = 0; /* only the counted entries are read (12 KB: not cleared) */
  atomic_fetch_add(&e->metrics.ops_dispatched, 1);
  bool spmd; /* it reads a tensor laid over a mesh */
  {
    tpu_status *s = tpu_call_device(e, args, nargs, &spmd);
    if (s) return s;
  }
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
  tpu_sig_i64(&sig, e->value_checks); /* programs with and without checks differ */
  if (sig.oom) {
    tpu_sig_done(&sig);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  uint64_t h = tpu_hash64(sig.p, sig.n);
  tpu_cache_entry *c = tpu_cache_find(e, &sig, h);
  tpu_status *s = NULL;
  /* an op reading a mesh tensor is recorded and run at once as a program over the mesh */
  bool fused = e->mode == TPU_MODE_FUSED || spmd;
  if (c && (c->exec || fused)) {
    atomic_fetch_add(&e->metrics.cache_hits, 1);
  } else {
    atomic_fetch_add(&e->metrics.cache_misses, 1);
    s = tpu_engine_lower(e, row, args, nargs, &sig, h, !fused, &c);
  }
  if (!s) s = tpu_check_overlap(row, args, c);
  if (!s && fused) s = tpu_engine_record(e, row, op_id, args, nargs, &sig, c, res);
  if (!s && spmd && e->mode != TPU_MODE_FUSED) {
    s = tpu_engine_flush(e, TPU_FLUSH_SPMD);
    if (s) tpu_engine_result_release(res);
  }
  tpu_sig_done(&sig);
  if (s || fused) return s;

  tpu_rt_buffer *inbuf[TPU_MAX_INS];
  tpu_rt_buffer *temps[TPU_MAX_INS + 1] = {0};
  int ntemp = 0;
  e->launch.epoch++;
  uint64_t rng_offset = e->rng_offset;
  for (int k = 0; k < c->nin && !s; k++) {
    const tpu_in_plan *p = &c->in[k];
    tpu_record *r = p->kind == TPU_IN_RECORD ? tpu_arg_tref(args, p)->rec : NULL;
    if (p->kind == TPU_IN_RNG) e->rng_offset += (uint64_t)c->rng_words;
    s = tpu_input_buffer(e, p, args, r, e->rng_seed, rng_offset, &inbuf[k], &temps[ntemp]);
    if (s)
      s = tpu_status_prefix(s, "running aten::%s (an input)", row->name);
    else if (temps[ntemp])
      ntemp++;
  }
  tpu_rt_buffer *outbuf[TPU_MAX_OUTS] = {0};
  if (!s) {
    s = tpu_engine_launch(e, c->exec, inbuf, c->nin, outbuf, row->name, 1);
    if (!s) tpu_engine_aot_ran(e, c->aot);
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
      tpu_record *r = tpu_record_new_shaped(e, e->dev, o->type.dtype, o->type.rank, o->type.dims);
      if (!r) {
        s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
        break;
      }
      r->buf = outbuf[k];
      outbuf[k] = NULL;
      res->outs[nnew] = r;
      tpu_hlo_type_copy(&res->types[nnew], &o->type);
      nnew++;
    } else if (o->kind == TPU_OUT_CHECK && outbuf[k]) {
      char *site = e->where && e->mode != TPU_MODE_DEBUG ? e->where() : NULL;
      tpu_check_push(e, outbuf[k], (tpu_fcheck){row->name, o->msg, o->arg, -1}, site);
      outbuf[k] = NULL;
    }
  }
  for (int k = 0; k < c->nout; k++) tpu_rt_buffer_free(outbuf[k]);
  if (!s && e->mode == TPU_MODE_DEBUG && e->launch.nchk) s = tpu_checks_read(e); /* debug: raised by the op */
  res->nout = nnew;
  res->nret = c->nret;
  memcpy(res->ret, c->ret, sizeof(tpu_ret_plan) * (size_t)c->nret);
  if (s) tpu_engine_result_release(res);
  return s;
}
