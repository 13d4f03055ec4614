/* aot.c: the compile-only target (aot.h). The plugin is opened as runtime.c
 * opens one, but no client is made (libtpu cannot make one without a chip):
 * PJRT_TopologyDescription_Create describes the chips, and PJRT_Compile
 * compiles for them with client = NULL. The executable is never loaded; its
 * cost analysis, compiled memory statistics, fingerprint and serialized
 * bytes are read, and it is destroyed.
 */
#define _GNU_SOURCE
#include "aot.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_shared.h"

struct tpu_rt_target {
  const tpu_pjrt_api *api; /* lifetime of the process */
  tpu_pjrt_topology *topo; /* owned */
  char *path, *name;       /* owned: the plugin file, the topology as given */
  char *kind, *version;    /* owned */
  int ndevices;
  int64_t hbm; /* device_memory_bytes_limit of the first chip; -1 unknown */
};

#define TPU_ACALL(api, name, args) tpu_rt_pjrt_status((api), (api)->name(args), "PJRT_" #name)

static char *tpu_aot_strndup(const char *s, size_t n) {
  char *r = malloc(n + 1);
  if (!r) return NULL;
  if (n) memcpy(r, s, n);
  r[n] = 0;
  return r;
}

/* libtpu reads these when it initializes (aot.h says why each). */
static void tpu_aot_env(void) {
  static const char *const vars[][2] = {{"TPU_SKIP_MDS_QUERY", "1"},
                                        {"ALLOW_MULTIPLE_LIBTPU_LOAD", "1"},
                                        {"TPU_ACCELERATOR_TYPE", "v5litepod-4"},
                                        {"TPU_WORKER_HOSTNAMES", "localhost"}};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) setenv(vars[i][0], vars[i][1], 0);
}

/* The entries a compile-only target calls. */
/* clang-format off */
#define TPU_AOT_REQUIRED(X) \
  X(Error_Destroy) X(Error_Message) X(Error_GetCode) X(TopologyDescription_Create) X(TopologyDescription_Destroy) \
  X(TopologyDescription_PlatformVersion) X(TopologyDescription_GetDeviceDescriptions) X(DeviceDescription_Kind) \
  X(Compile) X(Executable_Destroy)
/* clang-format on */

tpu_status *tpu_rt_topology_check(const char *topology) {
  if (!topology || !*topology) return tpu_status_new(TPU_ERR_VALUE, "no TPU topology given (e.g. v5e:2x2)");
  const char *colon = strchr(topology, ':');
  if (!colon || colon == topology)
    return tpu_status_new(TPU_ERR_VALUE, "TPU topology %s: not <generation>:<chips> (e.g. v5e:2x2, v5p:2x2x1)",
                          topology);
  long dims[3] = {1, 1, 1};
  int n = 0;
  const char *p = colon + 1;
  while (n < 3) {
    if (*p < '0' || *p > '9')
      return tpu_status_new(TPU_ERR_VALUE, "TPU topology %s: chip counts are whole numbers joined by 'x' (e.g. 2x2)",
                            topology);
    long v = 0;
    while (*p >= '0' && *p <= '9' && v <= TPU_TOPOLOGY_MAX_DIM) v = v * 10 + (*p++ - '0');
    if (v < 1 || v > TPU_TOPOLOGY_MAX_DIM)
      return tpu_status_new(TPU_ERR_VALUE, "TPU topology %s: dimension %d must be from 1 to %d chips", topology, n + 1,
                            TPU_TOPOLOGY_MAX_DIM);
    dims[n++] = v;
    if (*p == 0) break;
    if (*p++ != 'x' || n == 3)
      return tpu_status_new(TPU_ERR_VALUE, "TPU topology %s: two or three chip counts joined by 'x' (e.g. 2x2, 2x2x1)",
                            topology);
  }
  if (n < 2)
    return tpu_status_new(TPU_ERR_VALUE, "TPU topology %s: two or three chip counts joined by 'x' (e.g. 2x2, 2x2x1)",
                          topology);
  if ((size_t)(colon - topology) == 3 && strncmp(topology, "v5e", 3) == 0 &&
      (dims[0] > 16 || dims[1] > 16 || dims[2] != 1))
    return tpu_status_new(TPU_ERR_VALUE, "TPU topology %s: a v5e slice is at most 16x16 chips (one plane)", topology);
  return NULL;
}

