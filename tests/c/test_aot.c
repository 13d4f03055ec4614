/* test_aot.c: the compile-only TPU target (csrc/runtime/aot.c) against libtpu
 * (argv[1]): topology names, the compiler's numbers for small programs (an
 * add, a matmul), a program too big for a chip's memory, a bad program,
 * determinism of the serialized executable, a program partitioned over the
 * topology's four chips. No TPU is needed: nothing runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hlo/hlo.h"
#include "runtime/aot.h"

#include "check.h"

static const char add_prog[] =
    "module @add {\n"
    "  func.func public @main(%a: tensor<128x128xf32>) -> tensor<128x128xf32> {\n"
    "    %0 = stablehlo.add %a, %a : tensor<128x128xf32>\n"
    "    return %0 : tensor<128x128xf32>\n"
    "  }\n"
    "}\n";

static const char dot_prog[] =
    "module @dot {\n"
    "  func.func public @main(%a: tensor<256x512xf32>, %b: tensor<512x64xf32>) -> tensor<256x64xf32> {\n"
    "    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<256x512xf32>, "
    "tensor<512x64xf32>) -> tensor<256x64xf32>\n"
    "    return %0 : tensor<256x64xf32>\n"
    "  }\n"
    "}\n";

/* 8192 x 1048576 f32: 32 GiB each for the argument and the result. */
static const char big_prog[] =
    "module @big {\n"
    "  func.func public @main(%a: tensor<8192x1048576xf32>) -> tensor<8192x1048576xf32> {\n"
    "    %0 = stablehlo.add %a, %a : tensor<8192x1048576xf32>\n"
    "    return %0 : tensor<8192x1048576xf32>\n"
    "  }\n"
    "}\n";

static const char bad_prog[] =
    "module @bad {\n  func.func public @main() -> tensor<f32> {\n    return %x : tensor<f32>\n  }\n}\n";

/* Rows split over 4 chips (GSPMD annotations), the weight replicated. */
static const char spmd_prog[] =
    "module @spmd attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {\n"
    "  func.func public @main(%a: tensor<1024x1024xf32> {mhlo.sharding = \"{devices=[4,1]<=[4]}\"}, "
    "%w: tensor<1024x1024xf32> {mhlo.sharding = \"{replicated}\"}) -> (tensor<1024x1024xf32> {mhlo.sharding = "
    "\"{devices=[4,1]<=[4]}\"}) {\n"
    "    %0 = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : (tensor<1024x1024xf32>, "
    "tensor<1024x1024xf32>) -> tensor<1024x1024xf32>\n"
    "    return %0 : tensor<1024x1024xf32>\n"
    "  }\n"
    "}\n";

static void test_names(const char *plugin) {
  tpu_rt_target *t = NULL;
  tpu_status *s = tpu_rt_target_open(plugin, "v5e:bogus", &t);
  CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE, "a bad topology name: %s", s ? tpu_status_message(s) : "accepted");
  CHECK(s && strstr(tpu_status_message(s), "v5e:bogus"), "the error names it: %s", s ? tpu_status_message(s) : "");
  CHECK(t == NULL, "no target");
  tpu_status_free(s);
  s = tpu_rt_target_open(plugin, "", &t);
  CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE, "an empty name");
  tpu_status_free(s);
  s = tpu_rt_target_open("/nonexistent/libtpu.so", "v5e:2x2", &t);
  CHECK(s && tpu_status_code(s) == TPU_ERR_PLUGIN, "a missing plugin");
  tpu_status_free(s);
}

