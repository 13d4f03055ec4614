/* programs.c: signatures, the in-memory program cache, the disk tier's
 * glue, and lowering and compiling one call.
 *
 * The memory tier is an open-addressing table of entries keyed by signature
 * bytes; an entry holds the compiled program and the plans that say how to
 * feed it and where its results go. Programs missing there are looked up in
 * the disk tier (cache/) before they are compiled, and written to it after.
 */
#define _POSIX_C_SOURCE 200809L
#include "programs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__ /* defined by the headers above */
#include <malloc.h>
#endif

#include "engine_impl.h"

/* Drops one reference (an entry never inserted has none: freed at once). */
void tpu_cache_entry_free(tpu_cache_entry *c) {
  if (!c || --c->refs > 0) return;
  free(c->key);
  free(c->in);
  free(c->out);
  free(c->ret);
  free(c->fin);
  free(c->fout);
  free(c->fchk);
  free(c->fsh);
  free(c->fdims);
  tpu_rt_exec_free(c->exec);
  free(c);
}

/* The disk key: salt, a separator no program text holds, then the text. */
static uint8_t *tpu_disk_key(tpu_engine *e, const char *text, size_t len, size_t *keylen) {
  size_t sl = strlen(e->cache.salt);
  uint8_t *k = malloc(sl + 1 + len);
  if (!k) return NULL;
  memcpy(k, e->cache.salt, sl);
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
  tpu_dc_result r = tpu_dcache_get(e->cache.disk, key, keylen, &bytes, &n, why, sizeof why);
  tpu_rt_exec *exec = NULL;
  if (r == TPU_DC_CORRUPT) {
    atomic_fetch_add(&e->metrics.disk_corrupt, 1);
    tpu_msgs_warn(&e->msgs, "torchtpu: removed a damaged compilation cache entry (%s); recompiling %s", why, label);
  } else if (r == TPU_DC_REFUSED) {
    atomic_fetch_add(&e->metrics.disk_refused, 1);
    if (!e->cache.disk_refused_told) {
      e->cache.disk_refused_told = true;
      tpu_msgs_warn(&e->msgs,
                    "torchtpu: ignored an untrusted compilation cache entry (%s); recompiling %s (further "
                    "untrusted entries in this process are ignored without a warning)",
                    why, label);
    }
  } else if (r == TPU_DC_HIT) {
    tpu_status *s = tpu_rt_exec_deserialize(e->rt, bytes, n, &exec);
    if (s) {
      atomic_fetch_add(&e->metrics.disk_corrupt, 1);
      tpu_msgs_warn(&e->msgs,
                    "torchtpu: the plugin refused a compilation cache entry in %s (%s); removed it, "
                    "recompiling %s",
                    tpu_dcache_dir(e->cache.disk), tpu_status_message(s), label);
      tpu_status_free(s);
      tpu_dcache_remove(e->cache.disk, key, keylen);
      exec = NULL;
    }
  }
  free(bytes);
  atomic_fetch_add(&e->metrics.disk_load_ns, tpu_now_ns() - t0);
  atomic_fetch_add(exec ? &e->metrics.disk_hits : &e->metrics.disk_misses, 1);
  return exec;
}

static void tpu_disk_store(tpu_engine *e, tpu_rt_exec *exec, const uint8_t *key, size_t keylen) {
  if (e->cache.disk_readonly) return;
  void *bytes = NULL;
  size_t n = 0;
  tpu_status *s = tpu_rt_exec_serialize(e->rt, exec, &bytes, &n);
  if (s) {
    /* A plugin that cannot serialize: the disk tier can do nothing. */
    tpu_msgs_warn(&e->msgs, "torchtpu: compiled programs cannot be cached on disk (%s); caching in memory only",
                  tpu_status_message(s));
    tpu_status_free(s);
    e->cache.disk_readonly = e->aot.disk_readonly = true;
    return;
  }
  char why[600];
  int err = tpu_dcache_put(e->cache.disk, key, keylen, bytes, n, why, sizeof why);
  free(bytes);
  if (err) {
    tpu_msgs_warn(&e->msgs,
                  "torchtpu: the compilation cache folder cannot be written (%s); new programs are "
                  "cached in memory only for the rest of this process",
                  why);
    e->cache.disk_readonly = e->aot.disk_readonly = true;
  } else {
    atomic_fetch_add(&e->metrics.disk_writes, 1);
  }
}