tpu_status *tpu_rt_target_open(const char *path, const char *topology, tpu_rt_target **out) {
  *out = NULL;
  if (!path || !*path) return tpu_status_new(TPU_ERR_PLUGIN, "no TPU compiler plugin (libtpu) given");
  tpu_status *bad = tpu_rt_topology_check(topology); /* before libtpu: it ends the process on some */
  if (bad) return bad;
  if (access(path, R_OK) != 0)
    return tpu_status_new(TPU_ERR_PLUGIN, "TPU compiler plugin %s: no such file (pip install libtpu)", path);
  tpu_aot_env();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return tpu_status_new(TPU_ERR_PLUGIN, "TPU compiler plugin %s could not be loaded: %s", path, dlerror());
  tpu_pjrt_get_api_fn get = (tpu_pjrt_get_api_fn)dlsym(h, "GetPjrtApi");
  const tpu_pjrt_api *api = get ? get() : NULL;
  if (!api) return tpu_status_new(TPU_ERR_PLUGIN, "%s is not a PJRT plugin: no GetPjrtApi or no table", path);
  int major = api->pjrt_api_version.major_version, minor = api->pjrt_api_version.minor_version;
  if (major != 0 || minor < TPU_RT_MIN_API_MINOR)
    return tpu_status_new(TPU_ERR_PLUGIN, "PJRT plugin %s implements PJRT C API %d.%d; torchtpu needs 0.%d or newer",
                          path, major, minor, TPU_RT_MIN_API_MINOR);
  const char *missing = NULL;
#define TPU_NEED(name) \
  if (!missing && !TPU_HAS(api, name)) missing = "PJRT_" #name;
  TPU_AOT_REQUIRED(TPU_NEED)
#undef TPU_NEED
  if (missing)
    return tpu_status_new(TPU_ERR_PLUGIN, "PJRT plugin %s (API %d.%d) lacks %s: it cannot compile for a topology", path,
                          major, minor, missing);
  tpu_status *s = NULL;
  if (TPU_HAS(api, Plugin_Initialize)) {
    tpu_pjrt_plugin_init_args init = {TPU_PJRT_SIZE(tpu_pjrt_plugin_init_args, extension_start), NULL};
    if ((s = TPU_ACALL(api, Plugin_Initialize, &init))) return tpu_status_prefix(s, "TPU compiler plugin %s", path);
  }
  tpu_rt_target *t = calloc(1, sizeof *t);
  if (!t) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  t->api = api;
  t->hbm = -1;
  t->path = strdup(path);
  t->name = strdup(topology);
  tpu_pjrt_topology_create_args c;
  memset(&c, 0, sizeof c);
  c.struct_size = TPU_PJRT_SIZE(tpu_pjrt_topology_create_args, topology);
  c.topology_name = topology;
  c.topology_name_size = strlen(topology);
  if ((s = TPU_ACALL(api, TopologyDescription_Create, &c))) {
    /* libtpu's own message says what it expects; the name is the user's. */
    tpu_status *v = tpu_status_new(TPU_ERR_VALUE,
                                   "TPU topology %s is not one this libtpu knows (names look like v5e:2x2, "
                                   "v6e:2x2, v5p:2x2x1, v4:2x2x1, TPU7x:2x2x1): %s",
                                   topology, tpu_status_message(s));
    tpu_status_free(s);
    tpu_rt_target_close(t);
    return v;
  }
  t->topo = c.topology;
  tpu_pjrt_topology_string_args pv = {TPU_PJRT_SIZE(tpu_pjrt_topology_string_args, size), NULL, t->topo, NULL, 0};
  if (!(s = TPU_ACALL(api, TopologyDescription_PlatformVersion, &pv)))
    t->version = tpu_aot_strndup(pv.str ? pv.str : "", pv.str ? pv.size : 0);
  tpu_pjrt_topology_devices_args dv = {TPU_PJRT_SIZE(tpu_pjrt_topology_devices_args, num_descriptions), NULL, t->topo,
                                       NULL, 0};
  if (!s) s = TPU_ACALL(api, TopologyDescription_GetDeviceDescriptions, &dv);
  if (!s && dv.num_descriptions == 0) s = tpu_status_new(TPU_ERR_VALUE, "TPU topology %s has no chips", topology);
  if (!s) {
    t->ndevices = (int)dv.num_descriptions;
    tpu_pjrt_desc_kind_args dk = {TPU_PJRT_SIZE(tpu_pjrt_desc_kind_args, kind_size), NULL, dv.descriptions[0], NULL, 0};
    if (!(s = TPU_ACALL(api, DeviceDescription_Kind, &dk)))
      t->kind = tpu_aot_strndup(dk.kind ? dk.kind : "", dk.kind ? dk.kind_size : 0);
  }
  if (!s && TPU_HAS(api, DeviceDescription_Attributes)) {
    tpu_pjrt_desc_attributes_args da = {TPU_PJRT_SIZE(tpu_pjrt_desc_attributes_args, attributes), NULL,
                                        dv.descriptions[0], 0, NULL};
    if (!(s = TPU_ACALL(api, DeviceDescription_Attributes, &da)))
      for (size_t i = 0; i < da.num_attributes; i++) {
        const tpu_pjrt_named_value *v = &da.attributes[i];
        if (v->type == TPU_PJRT_NV_INT64 && v->name_size == 25 && memcmp(v->name, "device_memory_bytes_limit", 25) == 0)
          t->hbm = v->int64_value;
      }
  }
  if (!s && (!t->path || !t->name || !t->kind || !t->version)) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (s) {
    tpu_rt_target_close(t);
    return tpu_status_prefix(s, "TPU topology %s", topology);
  }
  *out = t;
  return NULL;
}

