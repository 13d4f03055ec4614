/* runtime.c: the PJRT plugin, its client and its addressable devices.
 *
 * The plugin is dlopen'ed once and never closed (plugins keep threads and
 * static state alive). Every table entry is checked for presence before use,
 * so an older plugin yields a clear error instead of a jump through garbage.
 * Every PJRT_Error becomes a tpu_status carrying the plugin's own message,
 * prefixed with the PJRT function that failed. Host transfers wait for their
 * events, so host memory is only borrowed for the duration of a call.
 */
#define _GNU_SOURCE
#include "runtime.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_shared.h"

struct tpu_rt_exec {
  tpu_rt *rt;
  tpu_pjrt_loaded_exec *loaded; /* owned */
  int num_outputs;
  int rows;     /* replicas x partitions: argument lists a launch takes */
  int *row_dev; /* rows > 1: the device index of each row (owned) */
};

/* Error_Message and Error_Destroy return nothing; the table types every
 * entry alike, so they are called through their real type. */
typedef void (*tpu_pjrt_void_fn)(void *args);
#define TPU_VOID_CALL(fn, args) ((tpu_pjrt_void_fn)(void (*)(void))(fn))(args)

/* Destroys err (owned; may be NULL). */
static void tpu_rt_err_release(const tpu_pjrt_api *api, tpu_pjrt_error *err) {
  tpu_pjrt_error_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_error_destroy_args, error), NULL, err};
  if (err) TPU_VOID_CALL(api->Error_Destroy, &d);
}

/* The plugin's error code, mapped: UNIMPLEMENTED and RESOURCE_EXHAUSTED keep
 * their meaning (NotImplementedError, MemoryError above us); everything else
 * is a runtime failure. */
static tpu_code tpu_rt_err_code(const tpu_pjrt_api *api, tpu_pjrt_error *err) {
  if (!TPU_HAS(api, Error_GetCode)) return TPU_ERR_RUNTIME;
  tpu_pjrt_error_code_args c = {TPU_PJRT_SIZE(tpu_pjrt_error_code_args, code), NULL, err, 0};
  tpu_pjrt_error *e2 = api->Error_GetCode(&c);
  if (e2) {
    tpu_rt_err_release(api, e2);
    return TPU_ERR_RUNTIME;
  }
  switch (c.code) {
    case TPU_PJRT_UNIMPLEMENTED: return TPU_ERR_UNIMPLEMENTED;
    case TPU_PJRT_RESOURCE_EXHAUSTED: return TPU_ERR_MEMORY;
    default: return TPU_ERR_RUNTIME;
  }
}

/* Turns a PJRT error (owned; destroyed here) into a status whose message is
 * "<what>: <the plugin's message>" (out of memory: its size in bytes also in
 * binary units). NULL stays NULL. */
tpu_status *tpu_rt_pjrt_status(const tpu_pjrt_api *api, tpu_pjrt_error *err, const char *what) {
  if (!err) return NULL;
  /* The message is not NUL-terminated and lives as long as err. */
  tpu_pjrt_error_message_args m = {TPU_PJRT_SIZE(tpu_pjrt_error_message_args, message_size), NULL, err, NULL, 0};
  TPU_VOID_CALL(api->Error_Message, &m);
  const char *msg = m.message ? m.message : "(no message)";
  int len = m.message ? (int)m.message_size : (int)strlen(msg);
  tpu_code code = tpu_rt_err_code(api, err);
  int64_t bytes = 0;
  int at = code == TPU_ERR_MEMORY ? tpu_bytes_in_text(msg, len, &bytes) : 0;
  char human[32];
  tpu_bytes_str(bytes, human, sizeof human);
  tpu_status *s = at ? tpu_status_new(code, "%s: %.*s (%s)%.*s", what, at, msg, human, len - at, msg + at)
                     : tpu_status_new(code, "%s: %.*s", what, len, msg);
  tpu_rt_err_release(api, err);
  return s;
}

tpu_status *tpu_rt_event_finish(const tpu_pjrt_api *api, tpu_pjrt_event *ev, const char *what) {
  if (!ev) return NULL;
  tpu_pjrt_event_args a = {TPU_PJRT_SIZE(tpu_pjrt_event_args, event), NULL, ev};
  tpu_status *s = tpu_rt_pjrt_status(api, api->Event_Await(&a), what);
  tpu_status *d = tpu_rt_pjrt_status(api, api->Event_Destroy(&a), "PJRT_Event_Destroy");
  if (!s) return d;
  tpu_status_free(d);
  return s;
}

static char *tpu_strndup(const char *s, size_t n) {
  char *r = malloc(n + 1);
  if (!r) return NULL;
  if (n) memcpy(r, s, n);
  r[n] = 0;
  return r;
}

/* XLA's CPU plugin registers the unwind tables of the code it compiles with
 * libgcc (__register_frame) and can unmap such code while the registration
 * stays: the next C++ exception anywhere in the process (torch raises one for
 * every Python error that crosses its dispatcher) then walks the dangling
 * table and the process dies with SIGSEGV in _Unwind_Find_FDE. No exception
 * ever unwinds through code that XLA compiled, so those registrations serve
 * nothing: the core defines both functions as no-ops (counted) and makes its
 * own symbols global before the plugin is loaded, so the plugin binds to them
 * instead of libgcc's. Only libraries loaded after the core see them. */
static atomic_llong tpu_frames_ignored;
__attribute__((visibility("default"))) void __register_frame(void *begin);
__attribute__((visibility("default"))) void __deregister_frame(void *begin);
void __register_frame(void *begin) {
  (void)begin;
  atomic_fetch_add(&tpu_frames_ignored, 1);
}
void __deregister_frame(void *begin) { (void)begin; }
int64_t tpu_rt_unwind_tables_ignored(void) { return atomic_load(&tpu_frames_ignored); }

static void tpu_rt_export_unwind_stubs(void) {
  Dl_info self;
  if (!dladdr((void *)&tpu_rt_export_unwind_stubs, &self) || !self.dli_fname) return;
  void *h = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  (void)h; /* kept open: the core is never unloaded */
}

/* The CompileOptionsProto: executable_build_options (field 3) holding
 * num_replicas = 1 (field 4) and num_partitions = 1 (field 5). An empty
 * proto means zero replicas, which aborts XLA. Then one entry of the
 * env_option_overrides map (field 7: key, field 1; OptionOverrideProto,
 * field 2, with bool_field = 2): xla_allow_excess_precision = false. XLA
 * otherwise keeps bfloat16 and float16 intermediates of a fused program in
 * float32, so a chain of half-type ops rounds once instead of after every
 * op as torch does (fused mode gave other values than CPU torch). */