bool tpu_programs_init(tpu_programs *c, long max) {
  c->cap = 256;
  c->entries = calloc(c->cap, sizeof *c->entries);
  c->max = max;
  c->maps_limit = -2;
  return c->entries != NULL;
}

void tpu_programs_free(tpu_programs *c) {
  tpu_dcache_free(c->disk);
  free(c->salt);
  free(c->disk_dir);
  free(c->disk_extra);
  for (size_t i = 0; i < c->cap && c->entries; i++) tpu_cache_entry_free(c->entries[i]);
  free(c->entries);
  c->entries = NULL;
}

tpu_status *tpu_programs_disk_open(tpu_engine *e, const char *dir, int64_t max_bytes, const char *extra) {
  tpu_dcache_free(e->cache.disk);
  free(e->cache.salt);
  free(e->aot.salt);
  e->cache.disk = e->aot.disk = NULL;
  e->cache.salt = e->aot.salt = NULL;
  e->cache.disk_readonly = e->aot.disk_readonly = false;
  e->cache.disk_refused_told = false;
  if (!dir || !*dir) return NULL;
  tpu_dcache *dc = NULL;
  tpu_status *s = tpu_dcache_open(dir, max_bytes, &dc);
  if (s) return s;
  char *base = tpu_rt_cache_salt(e->rt);
  e->cache.salt = base ? tpu_strfmt("%s;%s", base, extra ? extra : "") : NULL;
  free(base);
  char *abase = e->aot.target ? tpu_rt_target_cache_salt(e->aot.target) : NULL;
  e->aot.salt = abase ? tpu_strfmt("%s;%s", abase, extra ? extra : "") : NULL;
  free(abase);
  if (!e->cache.salt || (e->aot.target && !e->aot.salt)) {
    tpu_dcache_free(dc);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  e->cache.disk = e->aot.disk = dc;
  return NULL;
}

tpu_status *tpu_engine_set_disk_cache(tpu_engine *e, const char *dir, int64_t max_bytes, const char *extra) {
  if (e->rt) return tpu_programs_disk_open(e, dir, max_bytes, extra);
  char *d = NULL, *x = NULL;
  if (!tpu_dup(dir, &d) || !tpu_dup(extra, &x)) {
    free(d);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  free(e->cache.disk_dir);
  free(e->cache.disk_extra);
  e->cache.disk_dir = d;
  e->cache.disk_extra = x;
  e->cache.disk_max = max_bytes;
  e->cache.disk_pending = true;
  return NULL;
}

/* ---- signatures --------------------------------------------------------------- */


void tpu_sig_put(tpu_sig *s, const void *d, size_t n) {
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

void tpu_sig_done(tpu_sig *s) {
  if (s->heap) free(s->p);
}

void tpu_sig_i64(tpu_sig *s, int64_t v) { tpu_sig_put(s, &v, sizeof v); }

static void tpu_sig_tensor(tpu_sig *s, const tpu_tref *t) {
  tpu_sig_i64(s, t->host ? -1 - (int64_t)t->dtype : (int64_t)t->dtype);
  if (t->host) return;
  tpu_sig_i64(s, t->rank);
  tpu_sig_put(s, t->sizes, sizeof(int64_t) * (size_t)t->rank);
  tpu_sig_put(s, t->strides, sizeof(int64_t) * (size_t)t->rank);
  tpu_sig_i64(s, t->view);
  tpu_sig_i64(s, t->rec_numel);
  tpu_sig_i64(s, t->rec_dtype);
  /* the shape of the record's buffer: the program's parameter (tpu_record.grank) */
  int grank = t->rec ? t->rec->grank : 0;
  tpu_sig_i64(s, grank);
  if (grank > 1) tpu_sig_put(s, t->rec->gdims, sizeof(int64_t) * (size_t)grank);
}

void tpu_sig_build(tpu_sig *s, int op_id, const tpu_arg *args, int nargs) {
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

tpu_cache_entry *tpu_cache_find(tpu_engine *e, const tpu_sig *s, uint64_t h) {
  size_t j = (size_t)h & (e->cache.cap - 1);
  while (e->cache.entries[j]) {
    tpu_cache_entry *c = e->cache.entries[j];
    if (c->hash == h && c->keylen == s->n && memcmp(c->key, s->p, s->n) == 0) return c;
    j = (j + 1) & (e->cache.cap - 1);
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

static bool tpu_maps_near_limit(tpu_engine *e) {
  if (e->cache.maps_limit == -2) {
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    e->cache.maps_limit = -1;
    if (f) {
      if (fscanf(f, "%ld", &e->cache.maps_limit) != 1) e->cache.maps_limit = -1;
      fclose(f);
    }
  }
  if (e->cache.maps_limit <= 0 || e->cache.maps_calls++ % 16) return false;
  long n = tpu_count_lines("/proc/self/maps");
  return n > e->cache.maps_limit / 2;
}

static void tpu_cache_bound(tpu_engine *e) {
  if ((long)e->cache.n < e->cache.max && !tpu_maps_near_limit(e)) return;
  for (size_t i = 0; i < e->cache.cap; i++) {
    tpu_cache_entry_free(e->cache.entries[i]);
    e->cache.entries[i] = NULL;
  }
  e->cache.n = 0;
  atomic_fetch_add(&e->metrics.cache_evictions, 1);
}

bool tpu_cache_insert(tpu_engine *e, tpu_cache_entry *c) {
  tpu_cache_bound(e);
  if ((e->cache.n + 1) * 2 > e->cache.cap) {
    size_t cap = e->cache.cap * 2;
    tpu_cache_entry **n = calloc(cap, sizeof *n);
    if (!n) return false;
    for (size_t i = 0; i < e->cache.cap; i++) {
      tpu_cache_entry *x = e->cache.entries[i];
      if (!x) continue;
      size_t j = (size_t)x->hash & (cap - 1);
      while (n[j]) j = (j + 1) & (cap - 1);
      n[j] = x;
    }
    free(e->cache.entries);
    e->cache.entries = n;
    e->cache.cap = cap;
  }
  size_t j = (size_t)c->hash & (e->cache.cap - 1);
  while (e->cache.entries[j]) j = (j + 1) & (e->cache.cap - 1);
  e->cache.entries[j] = c;
  c->refs = 1;
  e->cache.n++;
  return true;
}

/* ---- one call ------------------------------------------------------------------- */

void tpu_classify_views(tpu_arg *args, int nargs) {
  for (int i = 0; i < nargs; i++) {
    if (args[i].kind == TPU_ARG_TENSOR && !args[i].t.host) args[i].t.view = tpu_tref_view_kind(&args[i].t);
    if (args[i].kind == TPU_ARG_TENSORS)
      for (int j = 0; j < args[i].nlist; j++)
        if (args[i].list[j].rec) args[i].list[j].view = tpu_tref_view_kind(&args[i].list[j]);
  }
}

/* Queues the line the binding logs for a compile (the newest 16 kept): */
/* a line for the binding's logger: "<seconds>\t<1 for a recompile>\t<text>". */
static void tpu_compile_log(tpu_engine *e, const char *name, int64_t ns, bool disk) {
  char again[160] = "";
  if (e->cache.recompile)
    snprintf(again, sizeof again,
             "; a recompile: program %d of this op, for new shapes, dtypes or arguments "
             "(TORCHTPU_EXPLAIN_RECOMPILES=1 says which)",
             e->cache.recompile + 1);
  char *line =
      tpu_strfmt("%.3f\t%d\tcompiled %s in %.2f s (not in the memory cache%s%s)", (double)ns / 1e9,
                 e->cache.recompile > 0, name, (double)ns / 1e9, disk ? " nor on disk" : "; disk cache off", again);
  tpu_msgs_log(&e->msgs, line);
}

/* Compile program text through the disk tier. *exec is owned by the caller. */
tpu_status *tpu_engine_compile(tpu_engine *e, const char *text, size_t len, const char *name, tpu_rt_exec **exec) {
  return tpu_engine_compile_with(e, text, len, name, NULL, exec);
}

/* The disk key holds the text, which names the mesh, the partition count and
 * the partitioner of a program over several devices: the options follow it. */
tpu_status *tpu_engine_compile_with(tpu_engine *e, const char *text, size_t len, const char *name,
                                    const tpu_rt_compile_opts *o, tpu_rt_exec **exec) {
  *exec = NULL;
  uint8_t *dkey = NULL;
  size_t dkeylen = 0;
  const char *what = strncmp(name, "a ", 2) == 0 ? name + 2 : name; /* the profiler's name */
  int64_t p0 = tpu_prof_t0();
  if (e->cache.disk && (dkey = tpu_disk_key(e, text, len, &dkeylen))) *exec = tpu_disk_load(e, dkey, dkeylen, name);
  if (p0 && *exec) tpu_prof_host(TPU_PROF_LOAD, e->dev, p0, 0, "%s", what);
  tpu_status *s = NULL;
  if (!*exec) {
    int64_t t0 = tpu_now_ns();
    p0 = p0 ? tpu_prof_now() : 0;
    s = tpu_rt_compile_with(e->rt, text, len, o, exec);
    if (p0 && !s) tpu_prof_host(TPU_PROF_COMPILE, e->dev, p0, 0, "%s", what);
    int64_t dt = tpu_now_ns() - t0;
    atomic_fetch_add(&e->metrics.compile_ns, dt);
    if (!s) tpu_compile_log(e, name, dt, dkey != NULL);
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
    if (e->debug) fprintf(stderr, "%s\n", text);
    return s;
  }
  /* The TPU target's compile (aot_target.c), after a load from disk as well. */
  if ((s = tpu_engine_aot_compile(e, text, len, name, o))) {
    tpu_rt_exec_free(*exec);
    *exec = NULL;
  }
  return s;
}

/* Lower one call. With compile, the program is compiled; without, only the
 * plans are kept (fused mode records the op; a later eager call of the same
 * signature compiles it). A found plan-only entry is passed in *out and
 * gets its program. */
tpu_status *tpu_engine_lower(tpu_engine *e, const tpu_op_row *row, tpu_arg *args, int nargs, tpu_sig *sig, uint64_t h,
                             bool compile, tpu_cache_entry **out) {
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
  L.tpu_like = e->tpu_like;
  L.value_checks = e->value_checks;
  L.plans_only = !compile;
  L.fn_lookup = tpu_engine_fn_lookup;
  L.fn_ctx = e;
  L.record_type = tpu_record_type;
  tpu_lower_run(&L, row);
  /* The lowering gives records' values flat; the program gives each in its
   * record's shape: a new one in the op's output shape (the record made for
   * it has that shape), a written one in its record's. */
  for (int k = 0; k < L.nout && tpu_hlo_ok(L.hlo); k++) {
    const tpu_out_plan *o = &L.out[k];
    if (o->kind == TPU_OUT_NEW) {
      tpu_hlo_type t = tpu_buffer_type(o->type.dtype, o->type.rank, o->type.dims);
      if (t.rank > 1) L.outv[k] = tpu_hlo_reshape(L.hlo, L.outv[k], t.rank, t.dims);
    } else if (o->kind == TPU_OUT_WRITE) {
      tpu_in_plan p = {TPU_IN_RECORD, o->arg, o->item};
      const tpu_record *r = tpu_arg_tref(args, &p)->rec;
      if (r->grank > 1) L.outv[k] = tpu_hlo_reshape(L.hlo, L.outv[k], r->grank, r->gdims);
    }
  }
  char *text = NULL;
  size_t len = 0;
  tpu_status *s = tpu_hlo_finish(L.hlo, L.outv, L.nout, &text, &len);
  tpu_hlo_free(L.hlo);
  if (s && strncmp(tpu_status_message(s), "stablehlo.", 10) == 0 && tpu_status_code(s) != TPU_ERR_MEMORY) {
    /* The builder refused what an emitter built: an input the emitter does
     * not check for. A RuntimeError naming the op, never another type. */
    tpu_status *r = tpu_status_new(TPU_ERR_RUNTIME,
                                   "aten::%s: these arguments are not supported on tpu (the "
                                   "lowering built an invalid program: %s)",
                                   row->name, tpu_status_message(s));
    tpu_status_free(s);
    return r;
  }
  if (s) return s;
  if (compile && e->dump_hlo) fprintf(stderr, "-- %s\n%s\n", row->name, text);
  tpu_rt_exec *exec = NULL;
  char label[160];
  snprintf(label, sizeof label, "aten::%s", row->name);
  int *made = &e->cache.op_programs[row - tpu_op_table];
  if (compile) {
    e->cache.recompile = *made;
    s = tpu_engine_compile(e, text, len, label, &exec);
    e->cache.recompile = 0;
    if (!s) ++*made;
  }
  free(text);
  if (s) return s;
  if (*out) { /* a plan-only entry of this signature: the plans are the same */
    (*out)->exec = exec;
    (*out)->aot = compile ? e->aot.last : -1;
    return NULL;
  }
  tpu_cache_entry *c = calloc(1, sizeof *c);
  if (!c) {
    tpu_rt_exec_free(exec);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  c->exec = exec;
  c->aot = compile ? e->aot.last : -1;
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
