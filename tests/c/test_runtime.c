/* test_runtime.c: the runtime against a real PJRT plugin (argv[1]).
 *
 * Most programs are built with the StableHLO builder, so this also checks
 * that XLA's parser accepts the builder's text; one is hand-written text, to
 * check the runtime apart from the builder. Every check counts; the last line
 * is "N passed, M failed" and the exit status is non-zero on any failure.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hlo/hlo.h"
#include "runtime/runtime.h"

#include "check.h"
#include "check_status.h"


static tpu_rt *rt;

static tpu_hlo_type ty(tpu_dtype dt, int rank, const int64_t *dims) { return tpu_hlo_type_make(dt, rank, dims); }
static tpu_hlo_type scalar(tpu_dtype dt) { return tpu_hlo_type_make(dt, 0, NULL); }

static tpu_rt_buffer *upload(const void *data, tpu_dtype dt, int rank, const int64_t *dims) {
  tpu_rt_buffer *b = NULL;
  if (!OK(tpu_rt_buffer_from_host(rt, data, dt, dims, rank, &b), "buffer_from_host")) return NULL;
  return b;
}

static bool download(tpu_rt_buffer *b, void *dst, size_t n) {
  return b && OK(tpu_rt_buffer_to_host(rt, b, dst, n), "buffer_to_host");
}

/* Finish m (freed), compile, return the executable or NULL. */
static tpu_rt_exec *compile(tpu_hlo *m, const tpu_hv *res, int nres, const char *name) {
  char *text = NULL;
  size_t len = 0;
  tpu_status *s = tpu_hlo_finish(m, res, nres, &text, &len);
  tpu_hlo_free(m);
  if (!OK(s, name)) return NULL;
  tpu_rt_exec *e = NULL;
  s = tpu_rt_compile(rt, text, len, &e);
  if (s) fprintf(stderr, "--- %s: rejected program:\n%s", name, text);
  free(text);
  if (!OK(s, name)) return NULL;
  CHECK(tpu_rt_exec_num_outputs(e) == nres, "%s: %d outputs", name, tpu_rt_exec_num_outputs(e));
  return e;
}

/* Build, compile and run; outputs (nres of them) are owned by the caller.
 * args are freed here. */
static bool run(tpu_hlo *m, const tpu_hv *res, int nres, tpu_rt_buffer **args, int nargs, tpu_rt_buffer **outs,
                const char *name) {
  for (int i = 0; i < nres; i++) outs[i] = NULL;
  bool good = true;
  for (int i = 0; i < nargs; i++) good = good && args[i];
  tpu_rt_exec *e = good ? compile(m, res, nres, name) : (tpu_hlo_free(m), NULL);
  if (e)
    good = OK(tpu_rt_execute(rt, e, args, nargs, outs), name);
  else
    good = false;
  tpu_rt_exec_free(e);
  for (int i = 0; i < nargs; i++) tpu_rt_buffer_free(args[i]);
  return good;
}

static void free_all(tpu_rt_buffer **bs, int n) {
  for (int i = 0; i < n; i++) tpu_rt_buffer_free(bs[i]);
}

static bool close_enough(double got, double want, double tol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= tol * (1.0 + fabs(want));
}

static void check_f32(const char *name, const float *got, const float *want, int n, double tol) {
  int bad = -1;
  for (int i = 0; i < n && bad < 0; i++)
    if (!close_enough(got[i], want[i], tol)) bad = i;
  CHECK(bad < 0, "%s: element %d is %.9g, want %.9g", name, bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
}

static void check_i32(const char *name, const int32_t *got, const int32_t *want, int n) {
  int bad = -1;
  for (int i = 0; i < n && bad < 0; i++)
    if (got[i] != want[i]) bad = i;
  CHECK(bad < 0, "%s: element %d is %d, want %d", name, bad, bad >= 0 ? got[bad] : 0, bad >= 0 ? want[bad] : 0);
}

/* ---- opening ----------------------------------------------------------------------------- */

static void test_open_errors(void) {
  tpu_rt *r = NULL;
  const char *missing = "/nonexistent/dir/libno_such_plugin.so";
  tpu_rt_options o = {missing, "cpu", 1, 0, 0};
  tpu_status *s = tpu_rt_open(&o, &r);
  CHECK(s && r == NULL, "opening a missing plugin succeeded");
  if (s) {
    CHECK(tpu_status_code(s) == TPU_ERR_PLUGIN, "code %d", tpu_status_code(s));
    CHECK(strstr(tpu_status_message(s), missing) != NULL, "message does not name the path: %s", tpu_status_message(s));
    tpu_status_free(s);
  }

  /* A real shared library that is not a PJRT plugin: libc. */
  char libc[4096] = "/lib/x86_64-linux-gnu/libc.so.6";
  void *h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (h) {
    void *sym = dlsym(h, "gnu_get_libc_version");
    Dl_info info;
    if (sym && dladdr(sym, &info) && info.dli_fname && info.dli_fname[0] == '/')
      snprintf(libc, sizeof libc, "%s", info.dli_fname);
    dlclose(h);
  }
  if (access(libc, R_OK) != 0) {
    printf("skip: no libc found to load as a non-plugin\n");
    return;
  }
  o.plugin_path = libc;
  s = tpu_rt_open(&o, &r);
  CHECK(s && r == NULL, "opening libc as a plugin succeeded");
  if (s) {
    CHECK(tpu_status_code(s) == TPU_ERR_PLUGIN, "code %d", tpu_status_code(s));
    CHECK(strstr(tpu_status_message(s), "GetPjrtApi") != NULL, "message: %s", tpu_status_message(s));
    CHECK(strstr(tpu_status_message(s), libc) != NULL, "message does not name %s: %s", libc, tpu_status_message(s));
    tpu_status_free(s);
  }
  o.plugin_path = NULL;
  s = tpu_rt_open(&o, &r);
  CHECK(s && tpu_status_code(s) == TPU_ERR_PLUGIN, "no path must be TPU_ERR_PLUGIN");
  tpu_status_free(s);
}

static void test_info(void) {
  CHECK(strcmp(tpu_rt_platform_name(rt), "cpu") == 0, "platform %s", tpu_rt_platform_name(rt));
  int major = -1, minor = -1;
  tpu_rt_api_version(rt, &major, &minor);
  CHECK(major == 0 && minor >= TPU_RT_MIN_API_MINOR, "API %d.%d", major, minor);
  CHECK(tpu_rt_device_count(rt) >= 1, "%d devices", tpu_rt_device_count(rt));
  CHECK(tpu_rt_platform_version(rt) != NULL, "no platform version");
  CHECK(tpu_rt_device_kind(rt, 0) != NULL && tpu_rt_device_kind(rt, 0)[0], "no device kind");
  CHECK(strcmp(tpu_rt_device_kind(rt, 99), "") == 0, "out-of-range device kind");
  int64_t bytes = -1;
  tpu_status *s = tpu_rt_memory_in_use(rt, &bytes);
  CHECK(!s || tpu_status_code(s) == TPU_ERR_UNIMPLEMENTED, "memory_in_use: %s", tpu_status_message(s));
  if (s) {
    CHECK(strncmp(tpu_status_message(s), "PJRT_Device_MemoryStats: ", 25) == 0, "memory_in_use message: %s",
          tpu_status_message(s));
    printf("memory_in_use: %s\n", tpu_status_message(s));
  } else {
    CHECK(bytes >= 0, "memory_in_use: %lld bytes", (long long)bytes);
  }
  tpu_status_free(s);
  printf("plugin: %s, platform %s %s, API %d.%d, %d device(s), kind %s\n", tpu_rt_plugin_path(rt),
         tpu_rt_platform_name(rt), tpu_rt_platform_version(rt), major, minor, tpu_rt_device_count(rt),
         tpu_rt_device_kind(rt, 0));
}

/* ---- dtypes ------------------------------------------------------------------------------- */

static void test_dtype_roundtrips(void) {
  static const tpu_dtype dts[] = {TPU_PRED, TPU_S8,  TPU_S16,  TPU_S32, TPU_S64, TPU_U8,  TPU_U16, TPU_U32,
                                  TPU_U64,  TPU_F16, TPU_BF16, TPU_F32, TPU_F64, TPU_C64, TPU_C128};
  const int64_t dims[2] = {2, 3};
  for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    tpu_dtype dt = dts[k];
    size_t es = tpu_dtype_size(dt), n = 6 * es;
    unsigned char in[6 * 16], out[6 * 16];
    for (size_t i = 0; i < n; i++) in[i] = (unsigned char)(i * 37 + 11 + k);
    if (dt == TPU_PRED)
      for (size_t i = 0; i < n; i++) in[i] = (unsigned char)(i & 1);
    if (dt == TPU_F16 || dt == TPU_BF16) /* keep clear of NaN payloads: exponent < max */
      for (size_t i = 1; i < n; i += 2) in[i] &= 0x3f;
    if (dt == TPU_F32 || dt == TPU_C64)
      for (size_t i = 3; i < n; i += 4) in[i] &= 0x3f;
    if (dt == TPU_F64 || dt == TPU_C128)
      for (size_t i = 7; i < n; i += 8) in[i] &= 0x3f;
    memset(out, 0xAA, sizeof out);
    tpu_rt_buffer *b = upload(in, dt, 2, dims);
    if (!b) continue;
    CHECK(tpu_rt_buffer_nbytes(b) == n, "%s: nbytes %zu", tpu_dtype_name(dt), tpu_rt_buffer_nbytes(b));
    CHECK(tpu_rt_buffer_dtype(b) == dt, "%s: dtype %d", tpu_dtype_name(dt), tpu_rt_buffer_dtype(b));
    CHECK(tpu_rt_buffer_rank(b) == 2 && tpu_rt_buffer_dims(b)[0] == 2 && tpu_rt_buffer_dims(b)[1] == 3, "%s: rank %d",
          tpu_dtype_name(dt), tpu_rt_buffer_rank(b));
    if (download(b, out, n))
      CHECK(memcmp(in, out, n) == 0, "%s: bytes differ after the round trip", tpu_dtype_name(dt));
    /* A wrong destination size is an error, not an overflow. */
    tpu_status *s = tpu_rt_buffer_to_host(rt, b, out, n + 1);
    CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE, "%s: to_host with a wrong size succeeded", tpu_dtype_name(dt));
    tpu_status_free(s);
    tpu_rt_buffer_free(b);
  }
  /* A 0-d scalar. */
  double v = -2.5, w = 0;
  tpu_rt_buffer *b = upload(&v, TPU_F64, 0, NULL);
  if (download(b, &w, sizeof w)) CHECK(w == v, "scalar round trip gave %g", w);
  tpu_rt_buffer_free(b);
}