/* The env_option_overrides entry every program is compiled with (see above). */
static const char tpu_env_overrides[] = {0x3a, 0x20, 0x0a, 0x1a, 'x', 'l', 'a',  '_',  'a',  'l', 'l', 'o',
                                         'w',  '_',  'e',  'x',  'c', 'e', 's',  's',  '_',  'p', 'r', 'e',
                                         'c',  'i',  's',  'i',  'o', 'n', 0x12, 0x02, 0x10, 0x00};

/* Another entry of that map: xla_backend_optimization_level (an int_field,
 * 3), the level of LLVM's optimizations in the CPU plugin's code generator.
 * XLA's default (3) spends about half of a training step's compile there;
 * level 1 compiles the GPT example's step about twice as fast; its effect
 * on step time was within the noise of the machine it was measured on
 * (docs/benchmarks.md). The byte after 0x18 is the level. */
static const char tpu_opt_level_override[] = {0x3a, 0x24, 0x0a, 0x1e, 'x', 'l', 'a', '_', 'b',  'a',  'c',  'k', 'e',
                                              'n',  'd',  '_',  'o',  'p', 't', 'i', 'm', 'i',  'z',  'a',  't', 'i',
                                              'o',  'n',  '_',  'l',  'e', 'v', 'e', 'l', 0x12, 0x02, 0x18, 0x00};

static size_t tpu_pb_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  do {
    p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

/* CompileOptionsProto bytes: executable_build_options (field 3: num_replicas
 * 4, num_partitions 5, use_spmd_partitioning 6, use_shardy_partitioner 19,
 * and allow_spmd_sharding_propagation_to_output 12, one packed bool per
 * output, where o asks XLA to choose some outputs' shardings),
 * compile_portable_executable (4), then the env_option_overrides (and the
 * optimization level when one is set). Parameters' shardings (field 18)
 * always hold as declared. */
_Static_assert(sizeof tpu_opt_level_override == 38, "one map entry: a 30-byte key and an int value");
static int tpu_rt_npropagate(const tpu_rt_compile_opts *o) {
  if (!o || !o->propagate || o->npropagate <= 0) return 0;
  for (int k = 0; k < o->npropagate; k++)
    if (o->propagate[k]) return o->npropagate;
  return 0; /* nothing chosen by XLA: the field stays unset */
}

size_t tpu_rt_options_cap(const tpu_rt_compile_opts *o) { return TPU_RT_OPTS_MAX + 2 * (size_t)tpu_rt_npropagate(o); }

size_t tpu_rt_encode_options(const tpu_rt_compile_opts *o, bool portable, int opt_level, uint8_t *out) {
  int nprop = tpu_rt_npropagate(o);
  uint8_t *b = out + tpu_rt_options_cap(o) - (32 + (size_t)nprop); /* the build options, staged at the end */
  size_t n = 0;
  int rep = o && o->replicas > 0 ? o->replicas : 1, part = o && o->partitions > 0 ? o->partitions : 1;
  b[n++] = 0x20;
  n += tpu_pb_varint(b + n, (uint64_t)rep);
  b[n++] = 0x28;
  n += tpu_pb_varint(b + n, (uint64_t)part);
  if (o && o->spmd) {
    b[n++] = 0x30;
    b[n++] = 1;
  }
  if (nprop) {
    b[n++] = 0x62;
    n += tpu_pb_varint(b + n, (uint64_t)nprop);
    for (int k = 0; k < nprop; k++) b[n++] = o->propagate[k] ? 1 : 0;
  }
  if (o && o->shardy) {
    b[n++] = 0x98;
    b[n++] = 0x01;
    b[n++] = 1;
  }
  size_t m = 0;
  out[m++] = 0x1a;
  m += tpu_pb_varint(out + m, n);
  memmove(out + m, b, n);
  m += n;
  if (portable) {
    out[m++] = 0x20;
    out[m++] = 1;
  }
  memcpy(out + m, tpu_env_overrides, sizeof tpu_env_overrides);
  m += sizeof tpu_env_overrides;
  if (opt_level >= 1 && opt_level <= 3) {
    memcpy(out + m, tpu_opt_level_override, sizeof tpu_opt_level_override);
    m += sizeof tpu_opt_level_override;
    out[m - 1] = (uint8_t)opt_level;
  }
  return m;
}

tpu_status *tpu_rt_open(const tpu_rt_options *opts, tpu_rt **out) {
  *out = NULL;
  if (!opts || !opts->plugin_path) return tpu_status_new(TPU_ERR_PLUGIN, "no PJRT plugin path given");
  const char *path = opts->plugin_path;
  if (access(path, R_OK) != 0)
    return tpu_status_new(TPU_ERR_PLUGIN,
                          "PJRT plugin %s: no such file (install xla-cpu-pjrt, libtpu or jax-cuda13-pjrt)", path);
  tpu_rt_export_unwind_stubs();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return tpu_status_new(TPU_ERR_PLUGIN, "PJRT plugin %s could not be loaded: %s", path, dlerror());
  tpu_pjrt_get_api_fn get = (tpu_pjrt_get_api_fn)dlsym(h, "GetPjrtApi");
  if (!get) return tpu_status_new(TPU_ERR_PLUGIN, "%s is not a PJRT plugin: it exports no GetPjrtApi", path);
  const tpu_pjrt_api *api = get();
  if (!api) return tpu_status_new(TPU_ERR_PLUGIN, "PJRT plugin %s returned no API table", path);
  int major = api->pjrt_api_version.major_version, minor = api->pjrt_api_version.minor_version;
  if (major != 0 || minor < TPU_RT_MIN_API_MINOR)
    return tpu_status_new(TPU_ERR_PLUGIN,
                          "PJRT plugin %s implements PJRT C API %d.%d; torchtpu needs 0.%d or newer (major 0). "
                          "Install a newer plugin.",
                          path, major, minor, TPU_RT_MIN_API_MINOR);
  const char *missing = NULL;
#define TPU_NEED(name) \
  if (!missing && !TPU_HAS(api, name)) missing = "PJRT_" #name;
  TPU_PJRT_REQUIRED(TPU_NEED)
#undef TPU_NEED
  if (missing)
    return tpu_status_new(TPU_ERR_PLUGIN, "PJRT plugin %s (API %d.%d) lacks %s, which torchtpu needs", path, major,
                          minor, missing);

  tpu_rt *rt = calloc(1, sizeof *rt);
  if (!rt) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  rt->api = api;
  tpu_status *s = NULL;
  tpu_pjrt_plugin_init_args init = {TPU_PJRT_SIZE(tpu_pjrt_plugin_init_args, extension_start), NULL};
  if (TPU_HAS(api, Plugin_Initialize)) s = TPU_CALL(api, Plugin_Initialize, &init);
  if (s) goto fail;

  /* Create options: the CPU plugin's device count; the CUDA plugin's allocator, which by
   * default reserves 75% of the GPU at start: torchtpu takes memory as it is needed unless a
   * fraction is asked for (several processes then share one GPU, as with torch.cuda). */
  tpu_pjrt_named_value nv[2];
  memset(nv, 0, sizeof nv);
  size_t nopt = 0;
  bool cpu = !opts->platform || strcmp(opts->platform, "cpu") == 0;
  bool cuda = opts->platform && strcmp(opts->platform, "cuda") == 0;
  for (size_t i = 0; i < 2; i++) {
    nv[i].struct_size = TPU_PJRT_SIZE(tpu_pjrt_named_value, value_size);
    nv[i].value_size = 1;
  }
  if (cpu) {
    nv[nopt].name = "cpu_device_count";
    nv[nopt].type = TPU_PJRT_NV_INT64;
    nv[nopt++].int64_value = opts->num_devices > 0 ? opts->num_devices : 1;
  } else if (cuda) {
    nv[nopt].name = "preallocate";
    nv[nopt].type = TPU_PJRT_NV_BOOL;
    nv[nopt++].bool_value = opts->memory_fraction > 0;
    if (opts->memory_fraction > 0) {
      nv[nopt].name = "memory_fraction";
      nv[nopt].type = TPU_PJRT_NV_FLOAT;
      nv[nopt++].float_value = (float)opts->memory_fraction;
    }
  }
  for (size_t i = 0; i < nopt; i++) nv[i].name_size = strlen(nv[i].name);
  tpu_pjrt_client_create_args cc;
  memset(&cc, 0, sizeof cc);
  cc.struct_size = TPU_PJRT_SIZE(tpu_pjrt_client_create_args, kv_try_get_user_arg);
  cc.create_options = nopt ? nv : NULL;
  cc.num_options = nopt;
  s = TPU_CALL(api, Client_Create, &cc);
  if (s) goto fail;
  rt->client = cc.client;

  tpu_pjrt_client_string_args pn = {TPU_PJRT_SIZE(tpu_pjrt_client_string_args, size), NULL, rt->client, NULL, 0};
  if ((s = TPU_CALL(api, Client_PlatformName, &pn))) goto fail;
  rt->platform = tpu_strndup(pn.str, pn.size);
  tpu_pjrt_client_string_args pv = {TPU_PJRT_SIZE(tpu_pjrt_client_string_args, size), NULL, rt->client, NULL, 0};
  if ((s = TPU_CALL(api, Client_PlatformVersion, &pv))) goto fail;
  rt->version = tpu_strndup(pv.str, pv.size);
  rt->path = tpu_strndup(path, strlen(path));

  tpu_pjrt_client_devices_args dv = {TPU_PJRT_SIZE(tpu_pjrt_client_devices_args, num_devices), NULL, rt->client, NULL,
                                     0};
  if ((s = TPU_CALL(api, Client_AddressableDevices, &dv))) goto fail;
  if (dv.num_devices == 0) {
    s = tpu_status_new(TPU_ERR_PLUGIN, "PJRT plugin %s reports no addressable devices", path);
    goto fail;
  }
  rt->devices = dv.devices;
  rt->ndevices = (int)dv.num_devices;
  rt->portable = rt->ndevices > 1;
  rt->opt_level = cpu ? opts->opt_level : 0;
  rt->kinds = calloc((size_t)rt->ndevices, sizeof *rt->kinds);
  rt->dev_bytes = calloc((size_t)rt->ndevices, sizeof *rt->dev_bytes);
  rt->dev_peak = calloc((size_t)rt->ndevices, sizeof *rt->dev_peak);
  if (!rt->kinds || !rt->dev_bytes || !rt->dev_peak || !rt->platform || !rt->version || !rt->path) {
    s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    goto fail;
  }
  for (int i = 0; i < rt->ndevices; i++) {
    tpu_pjrt_device_desc_args gd = {TPU_PJRT_SIZE(tpu_pjrt_device_desc_args, desc), NULL, rt->devices[i], NULL};
    if ((s = TPU_CALL(api, Device_GetDescription, &gd))) goto fail;
    tpu_pjrt_desc_kind_args dk = {TPU_PJRT_SIZE(tpu_pjrt_desc_kind_args, kind_size), NULL, gd.desc, NULL, 0};
    if ((s = TPU_CALL(api, DeviceDescription_Kind, &dk))) goto fail;
    rt->kinds[i] = tpu_strndup(dk.kind ? dk.kind : "", dk.kind ? dk.kind_size : 0);
  }
  *out = rt;
  return NULL;
fail:
  tpu_rt_close(rt);
  if (s && strstr(tpu_status_message(s), "No jellyfish device found")) /* libtpu's words for "no chip here" */
    s = tpu_status_prefix(s,
                          "no TPU chip was found on this machine (the TPU plugin runs programs on a chip; "
                          "TORCHTPU_AOT_TOPOLOGY compiles for one without it, and the CPU plugin runs them when "
                          "TORCHTPU_PLATFORM is not tpu)");
  return tpu_status_prefix(s, "opening PJRT plugin %s", path);
}

void tpu_rt_close(tpu_rt *rt) {
  if (!rt) return;
  if (rt->client) {
    tpu_pjrt_client_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_client_destroy_args, client), NULL, rt->client};
    tpu_status_free(TPU_CALL(rt->api, Client_Destroy, &d));
  }
  for (int i = 0; rt->kinds && i < rt->ndevices; i++) free(rt->kinds[i]);
  free(rt->kinds);
  free(rt->dev_bytes);
  free(rt->dev_peak);
  free(rt->path);
  free(rt->platform);
  free(rt->version);
  free(rt);
}

