/* test_devices.c: the runtime over several devices of one client (argv[1],
 * opened with 4 devices): uploads to a named device, one-device programs run
 * where their arguments are, copies between devices, per-device byte counts,
 * programs of 4 replicas (the collectives) and of 4 partitions (an SPMD
 * program partitioned by XLA from sharding annotations). Hand-written text,
 * so the runtime is checked apart from the builder. The last line is
 * "N passed, M failed"; the exit status is non-zero on any failure.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

#include "check.h"
#include "check_status.h"

enum { NDEV = 4 };
static tpu_rt *rt;


/* An error whose message holds `needle`. */
static void fails_with(tpu_status *s, const char *needle, const char *what) {
  CHECK(s != NULL, "%s: expected an error", what);
  if (s) {
    CHECK(strstr(tpu_status_message(s), needle) != NULL, "%s: message %s lacks '%s'", what, tpu_status_message(s),
          needle);
    tpu_status_free(s);
  }
}

static tpu_rt_buffer *up(int dev, const float *v, int64_t n) {
  tpu_rt_buffer *b = NULL;
  OK(tpu_rt_buffer_from_host_on(rt, dev, v, TPU_F32, &n, 1, &b), "upload");
  return b;
}

static bool same(const float *got, const float *want, int n, const char *what) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) {
      CHECK(false, "%s: element %d is %g, expected %g", what, i, (double)got[i], (double)want[i]);
      return false;
    }
  passed++;
  return true;
}

static tpu_rt_exec *compile(const char *text, const tpu_rt_compile_opts *o) {
  tpu_rt_exec *e = NULL;
  if (!OK(tpu_rt_compile_with(rt, text, strlen(text), o, &e), "compile")) return NULL;
  return e;
}

static const char *add_text =
    "func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = stablehlo.add %a, %b : tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";

static void test_one_device_programs(void) {
  CHECK(tpu_rt_device_count(rt) == NDEV, "%d devices", tpu_rt_device_count(rt));
  float x[4] = {1, 2, 3, 4}, y[4] = {10, 20, 30, 40}, want[4] = {11, 22, 33, 44}, got[4];
  tpu_rt_exec *e = compile(add_text, NULL);
  if (!e) return;
  CHECK(tpu_rt_exec_rows(e) == 1, "a one-device program has %d rows", tpu_rt_exec_rows(e));
  for (int d = 0; d < NDEV; d++) {
    tpu_rt_buffer *a = up(d, x, 4), *b = up(d, y, 4), *args[2] = {a, b}, *out = NULL;
    CHECK(tpu_rt_buffer_device(a) == d, "uploaded to device %d, found on %d", d, tpu_rt_buffer_device(a));
    if (OK(tpu_rt_execute(rt, e, args, 2, &out), "execute on the arguments' device")) {
      CHECK(tpu_rt_buffer_device(out) == d, "output on device %d, expected %d", tpu_rt_buffer_device(out), d);
      if (OK(tpu_rt_buffer_to_host(rt, out, got, sizeof got), "download")) same(got, want, 4, "add on a device");
    }
    tpu_rt_buffer_free(out);
    tpu_rt_buffer_free(a);
    tpu_rt_buffer_free(b);
  }
  /* arguments on two devices: an error naming them, not a crash */
  tpu_rt_buffer *a = up(1, x, 4), *b = up(2, y, 4), *args[2] = {a, b}, *out = NULL;
  fails_with(tpu_rt_execute(rt, e, args, 2, &out), "argument 1 is on device 2", "mixed devices");
  fails_with(tpu_rt_execute_on(rt, e, 7, args, 2, &out, NULL, false), "device 7 of 4", "device out of range");
  /* a copy moves a buffer; its bytes count on its new device */
  int64_t before = tpu_rt_device_live_bytes(rt, 3);
  tpu_rt_buffer *c = NULL;
  if (OK(tpu_rt_buffer_copy(rt, b, 3, &c), "copy to device 3")) {
    CHECK(tpu_rt_buffer_device(c) == 3, "copy on device %d", tpu_rt_buffer_device(c));
    CHECK(tpu_rt_device_live_bytes(rt, 3) == before + 16, "device 3 holds %lld bytes, expected %lld",
          (long long)tpu_rt_device_live_bytes(rt, 3), (long long)before + 16);
    if (OK(tpu_rt_buffer_to_host(rt, c, got, sizeof got), "download the copy")) same(got, y, 4, "copy");
  }
  tpu_rt_buffer_free(c);
  CHECK(tpu_rt_device_live_bytes(rt, 3) == before, "device 3's bytes after the free: %lld",
        (long long)tpu_rt_device_live_bytes(rt, 3));
  tpu_rt_buffer_free(a);
  tpu_rt_buffer_free(b);
  fails_with(tpu_rt_buffer_from_host_on(rt, NDEV, x, TPU_F32, (int64_t[]){4}, 1, &a), "device 4 of 4",
             "upload out of range");
  tpu_rt_exec_free(e);
}

