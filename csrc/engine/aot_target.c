/* aot_target.c: every program compiled for the plugin is compiled for a
 * TPU topology as well (TORCHTPU_AOT_TOPOLOGY), by the runtime's compile-only
 * target (csrc/runtime/aot.h). Programs still run on the execution plugin;
 * this only asks the TPU compiler whether each compiles, what it costs and
 * whether it fits in a chip's memory, and keeps the answers for
 * torchtpu.aot_report().
 *
 * Once per distinct program a process (hash of its options and text): a
 * program compiled again after the memory cache dropped it is not compiled
 * for the TPU again; one the execution plugin loaded from the disk tier is
 * (or its TPU executable is loaded from there too). With the disk tier on, the serialized TPU executable is stored under
 * the target's own key (libtpu's build, the topology: aot.h), behind a header
 * holding the report's numbers, so a warm process reports without compiling.
 */
#define _POSIX_C_SOURCE 200809L
#include "aot_target.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__ /* defined by the headers above */
#include <malloc.h>
#endif

#include "engine_impl.h"

tpu_status *tpu_engine_set_aot(tpu_engine *e, const char *plugin_path, const char *topology, bool strict,
                               bool mesh_only) {
  if (e->rt) return tpu_status_new(TPU_ERR_RUNTIME, "the TPU topology to compile for is set before the device's use");
  char *p = NULL, *t = NULL;
  if (!tpu_dup(plugin_path, &p) || !tpu_dup(topology, &t)) {
    free(p);
    free(t);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  free(e->aot.plugin);
  free(e->aot.topology);
  e->aot.plugin = p;
  e->aot.topology = t;
  e->aot.strict = strict;
  e->aot.mesh_only = mesh_only && topology;
  return NULL;
}

int tpu_engine_mesh_compile_only(const tpu_engine *e) {
  return e->aot.mesh_only && e->aot.target ? tpu_rt_target_num_devices(e->aot.target) : 0;
}

tpu_status *tpu_engine_aot_open(tpu_engine *e) {
  if (!e->aot.topology || e->aot.target) return NULL;
  if (!e->aot.plugin)
    return tpu_status_new(TPU_ERR_PLUGIN,
                          "TORCHTPU_AOT_TOPOLOGY=%s: compiling for a TPU needs libtpu (pip install libtpu)",
                          e->aot.topology);
  tpu_status *s = tpu_rt_target_open(e->aot.plugin, e->aot.topology, &e->aot.target);
  if (!s) return NULL;
  /* A RuntimeError at the device's first use, as every start setting's */
  tpu_status *r = tpu_status_new(tpu_status_code(s) == TPU_ERR_MEMORY ? TPU_ERR_MEMORY : TPU_ERR_RUNTIME,
                                 "TORCHTPU_AOT_TOPOLOGY=%s: %s", e->aot.topology, tpu_status_message(s));
  tpu_status_free(s);
  return r;
}

void tpu_engine_aot_free(tpu_engine *e) {
  for (int i = 0; i < e->aot.n; i++) {
    free(e->aot.progs[i].name);
    free(e->aot.progs[i].error);
    free(e->aot.progs[i].opt.bytes);
  }
  free(e->aot.progs);
  tpu_rt_target_close(e->aot.target);
  free(e->aot.salt);
  free(e->aot.plugin);
  free(e->aot.topology);
}

void tpu_engine_aot_info(tpu_engine *e, tpu_aot_info *out) {
  memset(out, 0, sizeof *out);
  out->hbm_bytes = -1;
  out->strict = e->aot.strict;
  out->mesh_only = tpu_engine_mesh_compile_only(e) > 0;
  out->topology = e->aot.topology;
  if (e->aot.target) {
    out->kind = tpu_rt_target_kind(e->aot.target);
    out->platform_version = tpu_rt_target_platform_version(e->aot.target);
    out->devices = tpu_rt_target_num_devices(e->aot.target);
    out->hbm_bytes = tpu_rt_target_hbm_bytes(e->aot.target);
  }
  out->nprogs = e->aot.n;
  out->progs = e->aot.progs;
}

/* ---- the disk tier: a header with the report's numbers, then the executable ---- */

static const char tpu_aot_magic[8] = "TPUAOT1";
typedef struct {
  char magic[8];
  uint32_t stats_size; /* sizeof(tpu_rt_aot_stats) of the writer */
  uint32_t pad;
  double seconds;
  tpu_rt_aot_stats st;
} tpu_aot_header;

/* The key: the target's salt, the options, then the text. */
static uint8_t *tpu_aot_key(tpu_engine *e, const char *text, size_t len, const tpu_rt_compile_opts *o, size_t *n) {
  char opts[96];
  snprintf(opts, sizeof opts, "replicas=%d;partitions=%d;spmd=%d;shardy=%d", o ? o->replicas : 1, o ? o->partitions : 1,
           o ? o->spmd : 0, o ? o->shardy : 0);
  size_t sl = strlen(e->aot.salt), ol = strlen(opts);
  uint8_t *k = malloc(sl + ol + 2 + len);
  if (!k) return NULL;
  memcpy(k, e->aot.salt, sl);
  k[sl] = 0;
  memcpy(k + sl + 1, opts, ol);
  k[sl + 1 + ol] = 0;
  memcpy(k + sl + ol + 2, text, len);
  *n = sl + ol + 2 + len;
  return k;
}

static bool tpu_aot_disk_get(tpu_engine *e, const uint8_t *key, size_t keylen, tpu_aot_prog *p) {
  void *bytes = NULL;
  size_t n = 0;
  char why[512];
  tpu_dc_result r = tpu_dcache_get(e->aot.disk, key, keylen, &bytes, &n, why, sizeof why);
  bool ok = false;
  if (r == TPU_DC_HIT && n >= sizeof(tpu_aot_header)) {
    tpu_aot_header h;
    memcpy(&h, bytes, sizeof h);
    if (memcmp(h.magic, tpu_aot_magic, 8) == 0 && h.stats_size == sizeof h.st &&
        (int64_t)(n - sizeof h) == h.st.serialized_bytes) {
      p->st = h.st;
      p->seconds = h.seconds;
      ok = true;
    }
  }
  free(bytes);
  return ok;
}

static void tpu_aot_disk_put(tpu_engine *e, const uint8_t *key, size_t keylen, const tpu_aot_prog *p, const void *exe,
                             size_t n) {
  if (e->aot.disk_readonly) return;
  tpu_aot_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, tpu_aot_magic, 8);
  h.stats_size = sizeof h.st;
  h.seconds = p->seconds;
  h.st = p->st;
  uint8_t *buf = malloc(sizeof h + n);
  if (!buf) return;
  memcpy(buf, &h, sizeof h);
  if (n) memcpy(buf + sizeof h, exe, n);
  char why[600];
  if (tpu_dcache_put(e->aot.disk, key, keylen, buf, sizeof h + n, why, sizeof why) == 0)
    atomic_fetch_add(&e->metrics.disk_writes, 1);
  free(buf);
}