const char *tpu_rt_platform_name(const tpu_rt *rt) { return rt->platform; }
const char *tpu_rt_platform_version(const tpu_rt *rt) { return rt->version; }
const char *tpu_rt_plugin_path(const tpu_rt *rt) { return rt->path; }
void tpu_rt_api_version(const tpu_rt *rt, int *major, int *minor) {
  *major = rt->api->pjrt_api_version.major_version;
  *minor = rt->api->pjrt_api_version.minor_version;
}
int tpu_rt_device_count(const tpu_rt *rt) { return rt->ndevices; }
const char *tpu_rt_device_kind(const tpu_rt *rt, int i) {
  return (i >= 0 && i < rt->ndevices && rt->kinds[i]) ? rt->kinds[i] : "";
}
int64_t tpu_rt_live_buffers(const tpu_rt *rt) { return rt->live_buffers; }
int64_t tpu_rt_live_bytes(const tpu_rt *rt) { return rt->live_bytes; }
int64_t tpu_rt_peak_bytes(const tpu_rt *rt) { return rt->peak_bytes; }
void tpu_rt_reset_peak_bytes(tpu_rt *rt) {
  atomic_store(&rt->peak_bytes, atomic_load(&rt->live_bytes));
  for (int i = 0; i < rt->ndevices; i++) atomic_store(&rt->dev_peak[i], atomic_load(&rt->dev_bytes[i]));
}
int64_t tpu_rt_live_execs(const tpu_rt *rt) { return rt->live_execs; }