/* ---- programs ------------------------------------------------------------------------------- */

static void test_add(void) {
  const int64_t d[2] = {2, 3};
  float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {10, 20, 30, 40, 50, 60}, z[6], want[6];
  for (int i = 0; i < 6; i++) want[i] = x[i] + y[i];
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, d)), b = tpu_hlo_param(m, ty(TPU_F32, 2, d));
  tpu_hv r = tpu_hlo_binary(m, TPU_HLO_ADD, a, b);
  tpu_rt_buffer *args[2] = {upload(x, TPU_F32, 2, d), upload(y, TPU_F32, 2, d)}, *out;
  if (run(m, &r, 1, args, 2, &out, "add") && download(out, z, sizeof z)) check_f32("add", z, want, 6, 0);
  tpu_rt_buffer_free(out);
}

/* The CPU plugin's buffers are host memory, lent in place: an uploaded
 * rank-3 buffer and a program's output read there as their transfers do
 * (dense row-major), and a write there is what the next program reads. */
static void test_host_memory(void) {
  const int64_t d[3] = {2, 3, 4};
  float x[24], got[24], want[24];
  for (int i = 0; i < 24; i++) x[i] = (float)i * 0.5f - 3.0f;
  tpu_rt_buffer *b = upload(x, TPU_F32, 3, d);
  void *addr = NULL;
  if (b && OK(tpu_rt_buffer_host_memory(rt, b, &addr), "host_memory")) {
    CHECK(addr != NULL, "the CPU plugin lends no host memory");
    if (addr) check_f32("host_memory of an upload", addr, x, 24, 0);
  }
  /* a program's output, transposed on the way: its memory is row-major too */
  const int64_t dt[3] = {4, 3, 2};
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 3, d));
  const int64_t perm[3] = {2, 1, 0};
  tpu_hv r = tpu_hlo_transpose(m, a, perm);
  tpu_rt_buffer *args[1] = {b}, *out = NULL;
  if (run(m, &r, 1, args, 1, &out, "transpose for host_memory") && download(out, want, sizeof want) &&
      OK(tpu_rt_buffer_host_memory(rt, out, &addr), "host_memory of an output") && addr) {
    check_f32("host_memory of a program's output", addr, want, 24, 0);
    /* written in place, read by the next program */
    for (int i = 0; i < 24; i++) ((float *)addr)[i] = (float)(100 + i);
    tpu_hlo *m2 = tpu_hlo_new();
    tpu_hv p = tpu_hlo_param(m2, ty(TPU_F32, 3, dt));
    tpu_hv q = tpu_hlo_binary(m2, TPU_HLO_ADD, p, p);
    tpu_rt_buffer *args2[1] = {out}, *twice = NULL;
    out = NULL; /* freed by run */
    if (run(m2, &q, 1, args2, 1, &twice, "reading a buffer written in place") && download(twice, got, sizeof got)) {
      for (int i = 0; i < 24; i++) want[i] = 2.0f * (float)(100 + i);
      check_f32("a program reads what the host wrote in place", got, want, 24, 0);
    }
    tpu_rt_buffer_free(twice);
  }
  tpu_rt_buffer_free(out);
  /* an empty buffer lends nothing, without an error */
  const int64_t e[1] = {0};
  tpu_rt_buffer *empty = upload(x, TPU_F32, 1, e);
  addr = x;
  if (empty && OK(tpu_rt_buffer_host_memory(rt, empty, &addr), "host_memory of an empty buffer"))
    CHECK(addr == NULL, "an empty buffer lent memory");
  tpu_rt_buffer_free(empty);
}

/* A function from StableHLO text in pretty form (locations, a helper it
 * calls), called twice from a built module and used by a builder op: the
 * plugin accepts the generic func.call and the private definitions. */
static void test_extern_call(void) {
  static const char fn[] =
      "module @jit_f {\n"
      "  func.func public @main(%x: tensor<3xf32> loc(\"x\")) -> (tensor<3xf32> {jax.result_info = "
      "\"r\"}) {\n"
      "    %0 = call @twice(%x) : (tensor<3xf32>) -> tensor<3xf32> loc(#loc1)\n"
      "    %1 = stablehlo.multiply %0, %x : tensor<3xf32>\n"
      "    return %1 : tensor<3xf32>\n  }\n"
      "  func.func private @twice(%a: tensor<3xf32>) -> tensor<3xf32> {\n"
      "    %0 = stablehlo.add %a, %a : tensor<3xf32>\n    return %0 : tensor<3xf32>\n  }\n"
      "}\n#loc1 = loc(\"f.py\":1:2)\n";
  tpu_hlo_fn *f = NULL;
  if (!OK(tpu_hlo_fn_parse(fn, sizeof fn - 1, &f), "parse extern")) return;
  const int64_t d[1] = {3};
  float x[3] = {1, 2, -3}, z[3], want[3];
  for (int i = 0; i < 3; i++) want[i] = 2 * (2 * x[i] * x[i]) * (2 * x[i] * x[i]) + 1;
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, d)), y, w;
  tpu_hlo_call(m, f, &a, 1, &y);
  tpu_hlo_call(m, f, &y, 1, &w);
  tpu_hv r =
      tpu_hlo_binary(m, TPU_HLO_ADD, w, tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant(m, TPU_F32, 1), 1, d, NULL));
  tpu_rt_buffer *args[1] = {upload(x, TPU_F32, 1, d)}, *out;
  if (run(m, &r, 1, args, 1, &out, "extern call") && download(out, z, sizeof z))
    check_f32("extern call", z, want, 3, 1e-6);
  tpu_rt_buffer_free(out);
  tpu_hlo_fn_free(f);
}

/* The same add, as hand-written StableHLO text in generic form, so the
 * runtime is checked apart from the builder; the outputs' shape comes from
 * the plugin. */
static void test_add_text(void) {
  static const char prog[] =
      "module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
      "  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<2x3xf32>) -> tensor<2x3xf32> {\n"
      "    %0 = \"stablehlo.add\"(%arg0, %arg1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>\n"
      "    \"func.return\"(%0) : (tensor<2x3xf32>) -> ()\n"
      "  }\n"
      "}\n";
  const int64_t d[2] = {2, 3};
  float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {0.5f, -2, 30, 0, -5, 1e6f}, z[6], want[6];
  for (int i = 0; i < 6; i++) want[i] = x[i] + y[i];
  tpu_rt_exec *e = NULL;
  if (!OK(tpu_rt_compile(rt, prog, sizeof prog - 1, &e), "compile text add")) return;
  CHECK(tpu_rt_exec_num_outputs(e) == 1, "text add: %d outputs", tpu_rt_exec_num_outputs(e));
  tpu_rt_buffer *args[2] = {upload(x, TPU_F32, 2, d), upload(y, TPU_F32, 2, d)}, *out = NULL;
  if (args[0] && args[1] && OK(tpu_rt_execute(rt, e, args, 2, &out), "execute text add")) {
    CHECK(tpu_rt_buffer_dtype(out) == TPU_F32, "output dtype %d", tpu_rt_buffer_dtype(out));
    CHECK(tpu_rt_buffer_rank(out) == 2 && tpu_rt_buffer_dims(out)[0] == 2 && tpu_rt_buffer_dims(out)[1] == 3,
          "output rank %d", tpu_rt_buffer_rank(out));
    CHECK(tpu_rt_buffer_nbytes(out) == sizeof z, "output nbytes %zu", tpu_rt_buffer_nbytes(out));
    if (download(out, z, sizeof z)) check_f32("text add", z, want, 6, 0);
    /* Run it again on the same inputs: executables and inputs are reusable. */
    tpu_rt_buffer *out2 = NULL;
    if (OK(tpu_rt_execute(rt, e, args, 2, &out2), "execute text add again") && download(out2, z, sizeof z))
      check_f32("text add again", z, want, 6, 0);
    tpu_rt_buffer_free(out2);
    /* Asynchronously: a chain of launches whose results feed the next one,
     * then the events; the last result is that of three additions. */
    tpu_rt_buffer *a1 = NULL, *a2 = NULL;
    tpu_rt_event *ev1 = NULL, *ev2 = NULL;
    if (OK(tpu_rt_execute_async(rt, e, args, 2, &a1, &ev1), "launch text add")) {
      tpu_rt_buffer *next[2] = {a1, args[1]};
      if (OK(tpu_rt_execute_async(rt, e, next, 2, &a2, &ev2), "launch text add on its result")) {
        if (download(a2, z, sizeof z)) {
          for (int i = 0; i < 6; i++) want[i] = x[i] + y[i] + y[i];
          check_f32("async chain", z, want, 6, 0);
        }
        CHECK(tpu_rt_event_ready(rt, ev2), "downloaded result: its computation is done");
        OK(tpu_rt_event_wait(rt, ev2), "wait second launch");
      }
      OK(tpu_rt_event_wait(rt, ev1), "wait first launch");
    }
    CHECK(tpu_rt_event_ready(rt, NULL) && tpu_rt_event_wait(rt, NULL) == NULL, "NULL event");
    tpu_rt_buffer_free(a1);
    tpu_rt_buffer_free(a2);
  }
  tpu_rt_buffer_free(out);
  free_all(args, 2);
  tpu_rt_exec_free(e);
}