/* ---- one program -------------------------------------------------------------------- */

static uint64_t tpu_aot_hash(const char *text, size_t len, const tpu_rt_compile_opts *o) {
  int v[4] = {o ? o->replicas : 1, o ? o->partitions : 1, o ? o->spmd : 0, o ? o->shardy : 0};
  return tpu_fnv1a(tpu_fnv1a(TPU_FNV_BASIS, v, sizeof v), text, len);
}

/* The status a refused program gives: its name, the topology, libtpu's words. */
static tpu_status *tpu_aot_error(tpu_engine *e, const tpu_aot_prog *p) {
  const char *what = p->code == TPU_ERR_MEMORY ? "does not fit in the memory of a" : "does not compile for";
  /* torch.OutOfMemoryError or RuntimeError, whatever libtpu's code */
  tpu_code code = p->code == TPU_ERR_MEMORY ? TPU_ERR_MEMORY : TPU_ERR_RUNTIME;
  return tpu_status_new(code, "%s %s TPU %s (%s; TORCHTPU_AOT_TOPOLOGY): %s", p->name, what, e->aot.topology,
                        tpu_rt_target_kind(e->aot.target), p->error);
}

/* A copy of a kept optimized program. */
static tpu_status *tpu_aot_module_copy(const tpu_rt_module *from, tpu_rt_module *to) {
  *to = *from;
  to->bytes = malloc(from->len ? from->len : 1);
  if (!to->bytes) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (from->len) memcpy(to->bytes, from->bytes, from->len);
  return NULL;
}

/* The target's compile of one program; with opt (a compile-only mesh's
 * program), its optimized form too, kept on the entry and copied to *opt. */