/* ---- executables ----------------------------------------------------------------- */

static int tpu_rt_device_index(const tpu_rt *rt, const tpu_pjrt_device *d) {
  for (int i = 0; i < rt->ndevices; i++)
    if (rt->devices[i] == d) return i;
  return -1;
}

/* The devices an executable runs on, one per argument list: a one-device
 * program has one row (any device when portable); a program over several
 * devices has one row per replica and partition, in the plugin's order. */
static tpu_status *tpu_rt_exec_rows_find(tpu_rt *rt, tpu_rt_exec *e) {
  e->rows = 1;
  if (rt->ndevices == 1) return NULL;
  tpu_pjrt_exec_devices_args a = {TPU_PJRT_SIZE(tpu_pjrt_exec_devices_args, num_devices), NULL, e->loaded, NULL, 0};
  tpu_status *s = TPU_CALL(rt->api, LoadedExecutable_AddressableDevices, &a);
  if (s) return s;
  if (a.num_devices <= 1) return NULL; /* portable programs report none or one */
  e->row_dev = malloc(a.num_devices * sizeof *e->row_dev);
  if (!e->row_dev) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  e->rows = (int)a.num_devices;
  for (size_t i = 0; i < a.num_devices; i++)
    if ((e->row_dev[i] = tpu_rt_device_index(rt, a.devices[i])) < 0)
      return tpu_status_new(TPU_ERR_RUNTIME, "an executable's device %zu is not an addressable device", i);
  return NULL;
}

static tpu_status *tpu_rt_exec_wrap(tpu_rt *rt, tpu_pjrt_loaded_exec *le, tpu_rt_exec **out) {
  const tpu_pjrt_api *api = rt->api;
  tpu_rt_exec *e = calloc(1, sizeof *e);
  if (!e) {
    tpu_pjrt_loaded_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_loaded_destroy_args, executable), NULL, le};
    tpu_status_free(TPU_CALL(api, LoadedExecutable_Destroy, &d));
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  e->rt = rt;
  e->loaded = le;
  atomic_fetch_add(&rt->live_execs, 1);
  tpu_pjrt_get_exec_args g = {TPU_PJRT_SIZE(tpu_pjrt_get_exec_args, executable), NULL, le, NULL};
  tpu_status *s = TPU_CALL(api, LoadedExecutable_GetExecutable, &g);
  if (!s) {
    tpu_pjrt_num_outputs_args n = {TPU_PJRT_SIZE(tpu_pjrt_num_outputs_args, num_outputs), NULL, g.executable, 0};
    s = TPU_CALL(api, Executable_NumOutputs, &n);
    e->num_outputs = (int)n.num_outputs;
    if (!s) s = tpu_rt_exec_rows_find(rt, e);
    tpu_pjrt_exec_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_exec_destroy_args, executable), NULL, g.executable};
    tpu_status_free(TPU_CALL(api, Executable_Destroy, &d));
  }
  if (s) {
    tpu_rt_exec_free(e);
    return s;
  }
  *out = e;
  return NULL;
}

/* Environment variables the plugins read their compiler flags from: a flag
 * can change the code (fast math, precision), so an entry compiled under
 * other flags must not be found. */
static const char *const tpu_flag_vars[] = {"XLA_FLAGS", "LIBTPU_INIT_ARGS"};

char *tpu_rt_cache_salt(const tpu_rt *rt) {
  struct stat st;
  long long size = -1, mtime = -1;
  if (stat(rt->path, &st) == 0) {
    size = (long long)st.st_size;
    mtime = (long long)st.st_mtime;
  }
  uint8_t ob[TPU_RT_OPTS_MAX];
  size_t on = tpu_rt_encode_options(NULL, rt->portable, rt->opt_level, ob);
  char opts[2 * sizeof ob + 1];
  for (size_t i = 0; i < on; i++) snprintf(opts + 2 * i, 3, "%02x", (unsigned)ob[i]);
  const char *flags[2];
  for (size_t i = 0; i < 2; i++) {
    const char *v = getenv(tpu_flag_vars[i]);
    flags[i] = v ? v : "";
  }
  /* the flags go last, each with its length: their text may hold ';' and '=' */
  return tpu_strfmt("platform=%s;version=%s;pjrt=%d.%d;options=%s;plugin=%s;size=%lld;mtime=%lld;%s=[%zu]%s;%s=[%zu]%s",
                    rt->platform, rt->version, rt->api->pjrt_api_version.major_version,
                    rt->api->pjrt_api_version.minor_version, opts, rt->path, size, mtime, tpu_flag_vars[0],
                    strlen(flags[0]), flags[0], tpu_flag_vars[1], strlen(flags[1]), flags[1]);
}

tpu_status *tpu_rt_compile(tpu_rt *rt, const char *mlir, size_t len, tpu_rt_exec **out) {
  return tpu_rt_compile_with(rt, mlir, len, NULL, out);
}

tpu_status *tpu_rt_compile_with(tpu_rt *rt, const char *mlir, size_t len, const tpu_rt_compile_opts *o,
                                tpu_rt_exec **out) {
  *out = NULL;
  int rows = o ? (o->replicas > 0 ? o->replicas : 1) * (o->partitions > 0 ? o->partitions : 1) : 1;
  if (rows < 1 || rows > rt->ndevices)
    return tpu_status_new(TPU_ERR_VALUE, "a program over %d devices (replicas x partitions); this process has %d", rows,
                          rt->ndevices);
  uint8_t *ob = malloc(tpu_rt_options_cap(o));
  if (!ob) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  size_t on = tpu_rt_encode_options(o, rows == 1 && rt->portable, rt->opt_level, ob);
  tpu_pjrt_program p = {TPU_PJRT_SIZE(tpu_pjrt_program, format_size), NULL, (char *)mlir, len, "mlir", 4};
  tpu_pjrt_compile_args c = {
      TPU_PJRT_SIZE(tpu_pjrt_compile_args, executable), NULL, rt->client, &p, (const char *)ob, on, NULL};
  tpu_status *s = TPU_CALL(rt->api, Client_Compile, &c);
  free(ob);
  if (s) return s;
  return tpu_rt_exec_wrap(rt, c.executable, out);
}

int tpu_rt_exec_num_outputs(const tpu_rt_exec *e) { return e->num_outputs; }
int tpu_rt_exec_rows(const tpu_rt_exec *e) { return e->rows; }
int tpu_rt_exec_row_device(const tpu_rt_exec *e, int row) {
  return e->rows > 1 && row >= 0 && row < e->rows ? e->row_dev[row] : 0;
}