/* Completion callbacks (the profiler's end of a program): each runs once,
 * after its computation, maybe on a plugin thread and after the wait. */
static atomic_int ready_calls;
static void on_ready(void *user) { atomic_fetch_add(&ready_calls, *(int *)user); }

static void test_on_ready(void) {
  static const char prog[] =
      "module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
      "  func.func public @main(%arg0: tensor<64xf32>) -> tensor<64xf32> {\n"
      "    %0 = \"stablehlo.multiply\"(%arg0, %arg0) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>\n"
      "    \"func.return\"(%0) : (tensor<64xf32>) -> ()\n"
      "  }\n"
      "}\n";
  const int64_t d[1] = {64};
  float x[64];
  for (int i = 0; i < 64; i++) x[i] = (float)i;
  tpu_rt_exec *e = NULL;
  if (!OK(tpu_rt_compile(rt, prog, sizeof prog - 1, &e), "compile square")) return;
  tpu_rt_buffer *in = upload(x, TPU_F32, 1, d), *a = NULL, *b = NULL;
  tpu_rt_event *ev1 = NULL, *ev2 = NULL;
  static int one = 1, ten = 10;
  atomic_store(&ready_calls, 0);
  if (in && OK(tpu_rt_execute_async(rt, e, &in, 1, &a, &ev1), "launch square") &&
      OK(tpu_rt_execute_async(rt, e, &a, 1, &b, &ev2), "launch square of square")) {
    OK(tpu_rt_event_on_ready(rt, ev1, on_ready, &one), "on_ready first");
    OK(tpu_rt_event_on_ready(rt, ev2, on_ready, &ten), "on_ready second");
    OK(tpu_rt_event_wait(rt, ev2), "wait second");
    OK(tpu_rt_event_wait(rt, ev1), "wait first");
    for (int k = 0; k < 5000 && atomic_load(&ready_calls) != 11; k++) usleep(1000);
    CHECK(atomic_load(&ready_calls) == 11, "on_ready callbacks: sum %d, expected 11", atomic_load(&ready_calls));
  }
  tpu_status *s = tpu_rt_event_on_ready(rt, NULL, on_ready, &one);
  CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE, "on_ready without an event accepted");
  tpu_status_free(s);
  tpu_rt_buffer_free(in);
  tpu_rt_buffer_free(a);
  tpu_rt_buffer_free(b);
  tpu_rt_exec_free(e);
}

/* Bad arguments are statuses before anything reaches the plugin. */
static void test_bad_buffers(void) {
  float x[4] = {0};
  const int64_t neg[2] = {2, -1}, over[TPU_MAX_RANK + 1] = {0};
  tpu_rt_buffer *b = (tpu_rt_buffer *)1;
  tpu_status *s = tpu_rt_buffer_from_host(rt, x, TPU_F32, neg, 2, &b);
  CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE && b == NULL, "negative dimension accepted");
  tpu_status_free(s);
  s = tpu_rt_buffer_from_host(rt, x, TPU_F32, over, TPU_MAX_RANK + 1, &b);
  CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE && b == NULL, "rank 65 accepted");
  tpu_status_free(s);
  s = tpu_rt_buffer_from_host(rt, x, TPU_INVALID, NULL, 0, &b);
  CHECK(s && tpu_status_code(s) == TPU_ERR_TYPE && b == NULL, "invalid dtype accepted");
  tpu_status_free(s);
  /* An empty buffer is fine, and needs no data. */
  const int64_t empty[2] = {0, 3};
  s = tpu_rt_buffer_from_host(rt, NULL, TPU_F32, empty, 2, &b);
  if (OK(s, "empty buffer")) {
    CHECK(tpu_rt_buffer_nbytes(b) == 0, "empty nbytes %zu", tpu_rt_buffer_nbytes(b));
    tpu_rt_buffer_free(b);
  }
  tpu_rt_buffer_free(NULL);
  tpu_rt_exec_free(NULL);
}