static void test_v5e(const char *plugin) {
  tpu_rt_target *t = NULL;
  tpu_status *s = tpu_rt_target_open(plugin, "v5e:2x2", &t);
  CHECK(!s, "open v5e:2x2: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  if (!t) return;
  CHECK(strcmp(tpu_rt_target_topology(t), "v5e:2x2") == 0, "topology");
  CHECK(strcmp(tpu_rt_target_kind(t), "TPU v5 lite") == 0, "kind %s", tpu_rt_target_kind(t));
  CHECK(tpu_rt_target_num_devices(t) == 4, "devices %d", tpu_rt_target_num_devices(t));
  CHECK(tpu_rt_target_hbm_bytes(t) > ((int64_t)8 << 30), "HBM %lld", (long long)tpu_rt_target_hbm_bytes(t));
  char *salt = tpu_rt_target_cache_salt(t);
  CHECK(salt && strstr(salt, "v5e:2x2") && strstr(salt, tpu_rt_target_platform_version(t)), "salt %s", salt);
  free(salt);

  tpu_rt_aot_stats st, st2;
  void *b1 = NULL, *b2 = NULL;
  size_t n1 = 0, n2 = 0;
  s = tpu_rt_target_compile(t, add_prog, strlen(add_prog), NULL, &st, &b1, &n1, NULL);
  CHECK(!s, "add: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  CHECK(st.flops == 16384, "add flops %g", st.flops);
  CHECK(st.argument_bytes == 65536 && st.output_bytes == 65536, "add arg %lld out %lld", (long long)st.argument_bytes,
        (long long)st.output_bytes);
  CHECK(st.peak_bytes >= 65536, "add peak %lld", (long long)st.peak_bytes);
  CHECK(st.transcendentals == 0, "add transcendentals %g", st.transcendentals);
  CHECK(n1 > 1000 && (int64_t)n1 == st.serialized_bytes, "serialized %zu", n1);
  CHECK(st.fingerprint[0] != 0, "a fingerprint");
  s = tpu_rt_target_compile(t, add_prog, strlen(add_prog), NULL, &st2, &b2, &n2, NULL);
  CHECK(!s, "add again");
  tpu_status_free(s);
  CHECK(strcmp(st.fingerprint, st2.fingerprint) == 0, "same fingerprint twice: %s %s", st.fingerprint, st2.fingerprint);
  /* The bytes themselves differ by a few (libtpu writes something of the
   * compile's own into them): the fingerprint is the program's identity. */
  CHECK(b1 && b2 && n2 > n1 / 2 && n2 < n1 * 2, "two serializations of one program (%zu, %zu bytes)", n1, n2);
  free(b1);
  free(b2);

  s = tpu_rt_target_compile(t, dot_prog, strlen(dot_prog), NULL, &st, NULL, NULL, NULL);
  CHECK(!s, "dot: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  double want = 2.0 * 256 * 512 * 64;
  CHECK(st.flops >= want * 0.99 && st.flops <= want * 1.01, "dot flops %g, 2MNK %g", st.flops, want);
  CHECK(st.argument_bytes == (256 * 512 + 512 * 64) * 4, "dot arg %lld", (long long)st.argument_bytes);
  CHECK(st.serialized_bytes > 0, "serialized size without the bytes");

  s = tpu_rt_target_compile(t, big_prog, strlen(big_prog), NULL, &st, NULL, NULL, NULL);
  CHECK(s && tpu_status_code(s) == TPU_ERR_MEMORY, "too big for HBM: %s", s ? tpu_status_message(s) : "compiled");
  CHECK(s && strstr(tpu_status_message(s), "HBM"), "the message says HBM: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);

  s = tpu_rt_target_compile(t, bad_prog, strlen(bad_prog), NULL, &st, NULL, NULL, NULL);
  CHECK(s && tpu_status_code(s) == TPU_ERR_RUNTIME, "a bad program: %s", s ? tpu_status_message(s) : "compiled");
  tpu_status_free(s);

  tpu_rt_compile_opts o = {.replicas = 1, .partitions = 4, .spmd = true};
  s = tpu_rt_target_compile(t, spmd_prog, strlen(spmd_prog), &o, &st, NULL, NULL, NULL);
  CHECK(!s, "spmd: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  CHECK(st.partitions == 4, "partitions %d", st.partitions);
  CHECK(st.argument_bytes == (1024 * 1024 / 4 + 1024 * 1024) * 4, "per-chip arguments %lld",
        (long long)st.argument_bytes);
  o.partitions = 8;
  s = tpu_rt_target_compile(t, spmd_prog, strlen(spmd_prog), &o, &st, NULL, NULL, NULL);
  CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE, "8 partitions on 4 chips");
  tpu_status_free(s);
  tpu_rt_target_close(t);
}

/* Names libtpu would end the process on are refused before it sees them
 * (0 chips: SIGFPE; past v5e's 16x16 plane: a CHECK failure). */
static void test_topology_bounds(const char *plugin) {
  const char *good[] = {"v5e:2x2", "v5e:16x16", "v5e:1x1", "v6e:64x64", "v5p:2x2x1", "v5p:16x20x28", "TPU7x:2x2x1"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    tpu_status *s = tpu_rt_topology_check(good[i]);
    CHECK(!s, "%s: %s", good[i], s ? tpu_status_message(s) : "");
    tpu_status_free(s);
  }
  const char *bad[][2] = {
      {"v5e:0x0", "from 1 to 64"},        {"v5e:1x0", "from 1 to 64"},   {"v5e:16x32", "at most 16x16"},
      {"v5e:64x64", "at most 16x16"},     {"v5e:16x16x2", "one plane"},  {"v6e:65x2", "from 1 to 64"},
      {"v5p:2x2x99999999999", "1 to 64"}, {"v5e:-1x2", "whole numbers"}, {"v5e:2", "two or three"},
      {"v5p:2x2x1x1", "two or three"},    {"v5e:2x2x", "whole numbers"}, {"v5e2x2", "<generation>:<chips>"},
      {":2x2", "<generation>:<chips>"},   {"v5e:2x2 ", "two or three"},  {"", "no TPU topology"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tpu_status *s = tpu_rt_topology_check(bad[i][0]);
    CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE && strstr(tpu_status_message(s), bad[i][1]), "%s: %s", bad[i][0],
          s ? tpu_status_message(s) : "accepted");
    tpu_status_free(s);
  }
  tpu_rt_target *t = NULL;
  tpu_status *s = tpu_rt_target_open(plugin, "v5e:0x0", &t); /* the process goes on */
  CHECK(s && t == NULL && strstr(tpu_status_message(s), "v5e:0x0"), "open refuses v5e:0x0");
  tpu_status_free(s);
}

/* A program over a 4x4 mesh (Shardy) whose result's layout is left to the
 * partitioner: libtpu's optimized program says it (in Shardy's own form,
 * OpSharding field 14), split as the product's operands are. */
static const char prop_prog[] =
    "module @prop attributes {mhlo.num_partitions = 16 : i32, mhlo.num_replicas = 1 : i32} {\n"
    "  sdy.mesh @mesh = <[\"a0\"=4, \"a1\"=4]>\n"
    "  func.func public @main(%w: tensor<64x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"a1\"}, {}]>}, "
    "%x: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"a0\"}, {}]>}) -> (tensor<16x64xf32>, "
    "tensor<64x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"a1\"}, {}]>}) {\n"
    "    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<16x32xf32>, "
    "tensor<64x32xf32>) -> tensor<16x64xf32>\n"
    "    %1 = stablehlo.add %w, %w : tensor<64x32xf32>\n"
    "    return %0, %1 : tensor<16x64xf32>, tensor<64x32xf32>\n"
    "  }\n"
    "}\n";

static void test_propagated(const char *plugin) {
  tpu_rt_target *t = NULL;
  tpu_status *s = tpu_rt_target_open(plugin, "v5e:4x4", &t);
  CHECK(!s, "open v5e:4x4: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  if (!t) return;
  bool prop[2] = {true, false};
  tpu_rt_compile_opts o = {
      .replicas = 1, .partitions = 16, .spmd = true, .shardy = true, .propagate = prop, .npropagate = 2};
  tpu_rt_aot_stats st;
  tpu_rt_module m;
  s = tpu_rt_target_compile(t, prop_prog, strlen(prop_prog), &o, &st, NULL, NULL, &m);
  CHECK(!s && m.bytes && m.len > 0, "compile with the optimized program: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  int64_t mesh[2] = {4, 4};
  int ranks[2] = {2, 2};
  bool want[2] = {true, true};
  tpu_sharding out[2];
  s = m.bytes ? tpu_hlo_read_output_shardings(m.bytes, m.len, m.with_config, 2, mesh, 2, ranks, want, out) : NULL;
  CHECK(m.bytes && !s, "read: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  int8_t d01[2] = {0, 1}, d1[2] = {1, -1};
  tpu_sharding w0 = tpu_sharding_make(2, mesh, 2, d01), w1 = tpu_sharding_make(2, mesh, 2, d1);
  CHECK(m.bytes && tpu_sharding_eq(&out[0], &w0), "the product split over both axes (%d, %d)", out[0].dim_axis[0],
        out[0].dim_axis[1]);
  CHECK(m.bytes && tpu_sharding_eq(&out[1], &w1), "the declared result as declared");
  free(m.bytes);
  tpu_rt_target_close(t);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s LIBTPU.so\n", argv[0]);
    return 2;
  }
  test_topology_bounds(argv[1]);
  test_names(argv[1]);
  test_v5e(argv[1]);
  test_propagated(argv[1]);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