void tpu_rt_exec_free(tpu_rt_exec *e) {
  if (!e) return;
  tpu_pjrt_loaded_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_loaded_destroy_args, executable), NULL, e->loaded};
  tpu_status_free(TPU_CALL(e->rt->api, LoadedExecutable_Destroy, &d));
  atomic_fetch_sub(&e->rt->live_execs, 1);
  free(e->row_dev);
  free(e);
}

tpu_status *tpu_rt_optimized_program(const tpu_pjrt_api *api, tpu_pjrt_exec *x, tpu_rt_module *out) {
  memset(out, 0, sizeof *out);
  if (!TPU_HAS(api, Executable_OptimizedProgram))
    return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "this PJRT plugin gives no optimized program");
  /* first the size (code NULL), then the bytes */
  tpu_pjrt_program p = {TPU_PJRT_SIZE(tpu_pjrt_program, format_size), NULL, NULL, 0, NULL, 0};
  tpu_pjrt_optimized_args a = {TPU_PJRT_SIZE(tpu_pjrt_optimized_args, program), NULL, x, &p};
  tpu_status *s = TPU_CALL(api, Executable_OptimizedProgram, &a);
  bool plain = p.format && p.format_size == 3 && memcmp(p.format, "hlo", 3) == 0;
  bool with_config = p.format && p.format_size == 15 && memcmp(p.format, "hlo_with_config", 15) == 0;
  if (!s && !plain && !with_config)
    s = tpu_status_new(TPU_ERR_UNIMPLEMENTED, "the plugin's optimized program is in format \"%.*s\", not \"hlo\"",
                       p.format ? (int)p.format_size : 0, p.format ? p.format : "");
  if (!s && !(p.code = malloc(p.code_size ? p.code_size : 1))) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  if (!s) s = TPU_CALL(api, Executable_OptimizedProgram, &a);
  if (!s) {
    out->bytes = (uint8_t *)p.code;
    out->len = p.code_size;
    out->with_config = with_config;
  } else {
    free(p.code);
  }
  return s;
}

tpu_status *tpu_rt_exec_optimized(tpu_rt_exec *e, tpu_rt_module *out) {
  const tpu_pjrt_api *api = e->rt->api;
  memset(out, 0, sizeof *out);
  tpu_pjrt_get_exec_args g = {TPU_PJRT_SIZE(tpu_pjrt_get_exec_args, executable), NULL, e->loaded, NULL};
  tpu_status *s = TPU_CALL(api, LoadedExecutable_GetExecutable, &g);
  if (s) return s;
  s = tpu_rt_optimized_program(api, g.executable, out);
  tpu_pjrt_exec_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_exec_destroy_args, executable), NULL, g.executable};
  tpu_status_free(TPU_CALL(api, Executable_Destroy, &d));
  return s;
}

tpu_status *tpu_rt_exec_serialize(tpu_rt *rt, tpu_rt_exec *e, void **bytes, size_t *len) {
  const tpu_pjrt_api *api = rt->api;
  *bytes = NULL;
  *len = 0;
  if (!TPU_HAS(api, Executable_Serialize))
    return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "this PJRT plugin cannot serialize executables");
  tpu_pjrt_get_exec_args g = {TPU_PJRT_SIZE(tpu_pjrt_get_exec_args, executable), NULL, e->loaded, NULL};
  tpu_status *s = TPU_CALL(api, LoadedExecutable_GetExecutable, &g);
  if (s) return s;
  tpu_pjrt_serialize_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = TPU_PJRT_SIZE(tpu_pjrt_serialize_args, deleter);
  a.executable = g.executable;
  s = TPU_CALL(api, Executable_Serialize, &a);
  if (!s) {
    *bytes = malloc(a.bytes_size ? a.bytes_size : 1);
    if (*bytes) {
      memcpy(*bytes, a.bytes, a.bytes_size);
      *len = a.bytes_size;
    } else {
      s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
    }
    if (a.deleter) a.deleter(a.serialized);
  }
  tpu_pjrt_exec_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_exec_destroy_args, executable), NULL, g.executable};
  tpu_status_free(TPU_CALL(api, Executable_Destroy, &d));
  return s;
}

tpu_status *tpu_rt_exec_deserialize(tpu_rt *rt, const void *bytes, size_t len, tpu_rt_exec **out) {
  *out = NULL;
  if (!TPU_HAS(rt->api, Executable_DeserializeAndLoad))
    return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "this PJRT plugin cannot deserialize executables");
  tpu_pjrt_deserialize_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = TPU_PJRT_SIZE(tpu_pjrt_deserialize_args, overridden_compile_options_size);
  a.client = rt->client;
  a.serialized = bytes;
  a.serialized_size = len;
  tpu_status *s = TPU_CALL(rt->api, Executable_DeserializeAndLoad, &a);
  if (s) return s;
  return tpu_rt_exec_wrap(rt, a.loaded, out);
}

/* ---- buffers ---------------------------------------------------------------------- */

static void tpu_rt_pjrt_buffer_destroy(const tpu_pjrt_api *api, tpu_pjrt_buffer *b) {
  tpu_pjrt_buffer_destroy_args d = {TPU_PJRT_SIZE(tpu_pjrt_buffer_destroy_args, buffer), NULL, b};
  tpu_status_free(TPU_CALL(api, Buffer_Destroy, &d));
}

/* Dense row-major bytes of a shape; 0 for an unknown element type. */
static size_t tpu_rt_dense_nbytes(tpu_dtype dt, int rank, const int64_t *dims) {
  size_t n = tpu_dtype_size(dt);
  for (int i = 0; i < rank; i++) n *= (size_t)dims[i];
  return n;
}