/* Every elementwise op name, run on known inputs. */
static void test_elementwise(void) {
  const int64_t n = 4;
  float x[4] = {0.5f, 1.5f, 2.25f, -2.5f}, y[4] = {2.0f, -1.0f, 0.75f, 3.0f};
  static const tpu_hlo_op un[] = {TPU_HLO_ABS,        TPU_HLO_NEG,  TPU_HLO_EXP,   TPU_HLO_EXPM1,    TPU_HLO_SQRT,
                                  TPU_HLO_RSQRT,      TPU_HLO_CBRT, TPU_HLO_TANH,  TPU_HLO_LOGISTIC, TPU_HLO_SIN,
                                  TPU_HLO_COS,        TPU_HLO_TAN,  TPU_HLO_FLOOR, TPU_HLO_CEIL,     TPU_HLO_ROUND_EVEN,
                                  TPU_HLO_ROUND_AWAY, TPU_HLO_SIGN, TPU_HLO_LOG,   TPU_HLO_LOG1P};
  static const tpu_hlo_op bin[] = {TPU_HLO_ADD, TPU_HLO_SUB, TPU_HLO_MUL, TPU_HLO_DIV,  TPU_HLO_REM,
                                   TPU_HLO_POW, TPU_HLO_MAX, TPU_HLO_MIN, TPU_HLO_ATAN2};
  enum { NU = sizeof un / sizeof un[0], NB = sizeof bin / sizeof bin[0] };
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, &n)), b = tpu_hlo_param(m, ty(TPU_F32, 1, &n));
  tpu_hv ax = tpu_hlo_unary(m, TPU_HLO_ABS, a); /* log, sqrt of |x| */
  tpu_hv res[NU + NB + 1];
  for (int i = 0; i < NU; i++) {
    bool pos = un[i] == TPU_HLO_SQRT || un[i] == TPU_HLO_RSQRT || un[i] == TPU_HLO_LOG || un[i] == TPU_HLO_LOG1P;
    res[i] = tpu_hlo_unary(m, un[i], pos ? ax : a);
  }
  for (int i = 0; i < NB; i++) {
    bool pos = bin[i] == TPU_HLO_POW;
    res[NU + i] = tpu_hlo_binary(m, bin[i], pos ? ax : a, b);
  }
  res[NU + NB] = tpu_hlo_convert(m, tpu_hlo_unary(m, TPU_HLO_IS_FINITE, tpu_hlo_binary(m, TPU_HLO_DIV, a, b)), TPU_F32);
  tpu_rt_buffer *args[2] = {upload(x, TPU_F32, 1, &n), upload(y, TPU_F32, 1, &n)}, *outs[NU + NB + 1];
  if (!run(m, res, NU + NB + 1, args, 2, outs, "elementwise f32")) {
    free_all(outs, NU + NB + 1);
    return;
  }
  for (int i = 0; i < NU + NB + 1; i++) {
    float got[4], want[4];
    for (int k = 0; k < 4; k++) {
      double v = x[k], w = y[k], r = 0;
      double av = fabs(v);
      if (i < NU) switch (un[i]) {
          case TPU_HLO_ABS: r = av; break;
          case TPU_HLO_NEG: r = -v; break;
          case TPU_HLO_EXP: r = exp(v); break;
          case TPU_HLO_EXPM1: r = expm1(v); break;
          case TPU_HLO_SQRT: r = sqrt(av); break;
          case TPU_HLO_RSQRT: r = 1 / sqrt(av); break;
          case TPU_HLO_CBRT: r = cbrt(v); break;
          case TPU_HLO_TANH: r = tanh(v); break;
          case TPU_HLO_LOGISTIC: r = 1 / (1 + exp(-v)); break;
          case TPU_HLO_SIN: r = sin(v); break;
          case TPU_HLO_COS: r = cos(v); break;
          case TPU_HLO_TAN: r = tan(v); break;
          case TPU_HLO_FLOOR: r = floor(v); break;
          case TPU_HLO_CEIL: r = ceil(v); break;
          case TPU_HLO_ROUND_EVEN: r = nearbyint(v); break;
          case TPU_HLO_ROUND_AWAY: r = round(v); break;
          case TPU_HLO_SIGN: r = v > 0 ? 1 : v < 0 ? -1 : 0; break;
          case TPU_HLO_LOG: r = log(av); break;
          case TPU_HLO_LOG1P: r = log1p(av); break;
          default: break;
        }
      else if (i < NU + NB)
        switch (bin[i - NU]) {
          case TPU_HLO_ADD: r = v + w; break;
          case TPU_HLO_SUB: r = v - w; break;
          case TPU_HLO_MUL: r = v * w; break;
          case TPU_HLO_DIV: r = v / w; break;
          case TPU_HLO_REM: r = fmod(v, w); break;
          case TPU_HLO_POW: r = pow(av, w); break;
          case TPU_HLO_MAX: r = fmax(v, w); break;
          case TPU_HLO_MIN: r = fmin(v, w); break;
          case TPU_HLO_ATAN2: r = atan2(v, w); break;
          default: break;
        }
      else
        r = 1;
      want[k] = (float)r;
    }
    char name[32];
    snprintf(name, sizeof name, "elementwise #%d", i);
    if (download(outs[i], got, sizeof got)) check_f32(name, got, want, 4, 1e-5);
  }
  free_all(outs, NU + NB + 1);

  /* Integer and bitwise ops, compare/select/clamp, complex parts. */
  int32_t p[4] = {5, -6, 7, 1 << 20}, q[4] = {3, 2, -1, 4};
  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_S32, 1, &n));
  b = tpu_hlo_param(m, ty(TPU_S32, 1, &n));
  tpu_hv sh =
      tpu_hlo_binary(m, TPU_HLO_AND, b, tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant_int(m, TPU_S32, 7), 1, &n, NULL));
  tpu_hv ir[12] = {
      tpu_hlo_binary(m, TPU_HLO_AND, a, b),    tpu_hlo_binary(m, TPU_HLO_OR, a, b),
      tpu_hlo_binary(m, TPU_HLO_XOR, a, b),    tpu_hlo_binary(m, TPU_HLO_SHL, a, sh),
      tpu_hlo_binary(m, TPU_HLO_SHR_A, a, sh), tpu_hlo_binary(m, TPU_HLO_SHR_L, a, sh),
      tpu_hlo_unary(m, TPU_HLO_NOT, a),        tpu_hlo_unary(m, TPU_HLO_POPCNT, a),
      tpu_hlo_unary(m, TPU_HLO_CLZ, a),        tpu_hlo_binary(m, TPU_HLO_DIV, a, b),
      tpu_hlo_binary(m, TPU_HLO_REM, a, b),    tpu_hlo_select(m, tpu_hlo_compare(m, TPU_HLO_GT, a, b), a, b)};
  tpu_hlo_cmp dirs[6] = {TPU_HLO_EQ, TPU_HLO_NE, TPU_HLO_LT, TPU_HLO_LE, TPU_HLO_GT, TPU_HLO_GE};
  tpu_hv cr[6];
  for (int i = 0; i < 6; i++) cr[i] = tpu_hlo_convert(m, tpu_hlo_compare(m, dirs[i], a, b), TPU_S32);
  tpu_hv lo = tpu_hlo_constant_int(m, TPU_S32, -1), hi = tpu_hlo_constant_int(m, TPU_S32, 6);
  tpu_hv cl = tpu_hlo_clamp(m, lo, a, hi);
  tpu_hv all[19];
  memcpy(all, ir, sizeof ir);
  memcpy(all + 12, cr, sizeof cr);
  all[18] = cl;
  tpu_rt_buffer *iargs[2] = {upload(p, TPU_S32, 1, &n), upload(q, TPU_S32, 1, &n)}, *iouts[19];
  if (run(m, all, 19, iargs, 2, iouts, "elementwise s32")) {
    for (int i = 0; i < 19; i++) {
      int32_t got[4], want[4];
      for (int k = 0; k < 4; k++) {
        int32_t v = p[k], w = q[k], s = w & 7;
        uint32_t u = (uint32_t)v;
        int32_t r = 0;
        switch (i) {
          case 0: r = v & w; break;
          case 1: r = v | w; break;
          case 2: r = v ^ w; break;
          case 3: r = (int32_t)(u << s); break;
          case 4: r = v >> s; break; /* gcc: arithmetic */
          case 5: r = (int32_t)(u >> s); break;
          case 6: r = ~v; break;
          case 7: r = __builtin_popcount(u); break;
          case 8: r = u ? __builtin_clz(u) : 32; break;
          case 9: r = v / w; break;
          case 10: r = v % w; break;
          case 11: r = v > w ? v : w; break;
          case 12: r = v == w; break;
          case 13: r = v != w; break;
          case 14: r = v < w; break;
          case 15: r = v <= w; break;
          case 16: r = v > w; break;
          case 17: r = v >= w; break;
          case 18: r = v < -1 ? -1 : v > 6 ? 6 : v; break;
        }
        want[k] = r;
      }
      char name[32];
      snprintf(name, sizeof name, "elementwise s32 #%d", i);
      if (download(iouts[i], got, sizeof got)) check_i32(name, got, want, 4);
    }
  }
  free_all(iouts, 19);

  /* Complex: complex(x, y), then real, imag, abs. */
  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, &n));
  b = tpu_hlo_param(m, ty(TPU_F32, 1, &n));
  tpu_hv c = tpu_hlo_binary(m, TPU_HLO_COMPLEX, a, b);
  tpu_hv cres[4] = {tpu_hlo_unary(m, TPU_HLO_REAL, c), tpu_hlo_unary(m, TPU_HLO_IMAG, c),
                    tpu_hlo_unary(m, TPU_HLO_ABS, c), c};
  float y2[4] = {3, 4, 0, -1}, x2[4] = {4, 3, 1, 0};
  tpu_rt_buffer *cargs[2] = {upload(x2, TPU_F32, 1, &n), upload(y2, TPU_F32, 1, &n)}, *couts[4];
  if (run(m, cres, 4, cargs, 2, couts, "complex")) {
    float got[4], want_abs[4] = {5, 5, 1, 1}, cgot[8], cwant[8];
    if (download(couts[0], got, sizeof got)) check_f32("real", got, x2, 4, 0);
    if (download(couts[1], got, sizeof got)) check_f32("imag", got, y2, 4, 0);
    if (download(couts[2], got, sizeof got)) check_f32("abs complex", got, want_abs, 4, 1e-6);
    for (int k = 0; k < 4; k++) {
      cwant[2 * k] = x2[k];
      cwant[2 * k + 1] = y2[k];
    }
    if (download(couts[3], cgot, sizeof cgot)) check_f32("complex", cgot, cwant, 8, 0);
  }
  free_all(couts, 4);
}

/* Constants (incl. non-finite and wrapped), iota, broadcast, reshape, transpose,
 * slice, concat, pad, reverse, dynamic slices, bitcast. */