void tpu_rt_target_close(tpu_rt_target *t) {
  if (!t) return;
  if (t->topo) {
    tpu_pjrt_topology_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_topology_destroy_args, topology), NULL, t->topo};
    tpu_status_free(TPU_ACALL(t->api, TopologyDescription_Destroy, &d));
  }
  free(t->path);
  free(t->name);
  free(t->kind);
  free(t->version);
  free(t);
}

const char *tpu_rt_target_topology(const tpu_rt_target *t) { return t->name; }
const char *tpu_rt_target_kind(const tpu_rt_target *t) { return t->kind; }
const char *tpu_rt_target_platform_version(const tpu_rt_target *t) { return t->version; }
int tpu_rt_target_num_devices(const tpu_rt_target *t) { return t->ndevices; }
int64_t tpu_rt_target_hbm_bytes(const tpu_rt_target *t) { return t->hbm; }

char *tpu_rt_target_cache_salt(const tpu_rt_target *t) {
  struct stat st;
  long long size = stat(t->path, &st) == 0 ? (long long)st.st_size : -1;
  /* Not the path nor the mtime (runtime.c's salt has them): the version text
   * carries libtpu's build number, so the same build installed elsewhere (a
   * TPU VM) finds these entries. It goes last, with its length. */
  return tpu_strfmt("aot;topology=%s;pjrt=%d.%d;libtpu_size=%lld;version=[%zu]%s", t->name,
                    t->api->pjrt_api_version.major_version, t->api->pjrt_api_version.minor_version, size,
                    strlen(t->version), t->version);
}

/* The compiler's numbers, each where the plugin reports it. */
static void tpu_aot_read(const tpu_pjrt_api *api, tpu_pjrt_exec *x, tpu_rt_aot_stats *st) {
  tpu_status *s;
  if (TPU_HAS(api, Executable_GetCostAnalysis)) {
    tpu_pjrt_cost_args a = {TPU_PJRT_SIZE(tpu_pjrt_cost_args, properties), NULL, x, 0, NULL};
    if ((s = TPU_ACALL(api, Executable_GetCostAnalysis, &a))) {
      tpu_status_free(s);
    } else {
      for (size_t i = 0; i < a.num_properties; i++) {
        const tpu_pjrt_named_value *v = &a.properties[i];
        double d = v->type == TPU_PJRT_NV_FLOAT   ? (double)v->float_value
                   : v->type == TPU_PJRT_NV_INT64 ? (double)v->int64_value
                                                  : 0;
        if (v->type != TPU_PJRT_NV_FLOAT && v->type != TPU_PJRT_NV_INT64) continue;
#define TPU_IS(str) (v->name_size == sizeof str - 1 && memcmp(v->name, str, sizeof str - 1) == 0)
        if (TPU_IS("flops")) st->flops = d;
        if (TPU_IS("bytes accessed")) st->bytes_accessed = d;
        if (TPU_IS("transcendentals")) st->transcendentals = d;
        if (TPU_IS("optimal_seconds")) st->optimal_seconds = d;
#undef TPU_IS
      }
      if (a.num_properties > 0) { /* flops and transcendentals are reported only when nonzero */
        if (st->flops < 0) st->flops = 0;
        if (st->transcendentals < 0) st->transcendentals = 0;
      }
    }
  }
  if (TPU_HAS(api, Executable_GetCompiledMemoryStats)) {
    tpu_pjrt_memory_args m;
    memset(&m, 0, sizeof m);
    m.struct_size = TPU_PJRT_SIZE(tpu_pjrt_memory_args, peak_memory_in_bytes);
    m.executable = x;
    if ((s = TPU_ACALL(api, Executable_GetCompiledMemoryStats, &m))) {
      tpu_status_free(s);
    } else {
      st->code_bytes = m.generated_code_size_in_bytes;
      st->argument_bytes = m.argument_size_in_bytes;
      st->output_bytes = m.output_size_in_bytes;
      st->alias_bytes = m.alias_size_in_bytes;
      st->temp_bytes = m.temp_size_in_bytes;
      st->peak_bytes = m.peak_memory_in_bytes;
    }
  }
  if (TPU_HAS(api, Executable_NumPartitions)) {
    tpu_pjrt_num_partitions_args a = {TPU_PJRT_SIZE(tpu_pjrt_num_partitions_args, num_partitions), NULL, x, 0};
    if ((s = TPU_ACALL(api, Executable_NumPartitions, &a)))
      tpu_status_free(s);
    else
      st->partitions = (int)a.num_partitions;
  }
  if (TPU_HAS(api, Executable_Fingerprint)) {
    tpu_pjrt_fingerprint_args a = {TPU_PJRT_SIZE(tpu_pjrt_fingerprint_args, fingerprint_size), NULL, x, NULL, 0};
    if ((s = TPU_ACALL(api, Executable_Fingerprint, &a))) {
      tpu_status_free(s);
    } else {
      size_t n = a.fingerprint && a.fingerprint_size < 32 ? a.fingerprint_size : (a.fingerprint ? 32 : 0);
      for (size_t i = 0; i < n; i++) snprintf(st->fingerprint + 2 * i, 3, "%02x", (unsigned)(uint8_t)a.fingerprint[i]);
    }
  }
}