/* Wraps b (ownership passes to the wrapper, or b is destroyed on failure). */
static tpu_status *tpu_rt_buffer_wrap(tpu_rt *rt, tpu_pjrt_buffer *b, int device, tpu_dtype dt, int rank,
                                      const int64_t *dims, tpu_rt_buffer **out) {
  *out = NULL;
  tpu_rt_buffer *w = calloc(1, sizeof *w);
  if (!w) {
    tpu_rt_pjrt_buffer_destroy(rt->api, b);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  w->rt = rt;
  w->buf = b;
  w->device = device;
  w->dtype = dt;
  w->rank = rank;
  if (rank) memcpy(w->dims, dims, (size_t)rank * sizeof *dims);
  w->nbytes = tpu_rt_dense_nbytes(dt, rank, dims);
  atomic_fetch_add(&rt->live_buffers, 1);
  long long now = atomic_fetch_add(&rt->live_bytes, (long long)w->nbytes) + (long long)w->nbytes;
  long long peak = atomic_load(&rt->peak_bytes);
  while (now > peak && !atomic_compare_exchange_weak(&rt->peak_bytes, &peak, now)) {}
  now = atomic_fetch_add(&rt->dev_bytes[device], (long long)w->nbytes) + (long long)w->nbytes;
  peak = atomic_load(&rt->dev_peak[device]);
  while (now > peak && !atomic_compare_exchange_weak(&rt->dev_peak[device], &peak, now)) {}
  *out = w;
  return NULL;
}

/* Wraps an execution's output, asking the plugin for its type and shape. */
static tpu_status *tpu_rt_buffer_wrap_output(tpu_rt *rt, tpu_pjrt_buffer *b, int device, tpu_rt_buffer **out) {
  const tpu_pjrt_api *api = rt->api;
  *out = NULL;
  tpu_pjrt_element_type_args t = {TPU_PJRT_SIZE(tpu_pjrt_element_type_args, type), NULL, b, 0};
  tpu_pjrt_dimensions_args d = {TPU_PJRT_SIZE(tpu_pjrt_dimensions_args, num_dims), NULL, b, NULL, 0};
  tpu_status *s = TPU_CALL(api, Buffer_ElementType, &t);
  if (!s) s = TPU_CALL(api, Buffer_Dimensions, &d);
  if (!s && d.num_dims > TPU_MAX_RANK)
    s = tpu_status_new(TPU_ERR_UNIMPLEMENTED, "an output of rank %zu (at most %d supported)", d.num_dims, TPU_MAX_RANK);
  if (s) {
    tpu_rt_pjrt_buffer_destroy(api, b);
    return s;
  }
  return tpu_rt_buffer_wrap(rt, b, device, (tpu_dtype)t.type, (int)d.num_dims, d.dims, out);
}

struct tpu_rt_event {
  tpu_pjrt_event *ev; /* owned */
};

bool tpu_rt_event_ready(tpu_rt *rt, tpu_rt_event *ev) {
  if (!ev) return true;
  tpu_pjrt_event_is_ready_args a = {TPU_PJRT_SIZE(tpu_pjrt_event_is_ready_args, is_ready), NULL, ev->ev, false};
  tpu_status *s = TPU_CALL(rt->api, Event_IsReady, &a);
  if (s) {
    tpu_status_free(s);
    return true; /* the wait reports it */
  }
  return a.is_ready;
}

tpu_status *tpu_rt_event_wait(tpu_rt *rt, tpu_rt_event *ev) {
  if (!ev) return NULL;
  tpu_status *s = tpu_rt_event_finish(rt->api, ev->ev, "executing");
  free(ev);
  return s;
}

/* What the plugin's OnReady callback needs: it destroys the error itself. */
typedef struct {
  const tpu_pjrt_api *api;
  tpu_rt_ready_fn fn;
  void *user;
} tpu_rt_ready;

static void tpu_rt_ready_cb(tpu_pjrt_error *err, void *arg) {
  tpu_rt_ready *r = arg;
  tpu_rt_err_release(r->api, err);
  r->fn(r->user);
  free(r);
}

tpu_status *tpu_rt_event_on_ready(tpu_rt *rt, tpu_rt_event *ev, tpu_rt_ready_fn fn, void *user) {
  if (!ev || !fn) return tpu_status_new(TPU_ERR_VALUE, "event_on_ready: no event or no function");
  if (!TPU_HAS(rt->api, Event_OnReady))
    return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "the plugin has no PJRT_Event_OnReady");
  tpu_rt_ready *r = malloc(sizeof *r);
  if (!r) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  *r = (tpu_rt_ready){rt->api, fn, user};
  tpu_pjrt_event_on_ready_args a = {TPU_PJRT_SIZE(tpu_pjrt_event_on_ready_args, user_arg), NULL, ev->ev,
                                    tpu_rt_ready_cb, r};
  tpu_status *s = TPU_CALL(rt->api, Event_OnReady, &a);
  if (s) free(r); /* not registered: never called */
  return s;
}

tpu_status *tpu_rt_execute(tpu_rt *rt, tpu_rt_exec *e, tpu_rt_buffer *const *args, int nargs, tpu_rt_buffer **outs) {
  return tpu_rt_execute_async(rt, e, args, nargs, outs, NULL);
}

static tpu_status *tpu_rt_launch(tpu_rt *rt, tpu_rt_exec *e, int device, tpu_rt_buffer *const *args, int nargs,
                                 tpu_rt_buffer **outs, tpu_rt_event **done_out, bool keep);

tpu_status *tpu_rt_execute_async(tpu_rt *rt, tpu_rt_exec *e, tpu_rt_buffer *const *args, int nargs,
                                 tpu_rt_buffer **outs, tpu_rt_event **done_out) {
  return tpu_rt_launch(rt, e, -1, args, nargs, outs, done_out, false);
}

tpu_status *tpu_rt_execute_keep(tpu_rt *rt, tpu_rt_exec *e, tpu_rt_buffer *const *args, int nargs, tpu_rt_buffer **outs,
                                tpu_rt_event **done_out) {
  return tpu_rt_launch(rt, e, -1, args, nargs, outs, done_out, true);
}

tpu_status *tpu_rt_execute_on(tpu_rt *rt, tpu_rt_exec *e, int device, tpu_rt_buffer *const *args, int nargs,
                              tpu_rt_buffer **outs, tpu_rt_event **done_out, bool keep) {
  if (device < 0 || device >= rt->ndevices)
    return tpu_status_new(TPU_ERR_VALUE, "execute: device %d of %d", device, rt->ndevices);
  return tpu_rt_launch(rt, e, device, args, nargs, outs, done_out, keep);
}

/* Runs e's nrows argument lists (args[r * nargs + i]), row r on the device
 * the executable gives it (every buffer of the row must be there); outs
 * receives nrows x num_outputs buffers, row-major. *done: events of all rows
 * (NULL when waited here). */