static void test_shapes_and_constants(void) {
  tpu_hlo *m = tpu_hlo_new();
  const int64_t d23[2] = {2, 3}, d32[2] = {3, 2}, d6 = 6, d3 = 3;
  tpu_hv x = tpu_hlo_param(m, ty(TPU_F32, 2, d23));
  tpu_hv res[16];
  int nr = 0;
  /* 0: f32 constants */
  tpu_hv k[4] = {tpu_hlo_constant(m, TPU_F32, INFINITY), tpu_hlo_constant(m, TPU_F32, -INFINITY),
                 tpu_hlo_constant(m, TPU_F32, NAN), tpu_hlo_constant(m, TPU_F32, -0.1)};
  int64_t one = 1, four = 4;
  tpu_hv kk[4];
  for (int i = 0; i < 4; i++) kk[i] = tpu_hlo_reshape(m, k[i], 1, &one);
  res[nr++] = tpu_hlo_concat(m, kk, 4, 0);
  /* 1: integer constants, wrapped to int8, bool, a dense int constant */
  tpu_hv ik[4] = {tpu_hlo_convert(m, tpu_hlo_constant_int(m, TPU_S8, 200), TPU_S32),
                  tpu_hlo_convert(m, tpu_hlo_constant_int(m, TPU_S8, -128), TPU_S32),
                  tpu_hlo_convert(m, tpu_hlo_constant_int(m, TPU_PRED, 1), TPU_S32),
                  tpu_hlo_convert(m, tpu_hlo_constant_int(m, TPU_U8, 255), TPU_S32)};
  for (int i = 0; i < 4; i++) ik[i] = tpu_hlo_reshape(m, ik[i], 1, &one);
  tpu_hv icat = tpu_hlo_concat(m, ik, 4, 0);
  const int64_t dense[4] = {1, -2, 3, -4};
  res[nr++] = tpu_hlo_binary(m, TPU_HLO_ADD, icat, tpu_hlo_constant_ints(m, ty(TPU_S32, 1, &four), dense));
  /* 2: iota dim 1 of 2x3 */
  res[nr++] = tpu_hlo_iota(m, ty(TPU_S32, 2, d23), 1);
  /* 3: broadcast a row [3] to 2x3 via dim 1, plus x */
  tpu_hv row = tpu_hlo_iota(m, ty(TPU_F32, 1, &d3), 0);
  int64_t bd1 = 1;
  res[nr++] = tpu_hlo_binary(m, TPU_HLO_ADD, x, tpu_hlo_broadcast_in_dim(m, row, 2, d23, &bd1));
  /* 4: transpose -> 3x2, reshape -> 6 */
  int64_t perm[2] = {1, 0};
  res[nr++] = tpu_hlo_reshape(m, tpu_hlo_transpose(m, x, perm), 1, &d6);
  /* 5: slice x[:, 1:3] */
  int64_t st[2] = {0, 1}, lim[2] = {2, 3};
  res[nr++] = tpu_hlo_slice(m, x, st, lim, NULL);
  /* 6: pad 1 low, 0 high, interior 1 on dim 1, with -1 */
  int64_t plo[2] = {0, 1}, phi[2] = {1, 0}, pin[2] = {0, 1};
  res[nr++] = tpu_hlo_pad(m, x, tpu_hlo_constant(m, TPU_F32, -1), plo, phi, pin);
  /* 7: reverse dim 1 */
  int64_t rd = 1;
  res[nr++] = tpu_hlo_reverse(m, x, &rd, 1);
  /* 8: dynamic_slice x[1, 1:3] with starts (1, 1) */
  tpu_hv starts[2] = {tpu_hlo_constant_int(m, TPU_S32, 1), tpu_hlo_constant_int(m, TPU_S32, 1)};
  int64_t ds[2] = {1, 2};
  res[nr++] = tpu_hlo_dynamic_slice(m, x, starts, ds);
  /* 9: dynamic_update_slice of a 1x2 block of 9s at (0, 1) */
  tpu_hv nine = tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant(m, TPU_F32, 9), 2, ds, NULL);
  tpu_hv st2[2] = {tpu_hlo_constant_int(m, TPU_S32, 0), tpu_hlo_constant_int(m, TPU_S32, 1)};
  res[nr++] = tpu_hlo_dynamic_update_slice(m, x, nine, st2);
  /* 10: bitcast f32 -> u32 of 1.0 */
  res[nr++] = tpu_hlo_bitcast_convert(m, tpu_hlo_constant(m, TPU_F32, 1.0), TPU_U32);
  /* 11: f64/f16/bf16 constants converted to f32 */
  tpu_hv hk[3] = {tpu_hlo_convert(m, tpu_hlo_constant(m, TPU_F64, 0.1), TPU_F32),
                  tpu_hlo_convert(m, tpu_hlo_constant(m, TPU_F16, -INFINITY), TPU_F32),
                  tpu_hlo_convert(m, tpu_hlo_constant(m, TPU_BF16, 1.5), TPU_F32)};
  for (int i = 0; i < 3; i++) hk[i] = tpu_hlo_reshape(m, hk[i], 1, &one);
  res[nr++] = tpu_hlo_concat(m, hk, 3, 0);
  /* 12: 3x2 concat of x^T halves along dim 0 (as 2 pieces of 3x1) */
  tpu_hv xt = tpu_hlo_transpose(m, x, perm);
  int64_t s0[2] = {0, 0}, l0[2] = {3, 1}, s1[2] = {0, 1}, l1[2] = {3, 2};
  tpu_hv halves[2] = {tpu_hlo_slice(m, xt, s1, l1, NULL), tpu_hlo_slice(m, xt, s0, l0, NULL)};
  res[nr++] = tpu_hlo_concat(m, halves, 2, 1);
  (void)d32;
  /* 13: c64 constant (real part), i64 and u64 */
  res[nr++] = tpu_hlo_constant(m, TPU_C64, 2.5);
  res[nr++] = tpu_hlo_constant_int(m, TPU_S64, INT64_MIN);
  res[nr++] = tpu_hlo_constant_int(m, TPU_U64, -1);

  float xv[6] = {0, 1, 2, 3, 4, 5};
  tpu_rt_buffer *args[1] = {upload(xv, TPU_F32, 2, d23)}, *outs[16];
  if (!run(m, res, nr, args, 1, outs, "shapes and constants")) {
    free_all(outs, nr);
    return;
  }
  float f[32];
  int32_t iv[8];
  if (download(outs[0], f, 16)) {
    float want[4] = {INFINITY, -INFINITY, NAN, -0.1f};
    check_f32("f32 constants", f, want, 4, 0);
  }
  if (download(outs[1], iv, 16)) {
    int32_t want[4] = {-56 + 1, -128 - 2, 1 + 3, 255 - 4};
    check_i32("int constants", iv, want, 4);
  }
  if (download(outs[2], iv, 24)) {
    int32_t want[6] = {0, 1, 2, 0, 1, 2};
    check_i32("iota", iv, want, 6);
  }
  if (download(outs[3], f, 24)) {
    float want[6] = {0, 2, 4, 3, 5, 7};
    check_f32("broadcast_in_dim", f, want, 6, 0);
  }
  if (download(outs[4], f, 24)) {
    float want[6] = {0, 3, 1, 4, 2, 5};
    check_f32("transpose+reshape", f, want, 6, 0);
  }
  if (download(outs[5], f, 16)) {
    float want[4] = {1, 2, 4, 5};
    check_f32("slice", f, want, 4, 0);
  }
  if (download(outs[6], f, 3 * 6 * 4)) {
    float want[18] = {-1, 0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, -1, -1, -1, -1, -1};
    check_f32("pad", f, want, 18, 0);
  }
  if (download(outs[7], f, 24)) {
    float want[6] = {2, 1, 0, 5, 4, 3};
    check_f32("reverse", f, want, 6, 0);
  }
  if (download(outs[8], f, 8)) {
    float want[2] = {4, 5};
    check_f32("dynamic_slice", f, want, 2, 0);
  }
  if (download(outs[9], f, 24)) {
    float want[6] = {0, 9, 9, 3, 4, 5};
    check_f32("dynamic_update_slice", f, want, 6, 0);
  }
  uint32_t u = 0;
  if (download(outs[10], &u, 4)) CHECK(u == 0x3f800000u, "bitcast gave %08x", u);
  if (download(outs[11], f, 12)) {
    float want[3] = {0.1f, -INFINITY, 1.5f};
    check_f32("f64/f16/bf16 constants", f, want, 3, 0);
  }
  if (download(outs[12], f, 24)) {
    float want[6] = {3, 0, 4, 1, 5, 2};
    check_f32("concat", f, want, 6, 0);
  }
  if (download(outs[13], f, 8)) CHECK(f[0] == 2.5f && f[1] == 0.0f, "c64 constant (%g, %g)", f[0], f[1]);
  int64_t i64 = 0;
  uint64_t u64 = 0;
  if (download(outs[14], &i64, 8)) CHECK(i64 == INT64_MIN, "s64 constant %lld", (long long)i64);
  if (download(outs[15], &u64, 8)) CHECK(u64 == UINT64_MAX, "u64 constant %llu", (unsigned long long)u64);
  free_all(outs, nr);
}

/* Dense constants (nested brackets, bool, wrapped int8) and f16/bf16
 * literals the parser must round. */
static void test_dense_constants(void) {
  tpu_hlo *m = tpu_hlo_new();
  const int64_t d23[2] = {2, 3}, d2 = 2, one = 1;
  const int64_t v[6] = {1, -2, 3, 300, 0, -1}, bv[2] = {1, 0};
  tpu_hv hk[3] = {tpu_hlo_reshape(m, tpu_hlo_convert(m, tpu_hlo_constant(m, TPU_F16, 0.1), TPU_F32), 1, &one),
                  tpu_hlo_reshape(m, tpu_hlo_convert(m, tpu_hlo_constant(m, TPU_BF16, 0.1), TPU_F32), 1, &one),
                  tpu_hlo_reshape(m, tpu_hlo_convert(m, tpu_hlo_constant(m, TPU_F16, 65504), TPU_F32), 1, &one)};
  tpu_hv res[4] = {tpu_hlo_constant_ints(m, tpu_hlo_type_make(TPU_S8, 2, d23), v),
                   tpu_hlo_constant_ints(m, tpu_hlo_type_make(TPU_PRED, 1, &d2), bv),
                   tpu_hlo_constant_ints(m, tpu_hlo_type_make(TPU_U8, 1, &d2), bv), tpu_hlo_concat(m, hk, 3, 0)};
  tpu_rt_buffer *outs[4];
  if (run(m, res, 4, NULL, 0, outs, "dense constants")) {
    int8_t s8[6], w8[6] = {1, -2, 3, 44, 0, -1};
    uint8_t b[2], u[2];
    float f[3];
    if (download(outs[0], s8, 6)) CHECK(memcmp(s8, w8, 6) == 0, "s8 dense constant");
    if (download(outs[1], b, 2)) CHECK(b[0] == 1 && b[1] == 0, "pred dense constant %d %d", b[0], b[1]);
    if (download(outs[2], u, 2)) CHECK(u[0] == 1 && u[1] == 0, "u8 dense constant %d %d", u[0], u[1]);
    if (download(outs[3], f, 12))
      CHECK(fabsf(f[0] - 0.1f) < 1e-4f && fabsf(f[1] - 0.1f) < 1e-3f && f[2] == 65504.0f, "f16/bf16 literals %g %g %g",
            f[0], f[1], f[2]);
  }
  free_all(outs, 4);
}