static tpu_status *tpu_aot_serialize(const tpu_pjrt_api *api, tpu_pjrt_exec *x, void **bytes, size_t *nbytes,
                                     int64_t *size) {
  if (!TPU_HAS(api, Executable_Serialize)) return NULL;
  tpu_pjrt_serialize_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = TPU_PJRT_SIZE(tpu_pjrt_serialize_args, deleter);
  a.executable = x;
  tpu_status *s = TPU_ACALL(api, Executable_Serialize, &a);
  if (s) return s;
  *size = (int64_t)a.bytes_size;
  if (bytes) {
    *bytes = malloc(a.bytes_size ? a.bytes_size : 1);
    if (*bytes) {
      memcpy(*bytes, a.bytes, a.bytes_size);
      *nbytes = a.bytes_size;
    } else {
      s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    }
  }
  if (a.deleter) a.deleter(a.serialized);
  return s;
}

tpu_status *tpu_rt_target_compile(tpu_rt_target *t, const char *mlir, size_t len, const tpu_rt_compile_opts *o,
                                  tpu_rt_aot_stats *st, void **bytes, size_t *nbytes, tpu_rt_module *opt) {
  const tpu_pjrt_api *api = t->api;
  memset(st, 0, sizeof *st);
  st->flops = st->bytes_accessed = st->transcendentals = st->optimal_seconds = -1;
  st->code_bytes = st->argument_bytes = st->output_bytes = st->alias_bytes = st->temp_bytes = st->peak_bytes = -1;
  st->serialized_bytes = -1;
  st->partitions = 1;
  if (bytes) *bytes = NULL;
  if (nbytes) *nbytes = 0;
  if (opt) memset(opt, 0, sizeof *opt);
  int rows = o ? (o->replicas > 0 ? o->replicas : 1) * (o->partitions > 0 ? o->partitions : 1) : 1;
  if (rows > t->ndevices)
    return tpu_status_new(TPU_ERR_VALUE, "a program over %d devices; TPU topology %s has %d", rows, t->name,
                          t->ndevices);
  uint8_t *ob = malloc(tpu_rt_options_cap(o));
  if (!ob) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  size_t on = tpu_rt_encode_options(o, false, 0, ob);
  tpu_pjrt_program p = {TPU_PJRT_SIZE(tpu_pjrt_program, format_size), NULL, (char *)mlir, len, "mlir", 4};
  tpu_pjrt_topology_compile_args c = {
      TPU_PJRT_SIZE(tpu_pjrt_topology_compile_args, executable), NULL, t->topo, &p, (const char *)ob, on, NULL, NULL};
  tpu_status *s = TPU_ACALL(api, Compile, &c);
  free(ob);
  if (s) return s;
  tpu_aot_read(api, c.executable, st);
  s = tpu_aot_serialize(api, c.executable, bytes, nbytes, &st->serialized_bytes);
  if (!s && opt) s = tpu_rt_optimized_program(api, c.executable, opt);
  tpu_pjrt_exec_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_exec_destroy_args, executable), NULL, c.executable};
  tpu_status_free(TPU_ACALL(api, Executable_Destroy, &d));
  return s;
}