static tpu_status *tpu_rt_launch_rows(tpu_rt *rt, tpu_rt_exec *e, tpu_pjrt_device *exec_dev, int nrows,
                                      tpu_rt_buffer *const *args, int nargs, tpu_rt_buffer **outs,
                                      tpu_rt_event **done_out, bool keep) {
  if (done_out) *done_out = NULL;
  const tpu_pjrt_api *api = rt->api;
  if (nargs < 0 || (nargs > 0 && !args)) return tpu_status_new(TPU_ERR_VALUE, "execute: %d arguments", nargs);
  for (int i = 0; i < nrows * nargs; i++)
    if (!args[i]) return tpu_status_new(TPU_ERR_VALUE, "execute: argument %d of row %d is NULL", i % nargs, i / nargs);
  int nout = e->num_outputs;
  size_t na = (size_t)nrows * (size_t)(nargs > 0 ? nargs : 1), no = (size_t)nrows * (size_t)(nout > 0 ? nout : 1);
  tpu_pjrt_buffer **argv = calloc(na, sizeof *argv), **outv = calloc(no, sizeof *outv);
  tpu_pjrt_buffer **arg_lists[nrows], **out_lists[nrows];
  tpu_pjrt_event *done[nrows];
  memset(done, 0, sizeof done);
  if (!argv || !outv) {
    free(argv);
    free(outv);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  for (int r = 0; r < nrows; r++) {
    arg_lists[r] = argv + (size_t)r * (size_t)(nargs > 0 ? nargs : 1);
    out_lists[r] = outv + (size_t)r * (size_t)(nout > 0 ? nout : 1);
    for (int i = 0; i < nargs; i++) arg_lists[r][i] = args[r * nargs + i]->buf;
  }
  tpu_pjrt_execute_options opt;
  memset(&opt, 0, sizeof opt);
  opt.struct_size = TPU_PJRT_SIZE(tpu_pjrt_execute_options, multi_slice_config);
  int64_t keepv[keep && nargs > 0 ? nargs : 1];
  if (keep) {
    for (int i = 0; i < nargs; i++) keepv[i] = i;
    opt.non_donatable_input_indices = keepv;
    opt.num_non_donatable_input_indices = (size_t)nargs;
  }
  tpu_pjrt_execute_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = TPU_PJRT_SIZE(tpu_pjrt_execute_args, execute_device);
  a.executable = e->loaded;
  a.options = &opt;
  a.argument_lists = (tpu_pjrt_buffer *const *const *)arg_lists;
  a.num_devices = (size_t)nrows;
  a.num_args = (size_t)nargs;
  a.output_lists = out_lists;
  a.device_complete_events = done;
  a.execute_device = exec_dev;
  tpu_status *s = TPU_CALL(api, LoadedExecutable_Execute, &a);
  if (!s && done_out && nrows == 1 && done[0]) {
    /* Asynchronous: the outputs are usable at once (the plugin orders their
     * uses after the computation); the caller waits on the event later. */
    tpu_rt_event *w = malloc(sizeof *w);
    if (w) {
      w->ev = done[0];
      done[0] = NULL;
      *done_out = w;
    }
  }
  for (int r = 0; r < nrows; r++) {
    if (!s)
      s = tpu_rt_event_finish(api, done[r], "executing");
    else if (done[r])
      tpu_status_free(tpu_rt_event_finish(api, done[r], "executing"));
  }
  /* Every output the plugin returned is either wrapped or destroyed. */
  size_t total = (size_t)nrows * (size_t)nout;
  for (size_t k = 0; k < total; k++) {
    int r = (int)(k / (size_t)nout);
    tpu_pjrt_buffer *b = out_lists[r][k % (size_t)nout];
    outs[k] = NULL;
    if (!b) continue;
    if (s) {
      tpu_rt_pjrt_buffer_destroy(api, b);
      continue;
    }
    int dev = exec_dev ? tpu_rt_device_index(rt, exec_dev) : (e->rows > 1 ? e->row_dev[r] : 0);
    s = tpu_rt_buffer_wrap_output(rt, b, dev, &outs[k]);
  }
  free(argv);
  free(outv);
  if (!s)
    for (size_t k = 0; k < total; k++)
      if (!outs[k])
        s = tpu_status_new(TPU_ERR_RUNTIME, "PJRT_LoadedExecutable_Execute returned no output %zu of row %zu",
                           k % (size_t)nout, k / (size_t)nout);
  if (s)
    for (size_t k = 0; k < total; k++) {
      tpu_rt_buffer_free(outs[k]);
      outs[k] = NULL;
    }
  return s;
}

static tpu_status *tpu_rt_launch(tpu_rt *rt, tpu_rt_exec *e, int device, tpu_rt_buffer *const *args, int nargs,
                                 tpu_rt_buffer **outs, tpu_rt_event **done_out, bool keep) {
  if (done_out) *done_out = NULL;
  if (e->rows != 1)
    return tpu_status_new(TPU_ERR_VALUE, "execute: a program over %d devices needs one argument list each", e->rows);
  if (nargs < 0 || (nargs > 0 && !args)) return tpu_status_new(TPU_ERR_VALUE, "execute: %d arguments", nargs);
  for (int i = 0; i < nargs; i++)
    if (!args[i]) return tpu_status_new(TPU_ERR_VALUE, "execute: argument %d is NULL", i);
  if (device < 0) device = nargs > 0 ? args[0]->device : 0;
  for (int i = 0; i < nargs; i++)
    if (args[i]->device != device)
      return tpu_status_new(TPU_ERR_VALUE, "execute: argument %d is on device %d, the program runs on device %d", i,
                            args[i]->device, device);
  if (!rt->portable && device != 0)
    return tpu_status_new(TPU_ERR_VALUE, "execute: device %d of a process with one device", device);
  return tpu_rt_launch_rows(rt, e, rt->portable ? rt->devices[device] : NULL, 1, args, nargs, outs, done_out, keep);
}

tpu_status *tpu_rt_execute_rows(tpu_rt *rt, tpu_rt_exec *e, tpu_rt_buffer *const *args, int nargs,
                                tpu_rt_buffer **outs) {
  for (int r = 0; r < e->rows; r++)
    for (int i = 0; i < nargs; i++) {
      tpu_rt_buffer *b = args[r * nargs + i];
      int want = e->rows > 1 ? e->row_dev[r] : 0;
      if (b && b->device != want)
        return tpu_status_new(TPU_ERR_VALUE, "execute: argument %d of row %d is on device %d, the row runs on %d", i, r,
                              b->device, want);
    }
  return tpu_rt_launch_rows(rt, e, NULL, e->rows, args, nargs, outs, NULL, false);
}

tpu_status *tpu_rt_buffer_from_host(tpu_rt *rt, const void *data, tpu_dtype dtype, const int64_t *dims, int rank,
                                    tpu_rt_buffer **out) {
  return tpu_rt_buffer_from_host_on(rt, 0, data, dtype, dims, rank, out);
}

tpu_status *tpu_rt_buffer_from_host_on(tpu_rt *rt, int device, const void *data, tpu_dtype dtype, const int64_t *dims,
                                       int rank, tpu_rt_buffer **out) {
  *out = NULL;
  if (device < 0 || device >= rt->ndevices)
    return tpu_status_new(TPU_ERR_VALUE, "host to device: device %d of %d", device, rt->ndevices);
  if (!tpu_dtype_size(dtype)) return tpu_status_new(TPU_ERR_TYPE, "unsupported element type %d", (int)dtype);
  if (rank < 0 || rank > TPU_MAX_RANK || (rank > 0 && !dims))
    return tpu_status_new(TPU_ERR_VALUE, "buffer of rank %d (0..%d, with dims)", rank, TPU_MAX_RANK);
  for (int i = 0; i < rank; i++)
    if (dims[i] < 0) return tpu_status_new(TPU_ERR_VALUE, "dimension %d is %lld", i, (long long)dims[i]);
  if (!data && tpu_rt_dense_nbytes(dtype, rank, dims) > 0) return tpu_status_new(TPU_ERR_VALUE, "no host data");
  tpu_pjrt_from_host_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = TPU_PJRT_SIZE(tpu_pjrt_from_host_args, buffer);
  a.client = rt->client;
  a.data = data;
  a.type = (int)dtype;
  a.dims = dims;
  a.num_dims = (size_t)rank;
  a.host_buffer_semantics = TPU_PJRT_HOST_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  a.device = rt->devices[device];
  tpu_status *s = TPU_CALL(rt->api, Client_BufferFromHostBuffer, &a);
  if (s) return s;
  /* The event fires once the plugin no longer reads data: only then may we
   * return, since data is borrowed for the call alone. */
  s = tpu_rt_event_finish(rt->api, a.done_with_host_buffer, "host to device transfer");
  if (s) {
    tpu_rt_pjrt_buffer_destroy(rt->api, a.buffer);
    return s;
  }
  return tpu_rt_buffer_wrap(rt, a.buffer, device, dtype, rank, dims, out);
}

tpu_status *tpu_rt_buffer_copy(tpu_rt *rt, tpu_rt_buffer *b, int device, tpu_rt_buffer **out) {
  *out = NULL;
  if (device < 0 || device >= rt->ndevices)
    return tpu_status_new(TPU_ERR_VALUE, "device to device: device %d of %d", device, rt->ndevices);
  tpu_pjrt_copy_to_device_args a = {TPU_PJRT_SIZE(tpu_pjrt_copy_to_device_args, dst_buffer), NULL, b->buf,
                                    rt->devices[device], NULL};
  tpu_status *s = TPU_CALL(rt->api, Buffer_CopyToDevice, &a);
  if (s) return s;
  return tpu_rt_buffer_wrap(rt, a.dst_buffer, device, b->dtype, b->rank, b->dims, out);
}

int tpu_rt_buffer_device(const tpu_rt_buffer *b) { return b->device; }
int64_t tpu_rt_device_live_bytes(const tpu_rt *rt, int device) {
  return device >= 0 && device < rt->ndevices ? rt->dev_bytes[device] : 0;
}
int64_t tpu_rt_device_peak_bytes(const tpu_rt *rt, int device) {
  return device >= 0 && device < rt->ndevices ? rt->dev_peak[device] : 0;
}

tpu_status *tpu_rt_buffer_to_host(tpu_rt *rt, tpu_rt_buffer *b, void *dst, size_t nbytes) {
  if (nbytes != b->nbytes)
    return tpu_status_new(TPU_ERR_VALUE, "device to host: buffer holds %zu bytes, destination %zu", b->nbytes, nbytes);
  if (!dst && nbytes) return tpu_status_new(TPU_ERR_VALUE, "device to host: no destination");
  /* Ask for dense row-major explicitly: without a host layout the plugin
   * uses the buffer's device layout, which need not be row-major (TPU). */
  int64_t m2m[TPU_MAX_RANK];
  for (int i = 0; i < b->rank; i++) m2m[i] = b->rank - 1 - i;
  tpu_pjrt_layout layout;
  memset(&layout, 0, sizeof layout);
  layout.struct_size = TPU_PJRT_SIZE(tpu_pjrt_layout, type);
  layout.type = TPU_PJRT_LAYOUT_TILED;
  layout.tiled.struct_size = TPU_PJRT_SIZE(tpu_pjrt_layout_tiled, num_tiles);
  layout.tiled.minor_to_major = m2m;
  layout.tiled.minor_to_major_size = (size_t)b->rank;
  tpu_pjrt_to_host_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = TPU_PJRT_SIZE(tpu_pjrt_to_host_args, event);
  a.src = b->buf;
  a.host_layout = b->rank >= 2 ? &layout : NULL; /* rank 0 and 1 have one layout */
  a.dst = NULL;
  tpu_status *s = TPU_CALL(rt->api, Buffer_ToHostBuffer, &a); /* size query */
  if (s) return s;
  if (a.dst_size != nbytes)
    return tpu_status_new(TPU_ERR_RUNTIME, "device to host: the plugin's buffer holds %zu bytes, expected %zu",
                          a.dst_size, nbytes);
  a.dst = dst;
  a.event = NULL;
  s = TPU_CALL(rt->api, Buffer_ToHostBuffer, &a);
  if (s) return s;
  return tpu_rt_event_finish(rt->api, a.event, "device to host transfer");
}

size_t tpu_rt_buffer_nbytes(const tpu_rt_buffer *b) { return b->nbytes; }
tpu_dtype tpu_rt_buffer_dtype(const tpu_rt_buffer *b) { return b->dtype; }
int tpu_rt_buffer_rank(const tpu_rt_buffer *b) { return b->rank; }
const int64_t *tpu_rt_buffer_dims(const tpu_rt_buffer *b) { return b->dims; }

void tpu_rt_buffer_free(tpu_rt_buffer *b) {
  if (!b) return;
  tpu_rt_pjrt_buffer_destroy(b->rt->api, b->buf);
  atomic_fetch_sub(&b->rt->live_buffers, 1);
  atomic_fetch_sub(&b->rt->live_bytes, (long long)b->nbytes);
  atomic_fetch_sub(&b->rt->dev_bytes[b->device], (long long)b->nbytes);
  free(b);
}

tpu_status *tpu_rt_device_memory(tpu_rt *rt, int device, int64_t *in_use, int64_t *peak, int64_t *limit) {
  *in_use = 0;
  *peak = *limit = -1;
  if (!TPU_HAS(rt->api, Device_MemoryStats))
    return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "this PJRT plugin reports no memory statistics");
  tpu_pjrt_memory_stats_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = TPU_PJRT_SIZE(tpu_pjrt_memory_stats_args, peak_pool_bytes_is_set);
  if (device < 0 || device >= rt->ndevices)
    return tpu_status_new(TPU_ERR_VALUE, "memory statistics: device %d of %d", device, rt->ndevices);
  a.device = rt->devices[device];
  /* The CPU plugin answers UNIMPLEMENTED, which maps to TPU_ERR_UNIMPLEMENTED. */
  tpu_status *s = TPU_CALL(rt->api, Device_MemoryStats, &a);
  if (s) return s;
  *in_use = a.bytes_in_use;
  if (a.peak_bytes_in_use_is_set) *peak = a.peak_bytes_in_use;
  if (a.bytes_limit_is_set) *limit = a.bytes_limit;
  return NULL;
}

tpu_status *tpu_rt_memory_in_use(tpu_rt *rt, int64_t *bytes) {
  int64_t peak, limit;
  return tpu_rt_device_memory(rt, 0, bytes, &peak, &limit);
}