static void test_dot_general(void) {
  /* [2,3] x [3,4] -> [2,4] */
  const int64_t da[2] = {2, 3}, db[2] = {3, 4};
  float a[6], b[12], c[8], want[8];
  for (int i = 0; i < 6; i++) a[i] = (float)(i + 1);
  for (int i = 0; i < 12; i++) b[i] = (float)(i % 5) - 2;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) {
      float s = 0;
      for (int k = 0; k < 3; k++) s += a[i * 3 + k] * b[k * 4 + j];
      want[i * 4 + j] = s;
    }
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv x = tpu_hlo_param(m, ty(TPU_F32, 2, da)), y = tpu_hlo_param(m, ty(TPU_F32, 2, db));
  int64_t lc = 1, rc = 0;
  tpu_hv r = tpu_hlo_dot_general(m, x, y, 0, NULL, NULL, 1, &lc, &rc, TPU_HLO_PREC_HIGHEST, TPU_INVALID);
  tpu_rt_buffer *args[2] = {upload(a, TPU_F32, 2, da), upload(b, TPU_F32, 2, db)}, *out;
  if (run(m, &r, 1, args, 2, &out, "dot_general") && download(out, c, sizeof c)) check_f32("matmul", c, want, 8, 0);
  tpu_rt_buffer_free(out);

  /* Batched: [2,2,3] x [2,3,2] contracting 2 with 1, batch 0 -> [2,2,2]; bf16
   * inputs, f32 result. */
  const int64_t dl[3] = {2, 2, 3}, dr[3] = {2, 3, 2};
  float l[12], rr[12], o[8], w[8];
  uint16_t lb[12], rb[12];
  for (int i = 0; i < 12; i++) {
    l[i] = (float)(i % 4);
    rr[i] = (float)(3 - i % 3);
    uint32_t bits;
    memcpy(&bits, &l[i], 4);
    lb[i] = (uint16_t)(bits >> 16);
    memcpy(&bits, &rr[i], 4);
    rb[i] = (uint16_t)(bits >> 16);
  }
  for (int bt = 0; bt < 2; bt++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++) {
        float s = 0;
        for (int k = 0; k < 3; k++) s += l[bt * 6 + i * 3 + k] * rr[bt * 6 + k * 2 + j];
        w[bt * 4 + i * 2 + j] = s;
      }
  m = tpu_hlo_new();
  x = tpu_hlo_param(m, ty(TPU_BF16, 3, dl));
  y = tpu_hlo_param(m, ty(TPU_BF16, 3, dr));
  int64_t bl = 0, brr = 0, lc2 = 2, rc2 = 1;
  r = tpu_hlo_dot_general(m, x, y, 1, &bl, &brr, 1, &lc2, &rc2, TPU_HLO_PREC_DEFAULT, TPU_F32);
  CHECK(tpu_hlo_typeof(m, r)->dtype == TPU_F32 && tpu_hlo_typeof(m, r)->rank == 3, "batched dot type");
  tpu_rt_buffer *args2[2] = {upload(lb, TPU_BF16, 3, dl), upload(rb, TPU_BF16, 3, dr)};
  if (run(m, &r, 1, args2, 2, &out, "batched dot_general") && download(out, o, sizeof o))
    check_f32("batched matmul", o, w, 8, 0);
  tpu_rt_buffer_free(out);
}

/* Variadic reduce: argmax along dim 1 of [2,4] (values, indices), and a
 * plain sum with an automatic body. */
static void test_reduce(void) {
  const int64_t d[2] = {2, 4};
  float v[8] = {3, 9, -1, 2, -5, -4, -7, -4.5f};
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv x = tpu_hlo_param(m, ty(TPU_F32, 2, d));
  tpu_hv idx = tpu_hlo_iota(m, ty(TPU_S32, 2, d), 1);
  tpu_hlo_type at[4] = {scalar(TPU_F32), scalar(TPU_S32), scalar(TPU_F32), scalar(TPU_S32)};
  tpu_hv ra[4];
  tpu_hlo_region_begin(m, at, 4, ra);
  tpu_hv take = tpu_hlo_compare(m, TPU_HLO_GT, ra[2], ra[0]);
  tpu_hv rres[2] = {tpu_hlo_select(m, take, ra[2], ra[0]), tpu_hlo_select(m, take, ra[3], ra[1])};
  int region = tpu_hlo_region_end(m, rres, 2);
  tpu_hv xs[2] = {x, idx}, inits[2] = {tpu_hlo_constant(m, TPU_F32, -INFINITY), tpu_hlo_constant_int(m, TPU_S32, 0)};
  int64_t dim = 1;
  tpu_hv outs[3];
  CHECK(tpu_hlo_reduce_region(m, xs, inits, 2, &dim, 1, region, outs), "reduce_region failed");
  int64_t dim0 = 0;
  outs[2] = tpu_hlo_reduce(m, x, tpu_hlo_constant(m, TPU_F32, 0), &dim0, 1, TPU_HLO_ADD);
  tpu_rt_buffer *args[1] = {upload(v, TPU_F32, 2, d)}, *bo[3];
  if (run(m, outs, 3, args, 1, bo, "reduce")) {
    float mx[2], sum[4], wmx[2] = {9, -4}, wsum[4] = {-2, 5, -8, -2.5f};
    int32_t am[2], wam[2] = {1, 1};
    if (download(bo[0], mx, sizeof mx)) check_f32("max", mx, wmx, 2, 0);
    if (download(bo[1], am, sizeof am)) check_i32("argmax", am, wam, 2);
    if (download(bo[2], sum, sizeof sum)) check_f32("sum", sum, wsum, 4, 0);
  }
  free_all(bo, 3);
}

/* Embedding-style gather: rows [2, 0, 3] of a [4,3] table. */
static void test_gather(void) {
  const int64_t dt[2] = {4, 3}, di = 3;
  float table[12];
  for (int i = 0; i < 12; i++) table[i] = (float)(10 * (i / 3) + i % 3);
  int32_t ids[3] = {2, 0, 3};
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv t = tpu_hlo_param(m, ty(TPU_F32, 2, dt)), ix = tpu_hlo_param(m, ty(TPU_S32, 1, &di));
  tpu_hlo_gather_dims g;
  memset(&g, 0, sizeof g);
  g.n_offset = 1;
  g.offset_dims[0] = 1;
  g.n_collapsed = 1;
  g.collapsed_slice_dims[0] = 0;
  g.n_start_index_map = 1;
  g.start_index_map[0] = 0;
  g.index_vector_dim = 1;
  int64_t sizes[2] = {1, 3}, rd[2] = {3, 3};
  tpu_hv r = tpu_hlo_gather(m, t, ix, &g, sizes, ty(TPU_F32, 2, rd));
  tpu_rt_buffer *args[2] = {upload(table, TPU_F32, 2, dt), upload(ids, TPU_S32, 1, &di)}, *out;
  float got[9], want[9] = {20, 21, 22, 0, 1, 2, 30, 31, 32};
  if (run(m, &r, 1, args, 2, &out, "gather") && download(out, got, sizeof got)) check_f32("gather", got, want, 9, 0);
  tpu_rt_buffer_free(out);
}

/* Scatter-add with duplicate indices into zeros[5], and scatter-replace with
 * the automatic body. */
static void test_scatter(void) {
  const int64_t dn = 5, di[2] = {3, 1}, du = 3;
  float base[5] = {1, 1, 1, 1, 1}, upd[3] = {10, 20, 30};
  int32_t ids[3] = {4, 1, 4};
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv op = tpu_hlo_param(m, ty(TPU_F32, 1, &dn)), ix = tpu_hlo_param(m, ty(TPU_S32, 2, di)),
         up = tpu_hlo_param(m, ty(TPU_F32, 1, &du));
  tpu_hlo_scatter_dims d;
  memset(&d, 0, sizeof d);
  d.n_inserted = 1;
  d.inserted_window_dims[0] = 0;
  d.n_scatter_to_operand = 1;
  d.scatter_dims_to_operand_dims[0] = 0;
  d.index_vector_dim = 1;
  tpu_hlo_type st[2] = {scalar(TPU_F32), scalar(TPU_F32)};
  tpu_hv ra[2];
  tpu_hlo_region_begin(m, st, 2, ra);
  tpu_hv s = tpu_hlo_binary(m, TPU_HLO_ADD, ra[0], ra[1]);
  int region = tpu_hlo_region_end(m, &s, 1);
  tpu_hv res[2] = {tpu_hlo_scatter(m, op, ix, up, &d, region), TPU_HV_NONE};
  /* Replace: unique indices only (duplicates would be unordered). */
  const int64_t di2[2] = {2, 1}, du2 = 2;
  tpu_hv ix2 = tpu_hlo_param(m, ty(TPU_S32, 2, di2)), up2 = tpu_hlo_param(m, ty(TPU_F32, 1, &du2));
  res[1] = tpu_hlo_scatter(m, op, ix2, up2, &d, -1);
  int32_t ids2[2] = {0, 3};
  float upd2[2] = {-7, 8};
  tpu_rt_buffer *args[5] = {upload(base, TPU_F32, 1, &dn), upload(ids, TPU_S32, 2, di), upload(upd, TPU_F32, 1, &du),
                            upload(ids2, TPU_S32, 2, di2), upload(upd2, TPU_F32, 1, &du2)},
                *outs[2];
  if (run(m, res, 2, args, 5, outs, "scatter")) {
    float got[5], want[5] = {1, 21, 1, 1, 41}, want2[5] = {-7, 1, 1, 8, 1};
    if (download(outs[0], got, sizeof got)) check_f32("scatter add", got, want, 5, 0);
    if (download(outs[1], got, sizeof got)) check_f32("scatter replace", got, want2, 5, 0);
  }
  free_all(outs, 2);
}