static tpu_status *tpu_aot_compile(tpu_engine *e, const char *text, size_t len, const char *name,
                                   const tpu_rt_compile_opts *o, tpu_rt_module *opt) {
  bool strict = e->aot.strict || opt;
  uint64_t h = tpu_aot_hash(text, len, o);
  e->aot.last = -1;
  for (int i = 0; i < e->aot.n; i++) { /* programs compiled before: a few thousand at most */
    tpu_aot_prog *q = &e->aot.progs[i];
    if (q->hash != h || (opt && !q->error && !q->opt.bytes)) continue;
    e->aot.last = i;
    if (q->error) return strict ? tpu_aot_error(e, q) : NULL;
    return opt ? tpu_aot_module_copy(&q->opt, opt) : NULL;
  }
  if (e->aot.n == e->aot.cap) {
    int cap = e->aot.cap ? 2 * e->aot.cap : 64;
    tpu_aot_prog *q = realloc(e->aot.progs, (size_t)cap * sizeof *q);
    if (!q) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    e->aot.progs = q;
    e->aot.cap = cap;
  }
  tpu_aot_prog p;
  memset(&p, 0, sizeof p);
  p.hash = h;
  p.name = e->aot.what[0] ? tpu_strfmt("%s: %s", name, e->aot.what) : strdup(name);
  if (!p.name) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  uint8_t *key = NULL;
  size_t keylen = 0;
  /* a compile-only mesh's programs are compiled here every process: the
   * disk tier keeps no optimized program */
  if (!opt && e->aot.disk && e->aot.salt && (key = tpu_aot_key(e, text, len, o, &keylen)) &&
      tpu_aot_disk_get(e, key, keylen, &p)) {
    p.cached = true;
    atomic_fetch_add(&e->metrics.aot_disk_hits, 1);
  } else {
    void *exe = NULL;
    size_t n = 0;
    int64_t t0 = tpu_now_ns();
    /* the program's TPU form: a function with a TPU variant (a Pallas kernel's Mosaic call) takes it */
    char *tt = NULL;
    size_t tl = 0;
    tpu_status *s = tpu_engine_retarget(e, text, len, "tpu", &tt, &tl);
    if (!s)
      s = tpu_rt_target_compile(e->aot.target, tt, tl, o, &p.st, key ? &exe : NULL, key ? &n : NULL,
                                opt ? &p.opt : NULL);
    free(tt);
    int64_t dt = tpu_now_ns() - t0;
    p.seconds = (double)dt / 1e9;
#ifdef __GLIBC__
    malloc_trim(0); /* as after the plugin's compiles (programs.c): libtpu's frees go back to the system */
#endif
    atomic_fetch_add(&e->metrics.aot_ns, dt);
    if (s) {
      p.code = tpu_status_code(s);
      p.error = strdup(tpu_status_message(s));
      tpu_status_free(s);
      if (!p.error) p.error = strdup("out of memory");
      atomic_fetch_add(&e->metrics.aot_failed, 1);
      if (p.code == TPU_ERR_MEMORY) atomic_fetch_add(&e->metrics.aot_oom, 1);
    } else {
      atomic_fetch_add(&e->metrics.aot_compiled, 1);
      if (key) tpu_aot_disk_put(e, key, keylen, &p, exe, n);
    }
    free(exe);
  }
  free(key);
  e->aot.last = e->aot.n;
  e->aot.progs[e->aot.n++] = p;
  if (!p.error) return opt ? tpu_aot_module_copy(&p.opt, opt) : NULL;
  if (strict) return tpu_aot_error(e, &p);
  if (!e->aot.warned) {
    e->aot.warned = true;
    tpu_msgs_warn(&e->msgs,
                  "torchtpu: %s does not compile for TPU %s (counted, TORCHTPU_AOT_STRICT=0; "
                  "torchtpu.aot_report() lists every program): %s",
                  name, e->aot.topology, p.error);
  }
  return NULL;
}

tpu_status *tpu_engine_aot_compile(tpu_engine *e, const char *text, size_t len, const char *name,
                                   const tpu_rt_compile_opts *o) {
  e->aot.last = -1;
  return e->aot.target ? tpu_aot_compile(e, text, len, name, o, NULL) : NULL;
}

void tpu_engine_aot_ran(tpu_engine *e, int aot) {
  if (aot >= 0 && aot < e->aot.n) e->aot.progs[aot].runs++;
}

tpu_status *tpu_engine_aot_compile_only(tpu_engine *e, const char *text, size_t len, const char *name,
                                        const tpu_rt_compile_opts *o, tpu_rt_module *opt) {
  memset(opt, 0, sizeof *opt);
  if (!e->aot.target) return tpu_status_new(TPU_ERR_RUNTIME, "a compile-only mesh without a TPU topology");
  return tpu_aot_compile(e, text, len, name, o, opt);
}