/* One all_reduce over 4 replicas: every device gets the sum of all rows. */
static const char *allreduce_text =
    "module attributes {mhlo.num_replicas = 4 : i32, mhlo.num_partitions = 1 : i32} {\n"
    "func.func @main(%a: tensor<4xf32>) -> (tensor<4xf32>, tensor<ui32>) {\n"
    "  %0 = \"stablehlo.all_reduce\"(%a) ({\n"
    "  ^bb0(%x: tensor<f32>, %y: tensor<f32>):\n"
    "    %s = stablehlo.add %x, %y : tensor<f32>\n"
    "    stablehlo.return %s : tensor<f32>\n"
    "  }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<4xf32>) -> tensor<4xf32>\n"
    "  %1 = stablehlo.replica_id : tensor<ui32>\n"
    "  return %0, %1 : tensor<4xf32>, tensor<ui32>\n"
    "}\n"
    "}\n";

static void test_replicas(void) {
  tpu_rt_compile_opts o = {.replicas = NDEV, .partitions = 1};
  tpu_rt_exec *e = compile(allreduce_text, &o);
  if (!e) return;
  CHECK(tpu_rt_exec_rows(e) == NDEV, "%d rows", tpu_rt_exec_rows(e));
  tpu_rt_buffer *args[NDEV] = {0}, *outs[2 * NDEV] = {0};
  float want[4] = {0};
  for (int r = 0; r < NDEV; r++) {
    float v[4];
    for (int i = 0; i < 4; i++) want[i] += v[i] = (float)(100 * r + i);
    args[r] = up(tpu_rt_exec_row_device(e, r), v, 4);
  }
  if (OK(tpu_rt_execute_rows(rt, e, args, 1, outs), "execute 4 replicas")) {
    for (int r = 0; r < NDEV; r++) {
      float got[4];
      uint32_t id = 99;
      CHECK(tpu_rt_buffer_device(outs[2 * r]) == tpu_rt_exec_row_device(e, r), "row %d's output on device %d", r,
            tpu_rt_buffer_device(outs[2 * r]));
      if (OK(tpu_rt_buffer_to_host(rt, outs[2 * r], got, sizeof got), "download")) same(got, want, 4, "all_reduce");
      if (OK(tpu_rt_buffer_to_host(rt, outs[2 * r + 1], &id, sizeof id), "download the replica id"))
        CHECK(id == (uint32_t)r, "row %d has replica id %u", r, id);
    }
  }
  for (int k = 0; k < 2 * NDEV; k++) tpu_rt_buffer_free(outs[k]);
  /* a row's argument on another device is refused */
  tpu_rt_buffer *t = args[0];
  args[0] = args[1];
  fails_with(tpu_rt_execute_rows(rt, e, args, 1, outs), "row 0 is on device", "a row on the wrong device");
  args[0] = t;
  /* and a one-row launch of a 4-row program */
  fails_with(tpu_rt_execute(rt, e, args, 1, outs), "one argument list each", "one row of four");
  for (int r = 0; r < NDEV; r++) tpu_rt_buffer_free(args[r]);
  tpu_rt_exec_free(e);
  /* more rows than devices */
  tpu_rt_compile_opts big = {.replicas = 8};
  tpu_rt_exec *x = NULL;
  fails_with(tpu_rt_compile_with(rt, allreduce_text, strlen(allreduce_text), &big, &x), "over 8 devices",
             "8 replicas on 4 devices");
}

/* A program written for the whole array, partitioned by XLA: the input is
 * split in 4, the sum is replicated, 2x stays split; the two partitioners'
 * texts differ only in their annotations. */