/* Stable sort of values with their indices along dim 1 of [2,5]. */
static void test_sort(void) {
  const int64_t d[2] = {2, 5};
  float v[10] = {3, 1, 2, 1, -5, 0.5f, 0.25f, 9, -1, 0.25f};
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv x = tpu_hlo_param(m, ty(TPU_F32, 2, d));
  tpu_hv ix = tpu_hlo_iota(m, ty(TPU_S32, 2, d), 1);
  tpu_hlo_type ct[4] = {scalar(TPU_F32), scalar(TPU_F32), scalar(TPU_S32), scalar(TPU_S32)};
  tpu_hv ca[4];
  tpu_hlo_region_begin(m, ct, 4, ca);
  tpu_hv lt = tpu_hlo_compare(m, TPU_HLO_LT, ca[0], ca[1]);
  int region = tpu_hlo_region_end(m, &lt, 1);
  tpu_hv xs[2] = {x, ix}, outs[2];
  CHECK(tpu_hlo_sort(m, xs, 2, 1, true, region, outs), "sort failed");
  tpu_rt_buffer *args[1] = {upload(v, TPU_F32, 2, d)}, *bo[2];
  if (run(m, outs, 2, args, 1, bo, "sort")) {
    float got[10], want[10] = {-5, 1, 1, 2, 3, -1, 0.25f, 0.25f, 0.5f, 9};
    int32_t gi[10], wi[10] = {4, 1, 3, 2, 0, 3, 1, 4, 0, 2};
    if (download(bo[0], got, sizeof got)) check_f32("sort values", got, want, 10, 0);
    if (download(bo[1], gi, sizeof gi)) check_i32("sort indices (stable)", gi, wi, 10);
  }
  free_all(bo, 2);
}

static void test_rng(void) {
  const int64_t ds = 2, db = 64;
  tpu_hlo_type bits = ty(TPU_U32, 1, &db);
  uint64_t states[2][2] = {{42, 0}, {43, 0}};
  uint32_t got[3][64];
  uint64_t ns[3][2];
  for (int run_i = 0; run_i < 3; run_i++) {
    tpu_hlo *m = tpu_hlo_new();
    tpu_hv s = tpu_hlo_param(m, ty(TPU_U64, 1, &ds)), news = TPU_HV_NONE;
    tpu_hv r = tpu_hlo_rng_bit_generator(m, s, bits, &news);
    tpu_hv res[2] = {r, news};
    tpu_rt_buffer *args[1] = {upload(states[run_i == 2], TPU_U64, 1, &ds)}, *outs[2];
    memset(got[run_i], 0, sizeof got[run_i]);
    memset(ns[run_i], 0, sizeof ns[run_i]);
    if (run(m, res, 2, args, 1, outs, "rng_bit_generator")) {
      download(outs[0], got[run_i], sizeof got[run_i]);
      download(outs[1], ns[run_i], sizeof ns[run_i]);
    }
    free_all(outs, 2);
  }
  CHECK(memcmp(got[0], got[1], sizeof got[0]) == 0, "rng: same state, different bits");
  CHECK(memcmp(got[0], got[2], sizeof got[0]) != 0, "rng: different state, same bits");
  CHECK(memcmp(ns[0], states[0], sizeof ns[0]) != 0, "rng: state did not advance");
  int distinct = 0, ones = 0;
  for (int i = 0; i < 64; i++) {
    distinct += i == 0 || got[0][i] != got[0][i - 1];
    ones += __builtin_popcount(got[0][i]);
  }
  CHECK(distinct > 60 && ones > 800 && ones < 1250, "rng: bits look wrong (%d distinct, %d ones)", distinct, ones);
}

/* 2-d convolution, NCHW / OIHW: [1,2,5,5] * [3,2,3,3], padding 1, stride 2,
 * and a grouped one (feature_groups 2) with rhs dilation. */
static void conv_ref(const float *in, const float *k, float *out, int C, int H, int W, int O, int KH, int KW,
                     int stride, int pad, int dil, int groups, int OH, int OW) {
  int cg = C / groups, og = O / groups;
  for (int o = 0; o < O; o++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        float s = 0;
        int g = o / og;
        for (int c = 0; c < cg; c++)
          for (int kh = 0; kh < KH; kh++)
            for (int kw = 0; kw < KW; kw++) {
              int ih = oh * stride - pad + kh * dil, iw = ow * stride - pad + kw * dil;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              s += in[((g * cg + c) * H + ih) * W + iw] * k[((o * cg + c) * KH + kh) * KW + kw];
            }
        out[(o * OH + oh) * OW + ow] = s;
      }
}

static void test_convolution(void) {
  const int64_t di[4] = {1, 2, 5, 5}, dk[4] = {3, 2, 3, 3}, dk2[4] = {4, 1, 2, 2};
  float in[50], k[54], k2[16], got[3 * 3 * 3], want[3 * 3 * 3], got2[4 * 3 * 3], want2[4 * 3 * 3];
  for (int i = 0; i < 50; i++) in[i] = (float)((i * 7) % 11) - 5;
  for (int i = 0; i < 54; i++) k[i] = (float)((i * 5) % 7) - 3;
  for (int i = 0; i < 16; i++) k2[i] = (float)(i % 3) - 1;
  conv_ref(in, k, want, 2, 5, 5, 3, 3, 3, 2, 1, 1, 1, 3, 3);
  conv_ref(in, k2, want2, 2, 5, 5, 4, 2, 2, 1, 0, 2, 2, 3, 3);
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv x = tpu_hlo_param(m, ty(TPU_F32, 4, di)), w = tpu_hlo_param(m, ty(TPU_F32, 4, dk)),
         w2 = tpu_hlo_param(m, ty(TPU_F32, 4, dk2));
  int64_t st[2] = {2, 2}, pad[4] = {1, 1, 1, 1}, rdil[2] = {2, 2};
  tpu_hv res[2] = {tpu_hlo_convolution(m, x, w, 2, st, pad, NULL, NULL, 1, 1, TPU_HLO_PREC_HIGHEST),
                   tpu_hlo_convolution(m, x, w2, 2, NULL, NULL, NULL, rdil, 2, 1, TPU_HLO_PREC_HIGHEST)};
  const tpu_hlo_type *t0 = tpu_hlo_typeof(m, res[0]), *t1 = tpu_hlo_typeof(m, res[1]);
  CHECK(t0->rank == 4 && t0->dims[1] == 3 && t0->dims[2] == 3 && t0->dims[3] == 3, "conv result shape");
  CHECK(t1->rank == 4 && t1->dims[1] == 4 && t1->dims[2] == 3 && t1->dims[3] == 3, "grouped conv result shape");
  tpu_rt_buffer *args[3] = {upload(in, TPU_F32, 4, di), upload(k, TPU_F32, 4, dk), upload(k2, TPU_F32, 4, dk2)},
                *outs[2];
  if (run(m, res, 2, args, 3, outs, "convolution")) {
    if (download(outs[0], got, sizeof got)) check_f32("conv2d", got, want, 27, 1e-6);
    if (download(outs[1], got2, sizeof got2)) check_f32("grouped dilated conv2d", got2, want2, 36, 1e-6);
  }
  free_all(outs, 2);
}

/* Max pool 2x2 stride 2 on [1,1,4,4], and a padded 3x3 stride 1 sum pool. */
static void test_reduce_window(void) {
  const int64_t d[4] = {1, 1, 4, 4};
  float v[16];
  for (int i = 0; i < 16; i++) v[i] = (float)((i * 7) % 16) - 8;
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv x = tpu_hlo_param(m, ty(TPU_F32, 4, d));
  tpu_hlo_type st[2] = {scalar(TPU_F32), scalar(TPU_F32)};
  tpu_hv ra[2];
  tpu_hlo_region_begin(m, st, 2, ra);
  tpu_hv mx = tpu_hlo_binary(m, TPU_HLO_MAX, ra[0], ra[1]);
  int region = tpu_hlo_region_end(m, &mx, 1);
  int64_t win[4] = {1, 1, 2, 2}, strides[4] = {1, 1, 2, 2};
  tpu_hv init = tpu_hlo_constant(m, TPU_F32, -INFINITY), res[2];
  CHECK(tpu_hlo_reduce_window(m, &x, &init, 1, win, strides, NULL, NULL, NULL, region, &res[0]), "max pool");
  tpu_hlo_region_begin(m, st, 2, ra);
  tpu_hv sm = tpu_hlo_binary(m, TPU_HLO_ADD, ra[0], ra[1]);
  region = tpu_hlo_region_end(m, &sm, 1);
  int64_t win3[4] = {1, 1, 3, 3}, pad[8] = {0, 0, 0, 0, 1, 1, 1, 1};
  tpu_hv zero = tpu_hlo_constant(m, TPU_F32, 0);
  CHECK(tpu_hlo_reduce_window(m, &x, &zero, 1, win3, NULL, NULL, NULL, pad, region, &res[1]), "sum pool");
  tpu_rt_buffer *args[1] = {upload(v, TPU_F32, 4, d)}, *outs[2];
  if (run(m, res, 2, args, 1, outs, "reduce_window")) {
    float got[4], want[4], got2[16], want2[16];
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++) {
        float best = -INFINITY;
        for (int a = 0; a < 2; a++)
          for (int b = 0; b < 2; b++) best = fmaxf(best, v[(2 * i + a) * 4 + 2 * j + b]);
        want[i * 2 + j] = best;
      }
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) {
        float s = 0;
        for (int a = -1; a <= 1; a++)
          for (int b = -1; b <= 1; b++)
            if (i + a >= 0 && i + a < 4 && j + b >= 0 && j + b < 4) s += v[(i + a) * 4 + j + b];
        want2[i * 4 + j] = s;
      }
    if (download(outs[0], got, sizeof got)) check_f32("max pool", got, want, 4, 0);
    if (download(outs[1], got2, sizeof got2)) check_f32("sum pool", got2, want2, 16, 0);
  }
  free_all(outs, 2);
}

/* A donated-parameter alias: the attribute must parse and the program run
 * (inputs are not donated by tpu_rt_execute, so XLA copies). */
/* x + 1 on f32[3], its parameter aliased to its output; *r: the result. */
static tpu_hlo *alias_program(tpu_hv *r) {
  const int64_t n = 3;
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv p = tpu_hlo_param(m, ty(TPU_F32, 1, &n));
  *r = tpu_hlo_binary(m, TPU_HLO_ADD, p, tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant(m, TPU_F32, 1), 1, &n, NULL));
  tpu_hlo_param_alias(m, p, 0);
  return m;
}

static void test_alias(void) {
  const int64_t n = 3;
  float x[3] = {1, 2, 3}, got[3], want[3] = {2, 3, 4};
  tpu_hv r;
  tpu_hlo *m = alias_program(&r);
  tpu_rt_buffer *in = upload(x, TPU_F32, 1, &n), *args[1] = {in}, *out;
  if (run(m, &r, 1, args, 1, &out, "alias") && download(out, got, sizeof got)) check_f32("alias", got, want, 3, 0);
  tpu_rt_buffer_free(out);
}

/* tpu_rt_execute_keep donates nothing, even where the program aliases an
 * input: the input stays readable and unchanged; the launch is asynchronous. */
static void test_alias_keep(void) {
  const int64_t n = 3;
  float x[3] = {1, 2, 3}, got[3], want[3] = {2, 3, 4};
  tpu_hv r;
  tpu_hlo *m = alias_program(&r);
  tpu_rt_exec *e = compile(m, &r, 1, "alias keep");
  tpu_rt_buffer *in = upload(x, TPU_F32, 1, &n), *out = NULL;
  tpu_rt_event *ev = NULL;
  if (e && in && OK(tpu_rt_execute_keep(rt, e, &in, 1, &out, &ev), "alias keep launch") &&
      OK(tpu_rt_event_wait(rt, ev), "alias keep wait")) {
    if (download(out, got, sizeof got)) check_f32("alias keep output", got, want, 3, 0);
    if (download(in, got, sizeof got)) check_f32("alias keep input", got, x, 3, 0);
  }
  tpu_rt_buffer_free(out);
  tpu_rt_buffer_free(in);
  tpu_rt_exec_free(e);
}

/* SPMD text on one device: both partitioners' shardings (a mesh of one
 * device, as tpu_rt_compile compiles for one) parse, compile and run. The
 * partitioning itself needs a runtime compiling for several devices. */
static void test_sharded_text(void) {
  for (int p = TPU_HLO_GSPMD; p <= TPU_HLO_SHARDY; p++) {
    const char *name = p == TPU_HLO_GSPMD ? "gspmd text" : "shardy text";
    const int64_t n = 4, mesh = 1;
    const int8_t split[1] = {0};
    float x[4] = {1, 2, 3, 4}, y[4] = {10, 20, 30, 40}, got[4], want[4] = {11, 22, 33, 44};
    tpu_hlo *m = tpu_hlo_new();
    const char *names[1] = {"x"};
    tpu_hlo_set_mesh(m, (tpu_hlo_partitioner)p, 1, &mesh, p == TPU_HLO_SHARDY ? names : NULL);
    tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, &n)), b = tpu_hlo_param(m, ty(TPU_F32, 1, &n));
    tpu_sharding s = tpu_sharding_make(1, &mesh, 1, split), rep = tpu_sharding_make(1, &mesh, 1, NULL);
    tpu_hlo_param_sharding(m, a, &s);
    tpu_hlo_param_sharding(m, b, &rep);
    tpu_hv r = tpu_hlo_sharding_constraint(m, tpu_hlo_binary(m, TPU_HLO_ADD, a, b), &s);
    tpu_hlo_result_sharding(m, 0, &s);
    tpu_rt_buffer *args[2] = {upload(x, TPU_F32, 1, &n), upload(y, TPU_F32, 1, &n)}, *out;
    if (run(m, &r, 1, args, 2, &out, name) && download(out, got, sizeof got)) check_f32(name, got, want, 4, 0);
    tpu_rt_buffer_free(out);
  }
}

static void test_bad_program(void) {
  static const char bad[] = "module @m {\n  func.func public @main() -> () {\n    \"stablehlo.nonsense\"(%x) : \n";
  tpu_rt_exec *e = (tpu_rt_exec *)1;
  tpu_status *s = tpu_rt_compile(rt, bad, sizeof bad - 1, &e);
  CHECK(s != NULL && e == NULL, "a bad program compiled");
  if (s) {
    const char *msg = tpu_status_message(s);
    CHECK(tpu_status_code(s) == TPU_ERR_RUNTIME, "code %d", tpu_status_code(s));
    CHECK(strncmp(msg, "PJRT_Client_Compile: ", 21) == 0 && strlen(msg) > 30, "message: %s", msg);
    printf("bad program -> %.160s%s\n", msg, strlen(msg) > 160 ? "..." : "");
    tpu_status_free(s);
  }
  /* A well-formed module of the wrong types: the verifier's message. */
  static const char badtype[] =
      "module @m {\n  func.func public @main(%a: tensor<2xf32>) -> tensor<3xf32> {\n"
      "    \"func.return\"(%a) : (tensor<2xf32>) -> ()\n  }\n}\n";
  s = tpu_rt_compile(rt, badtype, sizeof badtype - 1, &e);
  CHECK(s != NULL && e == NULL, "a mistyped program compiled");
  tpu_status_free(s);
  /* Executing with the wrong argument count is an error, not a crash. */
  const int64_t n = 2;
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, &n));
  tpu_hv r = tpu_hlo_unary(m, TPU_HLO_NEG, a);
  e = compile(m, &r, 1, "neg");
  if (e) {
    tpu_rt_buffer *out = NULL;
    s = tpu_rt_execute(rt, e, NULL, 0, &out);
    CHECK(s != NULL && out == NULL, "executing with no arguments succeeded");
    tpu_status_free(s);
    tpu_rt_buffer_free(out);
  }
  tpu_rt_exec_free(e);
}

static void test_serialize(void) {
  const int64_t n = 4;
  float x[4] = {1, -2, 3, -4}, got[4], want[4] = {2, -4, 6, -8};
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, &n));
  tpu_hv r = tpu_hlo_binary(m, TPU_HLO_ADD, a, a);
  tpu_rt_exec *e = compile(m, &r, 1, "serialize source");
  if (!e) return;
  void *bytes = NULL;
  size_t len = 0;
  tpu_status *s = tpu_rt_exec_serialize(rt, e, &bytes, &len);
  tpu_rt_exec_free(e);
  if (s && tpu_status_code(s) == TPU_ERR_UNIMPLEMENTED) {
    printf("serialize: UNIMPLEMENTED (%s)\n", tpu_status_message(s));
    tpu_status_free(s);
    return;
  }
  if (!OK(s, "serialize")) return;
  CHECK(bytes && len > 0, "serialized %zu bytes", len);
  tpu_rt_exec *d = NULL;
  s = tpu_rt_exec_deserialize(rt, bytes, len, &d);
  free(bytes);
  if (s && tpu_status_code(s) == TPU_ERR_UNIMPLEMENTED) {
    printf("deserialize: UNIMPLEMENTED (%s)\n", tpu_status_message(s));
    tpu_status_free(s);
    return;
  }
  if (!OK(s, "deserialize")) return;
  CHECK(tpu_rt_exec_num_outputs(d) == 1, "deserialized: %d outputs", tpu_rt_exec_num_outputs(d));
  tpu_rt_buffer *in = upload(x, TPU_F32, 1, &n), *out = NULL;
  if (in && OK(tpu_rt_execute(rt, d, &in, 1, &out), "execute deserialized") && download(out, got, sizeof got)) {
    check_f32("deserialized run", got, want, 4, 0);
    printf("serialize: %zu bytes; deserialized executable ran\n", len);
  }
  tpu_rt_buffer_free(out);
  tpu_rt_buffer_free(in);
  tpu_rt_exec_free(d);
  /* Garbage bytes are an error. */
  s = tpu_rt_exec_deserialize(rt, "not an executable", 17, &d);
  CHECK(s != NULL && d == NULL, "garbage deserialized");
  tpu_status_free(s);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PJRT_PLUGIN.so\n", argv[0]);
    return 2;
  }
  test_open_errors();
  tpu_rt_options o = {argv[1], "cpu", 1, 0, 1}; /* programs compile at optimization level 1, as by default */
  if (!OK(tpu_rt_open(&o, &rt), "tpu_rt_open")) {
    printf("%d passed, %d failed\n", passed, failed);
    return 1;
  }
  test_info();
  test_dtype_roundtrips();
  test_add();
  test_add_text();
  test_host_memory();
  test_on_ready();
  test_bad_buffers();
  test_elementwise();
  test_shapes_and_constants();
  test_dense_constants();
  test_dot_general();
  test_reduce();
  test_gather();
  test_scatter();
  test_sort();
  test_extern_call();
  test_rng();
  test_convolution();
  test_reduce_window();
  test_alias();
  test_alias_keep();
  test_sharded_text();
  test_bad_program();
  test_serialize();
  CHECK(tpu_rt_live_buffers(rt) == 0, "%lld live buffers", (long long)tpu_rt_live_buffers(rt));
  CHECK(tpu_rt_live_execs(rt) == 0, "%lld live executables", (long long)tpu_rt_live_execs(rt));
  tpu_rt_close(rt);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