#define SPMD_BODY                                                                   \
  "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"                            \
  "  %s = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = " \
  "[0] : (tensor<16xf32>, tensor<f32>) -> tensor<f32>\n"                            \
  "  %d = stablehlo.add %a, %a : tensor<16xf32>\n"                                  \
  "  return %s, %d : tensor<f32>, tensor<16xf32>\n"                                 \
  "}\n"                                                                             \
  "}\n"
#define SPMD_HEAD "module attributes {mhlo.num_replicas = 1 : i32, mhlo.num_partitions = 4 : i32} {\n"

static const char *spmd_gspmd = SPMD_HEAD
    "func.func @main(%a: tensor<16xf32> {mhlo.sharding = \"{devices=[4]0,1,2,3}\"}) -> "
    "(tensor<f32> {mhlo.sharding = \"{replicated}\"}, tensor<16xf32> {mhlo.sharding = \"{devices=[4]0,1,2,3}\"}) {\n" SPMD_BODY;

static const char *spmd_shardy = SPMD_HEAD
    "sdy.mesh @mesh = <[\"x\"=4]>\n"
    "func.func @main(%a: tensor<16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"x\"}]>}) -> "
    "(tensor<f32> {sdy.sharding = #sdy.sharding<@mesh, []>}, "
    "tensor<16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"x\"}]>}) {\n" SPMD_BODY;

static void test_partitions(const char *text, bool shardy) {
  const char *name = shardy ? "Shardy" : "GSPMD";
  tpu_rt_compile_opts o = {.replicas = 1, .partitions = NDEV, .spmd = true, .shardy = shardy};
  tpu_rt_exec *e = compile(text, &o);
  if (!e) return;
  CHECK(tpu_rt_exec_rows(e) == NDEV, "%s: %d rows", name, tpu_rt_exec_rows(e));
  tpu_rt_buffer *args[NDEV] = {0}, *outs[2 * NDEV] = {0};
  float total = 0;
  for (int r = 0; r < NDEV; r++) {
    float v[4];
    for (int i = 0; i < 4; i++) total += v[i] = (float)(4 * r + i);
    args[r] = up(tpu_rt_exec_row_device(e, r), v, 4);
  }
  if (OK(tpu_rt_execute_rows(rt, e, args, 1, outs), "execute 4 partitions")) {
    for (int r = 0; r < NDEV; r++) {
      float sum = -1, twice[4], want[4];
      for (int i = 0; i < 4; i++) want[i] = 2.0f * (float)(4 * r + i);
      CHECK(tpu_rt_buffer_rank(outs[2 * r + 1]) == 1 && tpu_rt_buffer_dims(outs[2 * r + 1])[0] == 4,
            "%s: row %d's shard has %lld elements", name, r, (long long)tpu_rt_buffer_dims(outs[2 * r + 1])[0]);
      if (OK(tpu_rt_buffer_to_host(rt, outs[2 * r], &sum, sizeof sum), "download the sum"))
        CHECK(sum == total, "%s: row %d's sum %g, expected %g", name, r, (double)sum, (double)total);
      if (OK(tpu_rt_buffer_to_host(rt, outs[2 * r + 1], twice, sizeof twice), "download the shard"))
        same(twice, want, 4, "2x, partitioned");
    }
  }
  for (int k = 0; k < 2 * NDEV; k++) tpu_rt_buffer_free(outs[k]);
  for (int r = 0; r < NDEV; r++) tpu_rt_buffer_free(args[r]);
  tpu_rt_exec_free(e);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PJRT_PLUGIN.so\n", argv[0]);
    return 2;
  }
  tpu_rt_options o = {argv[1], "cpu", NDEV, 0, 0};
  if (!OK(tpu_rt_open(&o, &rt), "tpu_rt_open")) {
    printf("%d passed, %d failed\n", passed, failed);
    return 1;
  }
  test_one_device_programs();
  test_replicas();
  test_partitions(spmd_gspmd, false);
  test_partitions(spmd_shardy, true);
  CHECK(tpu_rt_live_buffers(rt) == 0, "%lld buffers leaked", (long long)tpu_rt_live_buffers(rt));
  CHECK(tpu_rt_live_execs(rt) == 0, "%lld executables leaked", (long long)tpu_rt_live_execs(rt));
  tpu_rt_close(rt);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
