/* test_hlo.c: the StableHLO builder, on its emitted text.
 *
 * Small modules are compared with their exact expected text (which
 * test_runtime.c shows XLA's parser accepts); then sticky errors, no-op
 * shortcuts, types and the determinism of text and hash. The last line is
 * "N passed, M failed"; the exit status is non-zero on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hlo/hlo.h"
#include "mesh.h"

#include "check.h"

#define HEAD "module @torchtpu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
#define TAIL "  }\n}\n"

static tpu_hlo_type ty(tpu_dtype dt, int rank, int64_t a, int64_t b) {
  int64_t d[2] = {a, b};
  return tpu_hlo_type_make(dt, rank, d);
}
static tpu_hlo_type scalar(tpu_dtype dt) { return tpu_hlo_type_make(dt, 0, NULL); }

/* Finish m (freed) and return its text (owned) or NULL after a failed check. */
static char *finish(tpu_hlo *m, const tpu_hv *res, int n, const char *name) {
  char *text = NULL;
  size_t len = 0;
  tpu_status *s = tpu_hlo_finish(m, res, n, &text, &len);
  tpu_hlo_free(m);
  CHECK(s == NULL, "%s: finish failed: %s", name, s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  if (text) CHECK(strlen(text) == len, "%s: length %zu, strlen %zu", name, len, strlen(text));
  return text;
}

static void expect(tpu_hlo *m, const tpu_hv *res, int n, const char *name, const char *want) {
  char *got = finish(m, res, n, name);
  if (!got) return;
  size_t i = 0;
  while (got[i] && got[i] == want[i]) i++;
  CHECK(got[i] == want[i], "%s: text differs at byte %zu\n--- got:\n%s--- want:\n%s--- got from there: %.80s\n", name,
        i, got, want, got + i);
  free(got);
}

/* ---- exact text ------------------------------------------------------------------------ */

static void test_add(void) {
  tpu_hlo *m = tpu_hlo_new();
  CHECK(m != NULL, "tpu_hlo_new");
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3)), b = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  CHECK(a == 0 && b == 1, "parameter handles %d %d", a, b);
  tpu_hv r = tpu_hlo_binary(m, TPU_HLO_ADD, a, b);
  CHECK(tpu_hlo_ok(m), "add failed");
  expect(m, &r, 1, "add",
         HEAD
         "  func.func public @main(%v0: tensor<2x3xf32>, %v1: tensor<2x3xf32>) -> (tensor<2x3xf32>) {\n"
         "    %v2 = \"stablehlo.add\"(%v0, %v1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>\n"
         "    \"func.return\"(%v2) : (tensor<2x3xf32>) -> ()\n" TAIL);
}

#define KONST(n, lit, t) \
  "    %v" #n " = \"stablehlo.constant\"() {value = dense<" lit "> : tensor<" t ">} : () -> tensor<" t ">\n"

/* A complex value's truth: either part nonzero (bool(z) in torch), not its real part alone. */
static void test_complex_to_bool(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv r = tpu_hlo_convert(m, tpu_hlo_param(m, ty(TPU_C64, 1, 4, 0)), TPU_PRED);
  CHECK(tpu_hlo_ok(m) && tpu_hlo_typeof(m, r)->dtype == TPU_PRED, "complex -> pred");
  char *got = finish(m, &r, 1, "complex to bool");
  if (!got) return;
  CHECK(strstr(got, "\"stablehlo.real\"") && strstr(got, "\"stablehlo.imag\"") && strstr(got, "\"stablehlo.or\"") &&
            strstr(got, "(tensor<4xf32>) -> tensor<4xi1>"),
        "complex to bool: both parts converted and or-ed:\n%s", got);
  free(got);
}

static void test_constants(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv c[] = {
      tpu_hlo_constant(m, TPU_F32, INFINITY),      tpu_hlo_constant(m, TPU_F32, -INFINITY),
      tpu_hlo_constant(m, TPU_F32, NAN),           tpu_hlo_constant(m, TPU_F64, -INFINITY),
      tpu_hlo_constant(m, TPU_F16, INFINITY),      tpu_hlo_constant(m, TPU_BF16, NAN),
      tpu_hlo_constant(m, TPU_F32, 0.1),           tpu_hlo_constant(m, TPU_F32, 1.0),
      tpu_hlo_constant(m, TPU_F64, 0.1),           tpu_hlo_constant(m, TPU_F32, -0.0),
      tpu_hlo_constant(m, TPU_F16, 1e6), /* overflows f16: inf */
      tpu_hlo_constant_int(m, TPU_PRED, 1),        tpu_hlo_constant_int(m, TPU_PRED, 0),
      tpu_hlo_constant_int(m, TPU_S32, -7),        tpu_hlo_constant_int(m, TPU_S8, 200), /* wraps to -56 */
      tpu_hlo_constant_int(m, TPU_S8, -129),                                             /* wraps to 127 */
      tpu_hlo_constant_int(m, TPU_U8, -1),                                               /* 255 */
      tpu_hlo_constant_int(m, TPU_S64, INT64_MIN), tpu_hlo_constant(m, TPU_C64, 2.5),
      tpu_hlo_constant(m, TPU_S32, 3.9), /* integer dtypes truncate */
      tpu_hlo_constant(m, TPU_F64, INFINITY),      tpu_hlo_constant(m, TPU_F16, -INFINITY),
      tpu_hlo_constant(m, TPU_BF16, -INFINITY),    tpu_hlo_constant(m, TPU_F64, NAN),
      tpu_hlo_constant(m, TPU_F16, NAN),           tpu_hlo_constant(m, TPU_S8, -3.0),
  };
  enum { N = sizeof c / sizeof c[0] };
  for (int i = 0; i < N; i++) CHECK(c[i] == i, "constant %d has handle %d", i, c[i]);
  char *text = finish(m, c, N, "constants");
  if (!text) return;
  static const char *want[N] = {
      KONST(0, "0x7F800000", "f32"),
      KONST(1, "0xFF800000", "f32"),
      KONST(2, "0x7FC00000", "f32"),
      KONST(3, "0xFFF0000000000000", "f64"),
      KONST(4, "0x7C00", "f16"),
      KONST(5, "0x7FC0", "bf16"),
      KONST(6, "0.100000001", "f32"),
      KONST(7, "1.0", "f32"),
      KONST(8, "0.10000000000000001", "f64"),
      KONST(9, "-0.0", "f32"),
      KONST(10, "0x7C00", "f16"),
      KONST(11, "true", "i1"),
      KONST(12, "false", "i1"),
      KONST(13, "-7", "i32"),
      KONST(14, "-56", "i8"),
      KONST(15, "127", "i8"),
      KONST(16, "255", "ui8"),
      KONST(17, "-9223372036854775808", "i64"),
      KONST(18, "(2.5, 0.0)", "complex<f32>"),
      KONST(19, "3", "i32"),
      KONST(20, "0x7FF0000000000000", "f64"),
      KONST(21, "0xFC00", "f16"),
      KONST(22, "0xFF80", "bf16"),
      KONST(23, "0x7FF8000000000000", "f64"),
      KONST(24, "0x7E00", "f16"),
      KONST(25, "-3", "i8"),
  };
  /* Each on its own line, in order, right after the signature. */
  char body[4096] = "{\n";
  for (int i = 0; i < N; i++) strcat(body, want[i]);
  strcat(body, "    \"func.return\"(%v0, %v1, ");
  CHECK(strstr(text, body) != NULL, "constants: body\n%s\nnot found in\n%s", body, text);
  CHECK(
      strstr(text,
             "@main() -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f64>, tensor<f16>, tensor<bf16>, "
             "tensor<f32>, tensor<f32>, tensor<f64>, tensor<f32>, tensor<f16>, tensor<i1>, tensor<i1>, "
             "tensor<i32>, tensor<i8>, tensor<i8>, tensor<ui8>, tensor<i64>, tensor<complex<f32>>, "
             "tensor<i32>, tensor<f64>, tensor<f16>, tensor<bf16>, tensor<f64>, tensor<f16>, tensor<i8>) {\n") != NULL,
      "constants: signature in\n%s", text);
  free(text);

  /* A dense integer constant (nested brackets) and a bool one. */
  m = tpu_hlo_new();
  const int64_t v[6] = {1, -2, 3, 300, 0, -1};
  tpu_hv d = tpu_hlo_constant_ints(m, ty(TPU_S8, 2, 2, 3), v);
  const int64_t bv[2] = {1, 0};
  tpu_hv e = tpu_hlo_constant_ints(m, ty(TPU_PRED, 1, 2, 0), bv);
  const int64_t one = 7;
  tpu_hv f = tpu_hlo_constant_ints(m, scalar(TPU_U32), &one);
  tpu_hv r[3] = {d, e, f};
  expect(m, r, 3, "dense constants",
         HEAD
         "  func.func public @main() -> (tensor<2x3xi8>, tensor<2xi1>, tensor<ui32>) {\n"
         "    %v0 = \"stablehlo.constant\"() {value = dense<[[1, -2, 3], [44, 0, -1]]> : tensor<2x3xi8>} : () -> "
         "tensor<2x3xi8>\n"
         "    %v1 = \"stablehlo.constant\"() {value = dense<[true, false]> : tensor<2xi1>} : () -> tensor<2xi1>\n"
         "    %v2 = \"stablehlo.constant\"() {value = dense<7> : tensor<ui32>} : () -> tensor<ui32>\n"
         "    \"func.return\"(%v0, %v1, %v2) : (tensor<2x3xi8>, tensor<2xi1>, tensor<ui32>) -> ()\n" TAIL);
}

static void test_broadcast(void) {
  tpu_hlo *m = tpu_hlo_new();
  int64_t d3 = 3, d23[2] = {2, 3}, bd = 1;
  tpu_hv a = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 1, &d3));
  tpu_hv r[2] = {tpu_hlo_broadcast_in_dim(m, a, 2, d23, &bd),
                 tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant(m, TPU_F32, 2), 2, d23, NULL)};
  const tpu_hlo_type *t = tpu_hlo_typeof(m, r[0]);
  CHECK(t->dtype == TPU_F32 && t->rank == 2 && t->dims[0] == 2 && t->dims[1] == 3, "broadcast type");
  expect(m, r, 2, "broadcast_in_dim",
         HEAD
         "  func.func public @main(%v0: tensor<3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {\n"
         "    %v1 = \"stablehlo.broadcast_in_dim\"(%v0) {broadcast_dimensions = array<i64: 1>} : (tensor<3xf32>) "
         "-> tensor<2x3xf32>\n"
         "    %v2 = \"stablehlo.constant\"() {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>\n"
         "    %v3 = \"stablehlo.broadcast_in_dim\"(%v2) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> "
         "tensor<2x3xf32>\n"
         "    \"func.return\"(%v1, %v3) : (tensor<2x3xf32>, tensor<2x3xf32>) -> ()\n" TAIL);
}

static void test_reduce(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  int64_t dim = 1;
  tpu_hv r = tpu_hlo_reduce(m, a, tpu_hlo_constant(m, TPU_F32, 0), &dim, 1, TPU_HLO_ADD);
  const tpu_hlo_type *t = tpu_hlo_typeof(m, r);
  CHECK(t->rank == 1 && t->dims[0] == 2, "reduce drops the reduced dim");
  expect(m, &r, 1, "reduce",
         HEAD
         "  func.func public @main(%v0: tensor<2x3xf32>) -> (tensor<2xf32>) {\n"
         "    %v1 = \"stablehlo.constant\"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>\n"
         "    %v5 = \"stablehlo.reduce\"(%v0, %v1) ({\n"
         "    ^bb0(%v2: tensor<f32>, %v3: tensor<f32>):\n"
         "      %v4 = \"stablehlo.add\"(%v2, %v3) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
         "      \"stablehlo.return\"(%v4) : (tensor<f32>) -> ()\n"
         "    }) {dimensions = array<i64: 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>\n"
         "    \"func.return\"(%v5) : (tensor<2xf32>) -> ()\n" TAIL);
}

static void test_reduce_region(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, 4, 0));
  tpu_hv ix = tpu_hlo_iota(m, ty(TPU_S32, 1, 4, 0), 0);
  tpu_hlo_type at[4] = {scalar(TPU_F32), scalar(TPU_S32), scalar(TPU_F32), scalar(TPU_S32)};
  tpu_hv ra[4];
  tpu_hlo_region_begin(m, at, 4, ra);
  tpu_hv gt = tpu_hlo_compare(m, TPU_HLO_GT, ra[2], ra[0]);
  tpu_hv o2[2] = {tpu_hlo_select(m, gt, ra[2], ra[0]), tpu_hlo_select(m, gt, ra[3], ra[1])};
  int reg = tpu_hlo_region_end(m, o2, 2);
  CHECK(reg >= 0, "region id %d", reg);
  tpu_hv xs[2] = {a, ix}, in[2] = {tpu_hlo_constant(m, TPU_F32, -INFINITY), tpu_hlo_constant_int(m, TPU_S32, 0)};
  tpu_hv outs[2];
  int64_t d0 = 0;
  CHECK(tpu_hlo_reduce_region(m, xs, in, 2, &d0, 1, reg, outs), "reduce_region");
  CHECK(tpu_hlo_typeof(m, outs[0])->rank == 0 && tpu_hlo_typeof(m, outs[1])->dtype == TPU_S32, "result types");
  expect(m, outs, 2, "variadic reduce",
         HEAD
         "  func.func public @main(%v0: tensor<4xf32>) -> (tensor<f32>, tensor<i32>) {\n"
         "    %v1 = \"stablehlo.iota\"() {iota_dimension = 0 : i64} : () -> tensor<4xi32>\n"
         "    %v9 = \"stablehlo.constant\"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>\n"
         "    %v10 = \"stablehlo.constant\"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>\n"
         "    %v11, %v12 = \"stablehlo.reduce\"(%v0, %v1, %v9, %v10) ({\n"
         "    ^bb0(%v2: tensor<f32>, %v3: tensor<i32>, %v4: tensor<f32>, %v5: tensor<i32>):\n"
         "      %v6 = \"stablehlo.compare\"(%v4, %v2) {comparison_direction = #stablehlo<comparison_direction GT>, "
         "compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>\n"
         "      %v7 = \"stablehlo.select\"(%v6, %v4, %v2) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>\n"
         "      %v8 = \"stablehlo.select\"(%v6, %v5, %v3) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>\n"
         "      \"stablehlo.return\"(%v7, %v8) : (tensor<f32>, tensor<i32>) -> ()\n"
         "    }) {dimensions = array<i64: 0>} : (tensor<4xf32>, tensor<4xi32>, tensor<f32>, tensor<i32>) -> "
         "(tensor<f32>, tensor<i32>)\n"
         "    \"func.return\"(%v11, %v12) : (tensor<f32>, tensor<i32>) -> ()\n" TAIL);
}

static void test_compare_select(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_S32, 1, 4, 0)), b = tpu_hlo_param(m, ty(TPU_S32, 1, 4, 0));
  tpu_hv u = tpu_hlo_param(m, ty(TPU_U8, 1, 4, 0)), f = tpu_hlo_param(m, ty(TPU_F32, 1, 4, 0));
  tpu_hv r[4];
  r[0] = tpu_hlo_select(m, tpu_hlo_compare(m, TPU_HLO_LT, a, b), a, b);
  r[1] = tpu_hlo_compare(m, TPU_HLO_GE, u, u);
  r[2] = tpu_hlo_compare(m, TPU_HLO_NE, f, f);
  r[3] = tpu_hlo_select(m, tpu_hlo_constant_int(m, TPU_PRED, 1), f, f); /* 0-d predicate */
  CHECK(tpu_hlo_typeof(m, r[1])->dtype == TPU_PRED, "compare gives i1");
  expect(m, r, 4, "compare/select",
         HEAD
         "  func.func public @main(%v0: tensor<4xi32>, %v1: tensor<4xi32>, %v2: tensor<4xui8>, %v3: "
         "tensor<4xf32>) -> (tensor<4xi32>, tensor<4xi1>, tensor<4xi1>, tensor<4xf32>) {\n"
         "    %v4 = \"stablehlo.compare\"(%v0, %v1) {comparison_direction = #stablehlo<comparison_direction LT>, "
         "compare_type = #stablehlo<comparison_type SIGNED>} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>\n"
         "    %v5 = \"stablehlo.select\"(%v4, %v0, %v1) : (tensor<4xi1>, tensor<4xi32>, tensor<4xi32>) -> "
         "tensor<4xi32>\n"
         "    %v6 = \"stablehlo.compare\"(%v2, %v2) {comparison_direction = #stablehlo<comparison_direction GE>, "
         "compare_type = #stablehlo<comparison_type UNSIGNED>} : (tensor<4xui8>, tensor<4xui8>) -> tensor<4xi1>\n"
         "    %v7 = \"stablehlo.compare\"(%v3, %v3) {comparison_direction = #stablehlo<comparison_direction NE>, "
         "compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>\n"
         "    %v8 = \"stablehlo.constant\"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>\n"
         "    %v9 = \"stablehlo.select\"(%v8, %v3, %v3) : (tensor<i1>, tensor<4xf32>, tensor<4xf32>) -> "
         "tensor<4xf32>\n"
         "    \"func.return\"(%v5, %v6, %v7, %v9) : (tensor<4xi32>, tensor<4xi1>, tensor<4xi1>, tensor<4xf32>) -> "
         "()\n" TAIL);
}

static void test_dot_general(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3)), b = tpu_hlo_param(m, ty(TPU_F32, 2, 3, 4));
  int64_t lc = 1, rc = 0;
  tpu_hv r = tpu_hlo_dot_general(m, a, b, 0, NULL, NULL, 1, &lc, &rc, TPU_HLO_PREC_HIGHEST, TPU_INVALID);
  expect(m, &r, 1, "dot_general",
         HEAD
         "  func.func public @main(%v0: tensor<2x3xf32>, %v1: tensor<3x4xf32>) -> (tensor<2x4xf32>) {\n"
         "    %v2 = \"stablehlo.dot_general\"(%v0, %v1) {dot_dimension_numbers = "
         "#stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = "
         "[#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<2x3xf32>, tensor<3x4xf32>) -> "
         "tensor<2x4xf32>\n"
         "    \"func.return\"(%v2) : (tensor<2x4xf32>) -> ()\n" TAIL);

  /* Batched, with an explicit result dtype. */
  m = tpu_hlo_new();
  int64_t dl[3] = {5, 2, 3}, dr[3] = {5, 3, 4};
  a = tpu_hlo_param(m, tpu_hlo_type_make(TPU_BF16, 3, dl));
  b = tpu_hlo_param(m, tpu_hlo_type_make(TPU_BF16, 3, dr));
  int64_t z = 0, two = 2;
  r = tpu_hlo_dot_general(m, a, b, 1, &z, &z, 1, &two, &lc, TPU_HLO_PREC_DEFAULT, TPU_F32);
  expect(m, &r, 1, "batched dot_general",
         HEAD
         "  func.func public @main(%v0: tensor<5x2x3xbf16>, %v1: tensor<5x3x4xbf16>) -> (tensor<5x2x4xf32>) {\n"
         "    %v2 = \"stablehlo.dot_general\"(%v0, %v1) {dot_dimension_numbers = "
         "#stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions "
         "= [2], rhs_contracting_dimensions = [1]>, precision_config = [#stablehlo<precision DEFAULT>, "
         "#stablehlo<precision DEFAULT>]} : (tensor<5x2x3xbf16>, tensor<5x3x4xbf16>) -> tensor<5x2x4xf32>\n"
         "    \"func.return\"(%v2) : (tensor<5x2x4xf32>) -> ()\n" TAIL);
}

/* 64-bit integers: no dot_general or convolution (TPU's compiler has none of
 * 64 bits), sums of products of the same result types instead. */
static void test_wide_int_dot_and_convolution(void) {
  tpu_hlo *m = tpu_hlo_new();
  int64_t dl[3] = {5, 2, 3}, dr[3] = {5, 3, 4}, z = 0, two = 2, one = 1;
  tpu_hv a = tpu_hlo_param(m, tpu_hlo_type_make(TPU_S64, 3, dl)),
         b = tpu_hlo_param(m, tpu_hlo_type_make(TPU_S64, 3, dr));
  tpu_hv r[2];
  r[0] = tpu_hlo_dot_general(m, a, b, 1, &z, &z, 1, &two, &one, TPU_HLO_PREC_HIGHEST, TPU_INVALID);
  int64_t xd[4] = {2, 4, 6, 6}, wd[4] = {6, 2, 3, 3}, st[2] = {2, 1}, pad[4] = {1, 1, 0, 2};
  tpu_hv x = tpu_hlo_param(m, tpu_hlo_type_make(TPU_U64, 4, xd)),
         w = tpu_hlo_param(m, tpu_hlo_type_make(TPU_U64, 4, wd));
  r[1] = tpu_hlo_convolution(m, x, w, 2, st, pad, NULL, NULL, 2, 1, TPU_HLO_PREC_HIGHEST);
  char *text = finish(m, r, 2, "wide int dot and convolution");
  if (!text) return;
  CHECK(!strstr(text, "stablehlo.dot_general") && !strstr(text, "stablehlo.convolution"), "wide int: emitted\n%s",
        text);
  CHECK(strstr(text, "-> (tensor<5x2x4xi64>, tensor<2x6x3x6xui64>)") && strstr(text, "stablehlo.reduce") &&
            strstr(text, "stablehlo.multiply") && !strstr(text, "stablehlo.while"),
        "wide int: result types or body in\n%s", text);
  free(text);
  /* products over 2^22 elements: a loop over blocks of 64 of the 100 contracting indices, padded to 128 */
  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_S64, 2, 256, 100));
  b = tpu_hlo_param(m, ty(TPU_S64, 2, 100, 256));
  r[0] = tpu_hlo_dot_general(m, a, b, 0, NULL, NULL, 1, &one, &z, TPU_HLO_PREC_HIGHEST, TPU_INVALID);
  text = finish(m, r, 1, "wide int dot in blocks");
  if (!text) return;
  CHECK(strstr(text, "stablehlo.while") && strstr(text, "tensor<1x256x128xi64>") &&
            strstr(text, "-> (tensor<256x256xi64>)") && !strstr(text, "stablehlo.dot_general"),
        "wide int dot in blocks:\n%s", text);
  free(text);
}

static void test_gather(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 4, 3)), b = tpu_hlo_param(m, ty(TPU_S32, 1, 2, 0));
  tpu_hlo_gather_dims g;
  memset(&g, 0, sizeof g);
  g.n_offset = 1;
  g.offset_dims[0] = 1;
  g.n_collapsed = 1;
  g.n_start_index_map = 1;
  g.index_vector_dim = 1;
  int64_t ss[2] = {1, 3};
  tpu_hv r = tpu_hlo_gather(m, a, b, &g, ss, ty(TPU_F32, 2, 2, 3));
  expect(m, &r, 1, "gather",
         HEAD
         "  func.func public @main(%v0: tensor<4x3xf32>, %v1: tensor<2xi32>) -> (tensor<2x3xf32>) {\n"
         "    %v2 = \"stablehlo.gather\"(%v0, %v1) {dimension_numbers = #stablehlo.gather<offset_dims = [1], "
         "collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, "
         "slice_sizes = array<i64: 1, 3>} : (tensor<4x3xf32>, tensor<2xi32>) -> tensor<2x3xf32>\n"
         "    \"func.return\"(%v2) : (tensor<2x3xf32>) -> ()\n" TAIL);
}

static void test_scatter(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, 5, 0)), b = tpu_hlo_param(m, ty(TPU_S32, 2, 3, 1)),
         up = tpu_hlo_param(m, ty(TPU_F32, 1, 3, 0));
  tpu_hlo_scatter_dims sd;
  memset(&sd, 0, sizeof sd);
  sd.n_inserted = 1;
  sd.n_scatter_to_operand = 1;
  sd.index_vector_dim = 1;
  tpu_hv r[2];
  r[0] = tpu_hlo_scatter(m, a, b, up, &sd, -1); /* replace body built for us */
  tpu_hlo_type st[2] = {scalar(TPU_F32), scalar(TPU_F32)};
  tpu_hv ra[2];
  tpu_hlo_region_begin(m, st, 2, ra);
  tpu_hv s = tpu_hlo_binary(m, TPU_HLO_ADD, ra[0], ra[1]);
  r[1] = tpu_hlo_scatter(m, a, b, up, &sd, tpu_hlo_region_end(m, &s, 1));
  expect(m, r, 2, "scatter",
         HEAD
         "  func.func public @main(%v0: tensor<5xf32>, %v1: tensor<3x1xi32>, %v2: tensor<3xf32>) -> "
         "(tensor<5xf32>, tensor<5xf32>) {\n"
         "    %v5 = \"stablehlo.scatter\"(%v0, %v1, %v2) ({\n"
         "    ^bb0(%v3: tensor<f32>, %v4: tensor<f32>):\n"
         "      \"stablehlo.return\"(%v4) : (tensor<f32>) -> ()\n"
         "    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims "
         "= [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false} : "
         "(tensor<5xf32>, tensor<3x1xi32>, tensor<3xf32>) -> tensor<5xf32>\n"
         "    %v9 = \"stablehlo.scatter\"(%v0, %v1, %v2) ({\n"
         "    ^bb0(%v6: tensor<f32>, %v7: tensor<f32>):\n"
         "      %v8 = \"stablehlo.add\"(%v6, %v7) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
         "      \"stablehlo.return\"(%v8) : (tensor<f32>) -> ()\n"
         "    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims "
         "= [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false} : "
         "(tensor<5xf32>, tensor<3x1xi32>, tensor<3xf32>) -> tensor<5xf32>\n"
         "    \"func.return\"(%v5, %v9) : (tensor<5xf32>, tensor<5xf32>) -> ()\n" TAIL);
}

static void test_iota(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv r = tpu_hlo_iota(m, ty(TPU_S64, 2, 2, 3), 1);
  expect(m, &r, 1, "iota",
         HEAD
         "  func.func public @main() -> (tensor<2x3xi64>) {\n"
         "    %v0 = \"stablehlo.iota\"() {iota_dimension = 1 : i64} : () -> tensor<2x3xi64>\n"
         "    \"func.return\"(%v0) : (tensor<2x3xi64>) -> ()\n" TAIL);
}

static void test_noops(void) {
  tpu_hlo *m = tpu_hlo_new();
  int64_t d23[2] = {2, 3}, id[2] = {0, 1};
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  CHECK(tpu_hlo_convert(m, a, TPU_F32) == a, "convert to the same dtype is a no-op");
  CHECK(tpu_hlo_reshape(m, a, 2, d23) == a, "reshape to the same shape is a no-op");
  CHECK(tpu_hlo_transpose(m, a, id) == a, "identity transpose is a no-op");
  CHECK(tpu_hlo_broadcast_in_dim(m, a, 2, d23, id) == a, "identity broadcast is a no-op");
  CHECK(tpu_hlo_concat(m, &a, 1, 0) == a, "concat of one is a no-op");
  CHECK(tpu_hlo_reverse(m, a, NULL, 0) == a, "reverse of no dims is a no-op");
  tpu_hv c = tpu_hlo_convert(m, a, TPU_F16);
  CHECK(c != a && tpu_hlo_typeof(m, c)->dtype == TPU_F16, "a real convert");
  int64_t d6 = 6;
  tpu_hv rs = tpu_hlo_reshape(m, c, 1, &d6);
  expect(m, &rs, 1, "no-ops emit nothing",
         HEAD
         "  func.func public @main(%v0: tensor<2x3xf32>) -> (tensor<6xf16>) {\n"
         "    %v1 = \"stablehlo.convert\"(%v0) : (tensor<2x3xf32>) -> tensor<2x3xf16>\n"
         "    %v2 = \"stablehlo.reshape\"(%v1) : (tensor<2x3xf16>) -> tensor<6xf16>\n"
         "    \"func.return\"(%v2) : (tensor<6xf16>) -> ()\n" TAIL);
}

static void test_slice_concat_pad(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  int64_t st[2] = {0, 1}, lim[2] = {2, 3}, str[2] = {1, 2};
  tpu_hv r[4];
  r[0] = tpu_hlo_slice(m, a, st, lim, str);
  tpu_hv parts[2] = {a, a};
  r[1] = tpu_hlo_concat(m, parts, 2, 1);
  int64_t lo[2] = {1, -1}, hi[2] = {0, 2}, in[2] = {0, 1};
  r[2] = tpu_hlo_pad(m, a, tpu_hlo_constant(m, TPU_F32, 0), lo, hi, in);
  r[3] = tpu_hlo_slice(m, a, st, lim, NULL);
  const tpu_hlo_type *t = tpu_hlo_typeof(m, r[2]);
  CHECK(t->dims[0] == 3 && t->dims[1] == 6, "pad type %lldx%lld", (long long)t->dims[0], (long long)t->dims[1]);
  expect(m, r, 4, "slice/concat/pad",
         HEAD
         "  func.func public @main(%v0: tensor<2x3xf32>) -> (tensor<2x1xf32>, tensor<2x6xf32>, tensor<3x6xf32>, "
         "tensor<2x2xf32>) {\n"
         "    %v1 = \"stablehlo.slice\"(%v0) {start_indices = array<i64: 0, 1>, limit_indices = array<i64: 2, 3>, "
         "strides = array<i64: 1, 2>} : (tensor<2x3xf32>) -> tensor<2x1xf32>\n"
         "    %v2 = \"stablehlo.concatenate\"(%v0, %v0) {dimension = 1 : i64} : (tensor<2x3xf32>, "
         "tensor<2x3xf32>) -> tensor<2x6xf32>\n"
         "    %v3 = \"stablehlo.constant\"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>\n"
         "    %v4 = \"stablehlo.pad\"(%v0, %v3) {edge_padding_low = array<i64: 1, -1>, edge_padding_high = "
         "array<i64: 0, 2>, interior_padding = array<i64: 0, 1>} : (tensor<2x3xf32>, tensor<f32>) -> "
         "tensor<3x6xf32>\n"
         "    %v5 = \"stablehlo.slice\"(%v0) {start_indices = array<i64: 0, 1>, limit_indices = array<i64: 2, 3>, "
         "strides = array<i64: 1, 1>} : (tensor<2x3xf32>) -> tensor<2x2xf32>\n"
         "    \"func.return\"(%v1, %v2, %v4, %v5) : (tensor<2x1xf32>, tensor<2x6xf32>, tensor<3x6xf32>, "
         "tensor<2x2xf32>) -> ()\n" TAIL);
}

static void test_alias(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, 3, 0));
  tpu_hv b = tpu_hlo_param(m, scalar(TPU_S32));
  tpu_hv r[2] = {tpu_hlo_unary(m, TPU_HLO_NEG, a), b};
  tpu_hlo_param_alias(m, a, 0);
  tpu_hlo_param_alias(m, b, 1);
  CHECK(tpu_hlo_ok(m), "alias failed");
  expect(m, r, 2, "alias",
         HEAD
         "  func.func public @main(%v0: tensor<3xf32> {tf.aliasing_output = 0 : i32}, %v1: tensor<i32> "
         "{tf.aliasing_output = 1 : i32}) -> (tensor<3xf32>, tensor<i32>) {\n"
         "    %v2 = \"stablehlo.negate\"(%v0) : (tensor<3xf32>) -> tensor<3xf32>\n"
         "    \"func.return\"(%v2, %v1) : (tensor<3xf32>, tensor<i32>) -> ()\n" TAIL);
}

static void test_sort_rng(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, 5, 0));
  tpu_hlo_type ct[2] = {scalar(TPU_F32), scalar(TPU_F32)};
  tpu_hv ca[2], o;
  tpu_hlo_region_begin(m, ct, 2, ca);
  tpu_hv lt = tpu_hlo_compare(m, TPU_HLO_LT, ca[0], ca[1]);
  CHECK(tpu_hlo_sort(m, &a, 1, 0, true, tpu_hlo_region_end(m, &lt, 1), &o), "sort");
  expect(m, &o, 1, "sort",
         HEAD
         "  func.func public @main(%v0: tensor<5xf32>) -> (tensor<5xf32>) {\n"
         "    %v4 = \"stablehlo.sort\"(%v0) ({\n"
         "    ^bb0(%v1: tensor<f32>, %v2: tensor<f32>):\n"
         "      %v3 = \"stablehlo.compare\"(%v1, %v2) {comparison_direction = #stablehlo<comparison_direction LT>, "
         "compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>\n"
         "      \"stablehlo.return\"(%v3) : (tensor<i1>) -> ()\n"
         "    }) {dimension = 0 : i64, is_stable = true} : (tensor<5xf32>) -> tensor<5xf32>\n"
         "    \"func.return\"(%v4) : (tensor<5xf32>) -> ()\n" TAIL);

  m = tpu_hlo_new();
  tpu_hv st = tpu_hlo_param(m, ty(TPU_U64, 1, 2, 0)), ns;
  tpu_hv bits = tpu_hlo_rng_bit_generator(m, st, ty(TPU_U32, 1, 4, 0), &ns);
  tpu_hv r[2] = {bits, ns};
  expect(m, r, 2, "rng_bit_generator",
         HEAD
         "  func.func public @main(%v0: tensor<2xui64>) -> (tensor<4xui32>, tensor<2xui64>) {\n"
         "    %v1, %v2 = \"stablehlo.rng_bit_generator\"(%v0) {rng_algorithm = #stablehlo<rng_algorithm "
         "THREE_FRY>} : (tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>)\n"
         "    \"func.return\"(%v2, %v1) : (tensor<4xui32>, tensor<2xui64>) -> ()\n" TAIL);
}

static void test_conv_pool_transpose(void) {
  tpu_hlo *m = tpu_hlo_new();
  int64_t di[4] = {1, 2, 5, 5}, dk[4] = {3, 2, 3, 3}, st[2] = {2, 2}, pad[4] = {1, 1, 0, 1};
  tpu_hv x = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 4, di)),
         w = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 4, dk));
  tpu_hv c = tpu_hlo_convolution(m, x, w, 2, st, pad, NULL, NULL, 1, 1, TPU_HLO_PREC_DEFAULT);
  expect(m, &c, 1, "convolution",
         HEAD
         "  func.func public @main(%v0: tensor<1x2x5x5xf32>, %v1: tensor<3x2x3x3xf32>) -> (tensor<1x3x3x2xf32>) {\n"
         "    %v2 = \"stablehlo.convolution\"(%v0, %v1) {batch_group_count = 1 : i64, dimension_numbers = "
         "#stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>, feature_group_count = 1 : i64, lhs_dilation = "
         "array<i64: 1, 1>, padding = dense<[[1, 1], [0, 1]]> : tensor<2x2xi64>, precision_config = "
         "[#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>], rhs_dilation = array<i64: 1, 1>, "
         "window_strides = array<i64: 2, 2>} : (tensor<1x2x5x5xf32>, tensor<3x2x3x3xf32>) -> tensor<1x3x3x2xf32>\n"
         "    \"func.return\"(%v2) : (tensor<1x3x3x2xf32>) -> ()\n" TAIL);

  m = tpu_hlo_new();
  int64_t dx[4] = {1, 1, 4, 4}, win[4] = {1, 1, 2, 2}, str[4] = {1, 1, 2, 2};
  x = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 4, dx));
  tpu_hlo_type ct[2] = {scalar(TPU_F32), scalar(TPU_F32)};
  tpu_hv ca[2], o;
  tpu_hlo_region_begin(m, ct, 2, ca);
  tpu_hv mx = tpu_hlo_binary(m, TPU_HLO_MAX, ca[0], ca[1]);
  int reg = tpu_hlo_region_end(m, &mx, 1);
  tpu_hv init = tpu_hlo_constant(m, TPU_F32, -INFINITY);
  CHECK(tpu_hlo_reduce_window(m, &x, &init, 1, win, str, NULL, NULL, NULL, reg, &o), "reduce_window");
  expect(m, &o, 1, "reduce_window",
         HEAD
         "  func.func public @main(%v0: tensor<1x1x4x4xf32>) -> (tensor<1x1x2x2xf32>) {\n"
         "    %v4 = \"stablehlo.constant\"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>\n"
         "    %v5 = \"stablehlo.reduce_window\"(%v0, %v4) ({\n"
         "    ^bb0(%v1: tensor<f32>, %v2: tensor<f32>):\n"
         "      %v3 = \"stablehlo.maximum\"(%v1, %v2) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
         "      \"stablehlo.return\"(%v3) : (tensor<f32>) -> ()\n"
         "    }) {window_dimensions = array<i64: 1, 1, 2, 2>, window_strides = array<i64: 1, 1, 2, 2>, "
         "base_dilations = array<i64: 1, 1, 1, 1>, window_dilations = array<i64: 1, 1, 1, 1>, padding = "
         "dense<[[0, 0], [0, 0], [0, 0], [0, 0]]> : tensor<4x2xi64>} : (tensor<1x1x4x4xf32>, tensor<f32>) -> "
         "tensor<1x1x2x2xf32>\n"
         "    \"func.return\"(%v5) : (tensor<1x1x2x2xf32>) -> ()\n" TAIL);

  m = tpu_hlo_new();
  int64_t perm[2] = {1, 0};
  x = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  o = tpu_hlo_transpose(m, x, perm);
  expect(m, &o, 1, "transpose",
         HEAD
         "  func.func public @main(%v0: tensor<2x3xf32>) -> (tensor<3x2xf32>) {\n"
         "    %v1 = \"stablehlo.transpose\"(%v0) {permutation = array<i64: 1, 0>} : (tensor<2x3xf32>) -> "
         "tensor<3x2xf32>\n"
         "    \"func.return\"(%v1) : (tensor<3x2xf32>) -> ()\n" TAIL);
}

/* The core this builder stands on: statuses and dtypes. */
static void test_core(void) {
  tpu_status *s = tpu_status_new(TPU_ERR_INDEX, "dim %d", 3);
  s = tpu_status_prefix(s, "in %s", "aten::select");
  CHECK(tpu_status_code(s) == TPU_ERR_INDEX && strcmp(tpu_status_message(s), "in aten::select: dim 3") == 0,
        "status: %s", tpu_status_message(s));
  tpu_status_free(s);
  tpu_status_free(NULL);
  CHECK(tpu_status_prefix(NULL, "x") == NULL, "prefix of NULL");
  CHECK(tpu_dtype_size(TPU_BF16) == 2 && tpu_dtype_size(TPU_C128) == 16 && tpu_dtype_size(TPU_INVALID) == 0,
        "dtype sizes");
  CHECK(strcmp(tpu_dtype_mlir(TPU_U8), "ui8") == 0 && strcmp(tpu_dtype_mlir(TPU_PRED), "i1") == 0 &&
            strcmp(tpu_dtype_mlir(TPU_C64), "complex<f32>") == 0,
        "mlir names");
  CHECK(strcmp(tpu_dtype_name(TPU_F16), "float16") == 0 && strcmp(tpu_dtype_name(TPU_NUM_DTYPES), "invalid") == 0,
        "torch names");
  CHECK(tpu_dtype_promote(TPU_U8, TPU_S8) == TPU_S16 && tpu_dtype_promote(TPU_F16, TPU_BF16) == TPU_F32 &&
            tpu_dtype_promote(TPU_PRED, TPU_S32) == TPU_S32 && tpu_dtype_promote(TPU_S64, TPU_F16) == TPU_F16 &&
            tpu_dtype_promote(TPU_F64, TPU_C64) == TPU_C128,
        "promotion");
}

/* ---- types -------------------------------------------------------------------------------- */

static void test_types(void) {
  char buf[64];
  tpu_hlo_type t = ty(TPU_F32, 2, 2, 3);
  CHECK(tpu_hlo_type_str(&t, buf, sizeof buf) == 15 && strcmp(buf, "tensor<2x3xf32>") == 0, "type_str: %s", buf);
  tpu_hlo_type s = scalar(TPU_C64);
  CHECK(tpu_hlo_type_str(&s, buf, sizeof buf) == 20 && strcmp(buf, "tensor<complex<f32>>") == 0, "scalar: %s", buf);
  char small[8];
  CHECK(tpu_hlo_type_str(&t, small, sizeof small) == 15 && strcmp(small, "tensor<") == 0, "truncated: %s", small);
  CHECK(tpu_hlo_type_numel(&t) == 6 && tpu_hlo_type_numel(&s) == 1, "numel");
  tpu_hlo_type u = ty(TPU_F32, 2, 2, 3), v = ty(TPU_F32, 2, 3, 2), w = ty(TPU_S32, 2, 2, 3);
  CHECK(tpu_hlo_type_eq(&t, &u) && !tpu_hlo_type_eq(&t, &v) && !tpu_hlo_type_eq(&t, &w), "type_eq");
  int64_t over[TPU_MAX_RANK + 1];
  for (int i = 0; i <= TPU_MAX_RANK; i++) over[i] = 1;
  tpu_hlo_type big = tpu_hlo_type_make(TPU_F32, TPU_MAX_RANK + 1, over);
  CHECK(big.dtype == TPU_INVALID && big.rank == 0, "a rank over the limit is an invalid type, not a cut one");
  tpu_hlo_type most = tpu_hlo_type_make(TPU_F32, TPU_MAX_RANK, over);
  CHECK(most.dtype == TPU_F32 && most.rank == TPU_MAX_RANK && tpu_hlo_type_numel(&most) == 1, "rank %d", TPU_MAX_RANK);
  tpu_hlo *m = tpu_hlo_new();
  CHECK(tpu_hlo_typeof(m, TPU_HV_NONE)->dtype == TPU_INVALID, "typeof NONE");
  CHECK(tpu_hlo_typeof(m, 5)->dtype == TPU_INVALID, "typeof out of range");
  tpu_hv x = tpu_hlo_param(m, ty(TPU_C64, 1, 4, 0));
  CHECK(tpu_hlo_typeof(m, tpu_hlo_unary(m, TPU_HLO_ABS, x))->dtype == TPU_F32, "abs of c64 is f32");
  CHECK(tpu_hlo_typeof(m, tpu_hlo_unary(m, TPU_HLO_IMAG, x))->dtype == TPU_F32, "imag of c64 is f32");
  tpu_hv f = tpu_hlo_param(m, ty(TPU_F64, 1, 4, 0));
  CHECK(tpu_hlo_typeof(m, tpu_hlo_binary(m, TPU_HLO_COMPLEX, f, f))->dtype == TPU_C128, "complex of f64");
  CHECK(tpu_hlo_typeof(m, tpu_hlo_unary(m, TPU_HLO_IS_FINITE, f))->dtype == TPU_PRED, "is_finite is i1");
  tpu_hv st = tpu_hlo_param(m, ty(TPU_U64, 1, 2, 0)), ns;
  tpu_hv bits = tpu_hlo_rng_bit_generator(m, st, ty(TPU_U32, 2, 4, 4), &ns);
  CHECK(tpu_hlo_typeof(m, bits)->dims[1] == 4 && tpu_hlo_typeof(m, ns)->dtype == TPU_U64, "rng types");
  int64_t di[4] = {2, 3, 8, 8}, dk[4] = {4, 3, 3, 3}, str[2] = {2, 2}, pad[4] = {1, 1, 1, 1};
  tpu_hv in = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 4, di)),
         k = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 4, dk));
  const tpu_hlo_type *ct =
      tpu_hlo_typeof(m, tpu_hlo_convolution(m, in, k, 2, str, pad, NULL, NULL, 1, 1, TPU_HLO_PREC_DEFAULT));
  CHECK(ct->rank == 4 && ct->dims[0] == 2 && ct->dims[1] == 4 && ct->dims[2] == 4 && ct->dims[3] == 4,
        "conv type %lldx%lldx%lldx%lld", (long long)ct->dims[0], (long long)ct->dims[1], (long long)ct->dims[2],
        (long long)ct->dims[3]);
  CHECK(tpu_hlo_ok(m), "type checks failed");
  tpu_hlo_free(m);
  tpu_hlo_free(NULL);
}

/* ---- sticky errors ------------------------------------------------------------------------ */

static tpu_status *finish_err(tpu_hlo *m, const tpu_hv *r, int n) {
  char *text = (char *)"unset";
  size_t len = 99;
  tpu_status *s = tpu_hlo_finish(m, r, n, &text, &len);
  CHECK(text == NULL && len == 0, "text set on error");
  return s;
}

static void expect_error(tpu_status *s, tpu_code code, const char *msg, const char *what) {
  CHECK(s != NULL, "%s: no error", what);
  if (!s) return;
  CHECK(tpu_status_code(s) == code, "%s: code %d, want %d", what, tpu_status_code(s), code);
  CHECK(strcmp(tpu_status_message(s), msg) == 0, "%s: message \"%s\", want \"%s\"", what, tpu_status_message(s), msg);
  tpu_status_free(s);
}

static void test_sticky(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0)), b = tpu_hlo_param(m, ty(TPU_F32, 1, 3, 0));
  tpu_hv ok = tpu_hlo_unary(m, TPU_HLO_NEG, a);
  CHECK(ok >= 0 && tpu_hlo_ok(m), "neg before the error");
  tpu_hv bad = tpu_hlo_binary(m, TPU_HLO_ADD, a, b);
  CHECK(bad == TPU_HV_NONE && !tpu_hlo_ok(m), "mismatched add must fail");
  /* Everything after returns NONE and the first error stays. */
  int64_t d4 = 4;
  CHECK(tpu_hlo_binary(m, TPU_HLO_ADD, a, a) == TPU_HV_NONE, "op after error");
  CHECK(tpu_hlo_unary(m, TPU_HLO_NEG, ok) == TPU_HV_NONE, "unary after error");
  CHECK(tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0)) == TPU_HV_NONE, "param after error");
  CHECK(tpu_hlo_constant(m, TPU_F32, 1) == TPU_HV_NONE, "constant after error");
  CHECK(tpu_hlo_iota(m, ty(TPU_S32, 1, 4, 0), 0) == TPU_HV_NONE, "iota after error");
  CHECK(tpu_hlo_reshape(m, a, 1, &d4) == TPU_HV_NONE, "reshape after error (a second error)");
  tpu_hlo_type st = scalar(TPU_F32);
  tpu_hv arg = 0;
  tpu_hlo_region_begin(m, &st, 1, &arg);
  CHECK(arg == TPU_HV_NONE, "region arg after error");
  CHECK(tpu_hlo_region_end(m, &arg, 1) == -1, "region after error");
  int64_t d0 = 0;
  CHECK(tpu_hlo_reduce(m, a, a, &d0, 1, TPU_HLO_ADD) == TPU_HV_NONE, "reduce after error");
  tpu_hv outs[2] = {0, 0};
  CHECK(!tpu_hlo_emit(m, "stablehlo.foo", &a, 1, NULL, 0, NULL, &st, 2, outs) && outs[0] == TPU_HV_NONE &&
            outs[1] == TPU_HV_NONE,
        "emit after error");
  tpu_hlo_fail(m, TPU_ERR_VALUE, "a later explicit failure");
  expect_error(finish_err(m, &ok, 1), TPU_ERR_RUNTIME,
               "stablehlo.add: operand types tensor<2xf32> and tensor<3xf32> differ", "first error wins");
  expect_error(finish_err(m, &ok, 1), TPU_ERR_RUNTIME, "hlo: already finished with an error", "second finish");
  tpu_hlo_free(m);

  /* One module per error kind: the message and code. */
  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  CHECK(tpu_hlo_reshape(m, a, 1, &d4) == TPU_HV_NONE, "bad reshape");
  expect_error(finish_err(m, &a, 1), TPU_ERR_VALUE,
               "stablehlo.reshape: cannot reshape tensor<2x3xf32> to tensor<4xf32>", "reshape");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  CHECK(tpu_hlo_unary(m, TPU_HLO_NEG, 42) == TPU_HV_NONE, "bad handle");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "hlo: invalid value handle 42", "handle");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  tpu_hlo_region_begin(m, &st, 1, &arg);
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "hlo: a region was left open", "open region");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  tpu_hv r = tpu_hlo_convert(m, a, TPU_F64);
  tpu_hlo_param_alias(m, a, 0);
  CHECK(tpu_hlo_ok(m), "alias is checked at finish");
  expect_error(finish_err(m, &r, 1), TPU_ERR_RUNTIME, "hlo: parameter 0 aliases result 0 of another type",
               "alias type");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  tpu_hlo_param_alias(m, a, 3);
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "hlo: parameter 0 aliases result 3 of another type",
               "alias index");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  tpu_hlo_param_alias(m, tpu_hlo_unary(m, TPU_HLO_NEG, a), 0);
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "hlo: alias of a value that is not a parameter", "alias value");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  CHECK(tpu_hlo_iota(m, ty(TPU_S32, 1, 4, 0), 1) == TPU_HV_NONE, "bad iota");
  expect_error(finish_err(m, NULL, 0), TPU_ERR_RUNTIME, "stablehlo.iota: dimension 1 out of range for rank 1", "iota");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  b = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  int64_t lc = 1, rc = 1, rc0 = 0;
  CHECK(tpu_hlo_dot_general(m, a, b, 0, NULL, NULL, 1, &lc, &rc, TPU_HLO_PREC_DEFAULT, TPU_INVALID) >= 0, "good dot");
  CHECK(tpu_hlo_dot_general(m, a, b, 0, NULL, NULL, 1, &lc, &rc0, TPU_HLO_PREC_DEFAULT, TPU_INVALID) == TPU_HV_NONE,
        "bad dot");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME,
               "stablehlo.dot_general: operand types tensor<2x3xf32> and tensor<2x3xf32> differ", "dot");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  CHECK(tpu_hlo_select(m, a, a, a) == TPU_HV_NONE, "select on a float predicate");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME,
               "stablehlo.select: predicate must be i1 of the operands' shape or 0-d", "select");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  CHECK(tpu_hlo_binary(m, TPU_HLO_NEG, a, a) == TPU_HV_NONE, "unary op as binary");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "hlo: op stablehlo.negate is not binary", "binary");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  CHECK(tpu_hlo_bitcast_convert(m, a, TPU_F16) == TPU_HV_NONE, "bitcast of another width");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "stablehlo.bitcast_convert: element sizes differ", "bitcast");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  int64_t s1 = 1, l3 = 3;
  CHECK(tpu_hlo_slice(m, a, &s1, &l3, NULL) == TPU_HV_NONE, "slice out of bounds");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "stablehlo.slice: bad bounds in dimension 0", "slice");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
  b = tpu_hlo_param(m, ty(TPU_F32, 2, 3, 3));
  tpu_hv ab[2] = {a, b};
  CHECK(tpu_hlo_concat(m, ab, 2, 0) >= 0, "concat along 0");
  CHECK(tpu_hlo_concat(m, ab, 2, 1) == TPU_HV_NONE, "concat along 1");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME,
               "stablehlo.concatenate: operand types tensor<2x3xf32> and tensor<3x3xf32> differ", "concat");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 3, 0));
  int64_t d23[2] = {2, 4}, bd = 1;
  CHECK(tpu_hlo_broadcast_in_dim(m, a, 2, d23, &bd) == TPU_HV_NONE, "broadcast that does not fit");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "stablehlo.broadcast_in_dim: dimension 0 does not fit",
               "broadcast");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  tpu_hlo_fail(m, TPU_ERR_UNIMPLEMENTED, "op %s is not lowered", "aten::foo");
  tpu_hlo_fail(m, TPU_ERR_VALUE, "ignored");
  expect_error(finish_err(m, NULL, 0), TPU_ERR_UNIMPLEMENTED, "op aten::foo is not lowered", "explicit fail");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  CHECK(tpu_hlo_region_end(m, NULL, 0) == -1, "region_end without begin");
  expect_error(finish_err(m, NULL, 0), TPU_ERR_RUNTIME, "hlo: region_end without region_begin", "region_end");
  tpu_hlo_free(m);

  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  CHECK(tpu_hlo_emit(m, "stablehlo.reduce", &a, 1, &(int){3}, 1, NULL, &st, 1, outs) == false, "bad region id");
  expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "stablehlo.reduce: invalid or already used region 3",
               "region id");
  tpu_hlo_free(m);

  /* A region is consumed by exactly one op. */
  m = tpu_hlo_new();
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 2, 0));
  tpu_hlo_type sts[2] = {st, st};
  tpu_hv ra[2];
  tpu_hlo_region_begin(m, sts, 2, ra);
  tpu_hv sum = tpu_hlo_binary(m, TPU_HLO_ADD, ra[0], ra[1]);
  int reg = tpu_hlo_region_end(m, &sum, 1);
  tpu_hv z = tpu_hlo_constant(m, TPU_F32, 0), red[2];
  int64_t dz = 0;
  CHECK(tpu_hlo_reduce_region(m, &a, &z, 1, &dz, 1, reg, &red[0]), "first use of a region");
  CHECK(!tpu_hlo_reduce_region(m, &a, &z, 1, &dz, 1, reg, &red[1]), "second use of a region");
  expect_error(finish_err(m, red, 1), TPU_ERR_RUNTIME, "stablehlo.reduce: invalid or already used region 0",
               "region reuse");
  tpu_hlo_free(m);
}


/* ---- checks added with the hardening pass ------------------------------------------------- */

/* Rounding to the narrow float formats happens here, not in the parser. */
static void test_float_rounding(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv c[] = {
      tpu_hlo_constant(m, TPU_F16, 65519.0),               /* rounds down to the largest f16 */
      tpu_hlo_constant(m, TPU_F16, 65520.0),               /* the first value that rounds to inf */
      tpu_hlo_constant(m, TPU_BF16, 1.0 / 3),              /* 8 significant bits */
      tpu_hlo_constant(m, TPU_F16, 1e-8),                  /* below half the smallest subnormal: 0 */
      tpu_hlo_constant(m, TPU_F16, 6e-8),                  /* the smallest subnormal, 2^-24 */
      tpu_hlo_constant(m, TPU_F32, 3.4028235677973366e38), /* FLT_MAX + 1 ulp/2: inf (ties to even) */
      tpu_hlo_constant(m, TPU_F32, 3.4028235e38),          /* FLT_MAX itself */
      tpu_hlo_constant(m, TPU_S32, 1e30),                  /* saturates, then wraps like a cast */
      tpu_hlo_constant(m, TPU_U64, 1.8e19),
      tpu_hlo_constant(m, TPU_F32, 1e-30), /* MLIR needs the '.': 1.0e-30 */
  };
  enum { N = sizeof c / sizeof c[0] };
  char *text = finish(m, c, N, "rounding");
  if (!text) return;
  static const char *want[N] = {
      KONST(0, "65504.0", "f16"),
      KONST(1, "0x7C00", "f16"),
      KONST(2, "0.333984375", "bf16"),
      KONST(3, "0.0", "f16"),
      KONST(4, "5.96046448e-08", "f16"),
      KONST(5, "0x7F800000", "f32"),
      KONST(6, "3.40282347e+38", "f32"),
      KONST(7, "-1", "i32"),
      KONST(8, "18000000000000000000", "ui64"),
      KONST(9, "1.0e-30", "f32"),
  };
  for (int i = 0; i < N; i++) CHECK(strstr(text, want[i]) != NULL, "rounding: missing %s in\n%s", want[i], text);
  free(text);
}

/* typeof's pointer survives many later values (records never move). */
static void test_typeof_stable(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv x = tpu_hlo_param(m, ty(TPU_F32, 2, 5, 7));
  const tpu_hlo_type *t = tpu_hlo_typeof(m, x);
  tpu_hv y = x;
  for (int i = 0; i < 2000; i++) y = tpu_hlo_unary(m, TPU_HLO_NEG, y);
  CHECK(t == tpu_hlo_typeof(m, x) && t->dims[0] == 5 && t->dims[1] == 7, "typeof pointer moved");
  CHECK(y == 2000 && tpu_hlo_typeof(m, y)->dims[1] == 7, "handle %d", y);
  size_t len = 0;
  char *text = NULL;
  tpu_status *s = tpu_hlo_finish(m, &y, 1, &text, &len);
  CHECK(s == NULL && text && len > 2000 * 60, "long program: %zu bytes", len);
  tpu_status_free(s);
  free(text);
  tpu_hlo_free(m);
}

/* Build a module with `bad`, expect finish to report code/msg. */
#define EXPECT_BAD(code, msg, ...)                        \
  do {                                                    \
    tpu_hlo *m = tpu_hlo_new();                           \
    __VA_ARGS__;                                          \
    expect_error(finish_err(m, NULL, 0), code, msg, msg); \
    tpu_hlo_free(m);                                      \
  } while (0)

static void test_checks(void) {
  tpu_hlo_type f = ty(TPU_F32, 1, 4, 0), st = scalar(TPU_F32), i32 = ty(TPU_S32, 1, 4, 0);
  tpu_hlo_type sts[2] = {st, st};
  (void)sts;
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.sqrt: operand type tensor<4xi32> has an unsupported element type",
             tpu_hlo_unary(m, TPU_HLO_SQRT, tpu_hlo_param(m, i32)));
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.shift_left: operand type tensor<4xf32> has an unsupported element type",
             tpu_hv a = tpu_hlo_param(m, f);
             tpu_hlo_binary(m, TPU_HLO_SHL, a, a));
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.and: operand type tensor<4xf32> has an unsupported element type",
             tpu_hv a = tpu_hlo_param(m, f);
             tpu_hlo_binary(m, TPU_HLO_AND, a, a));
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.complex: operand type tensor<4xi32> has an unsupported element type",
             tpu_hv a = tpu_hlo_param(m, i32);
             tpu_hlo_binary(m, TPU_HLO_COMPLEX, a, a));
  /* Remainder of complex values crashes XLA's CPU plugin (not merely fails); the others do not compile. */
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.remainder: operand type tensor<4xcomplex<f32>> has an unsupported element type",
             tpu_hv a = tpu_hlo_param(m, ty(TPU_C64, 1, 4, 0));
             tpu_hlo_binary(m, TPU_HLO_REM, a, a));
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.cbrt: operand type tensor<4xcomplex<f32>> has an unsupported element type",
             tpu_hlo_unary(m, TPU_HLO_CBRT, tpu_hlo_param(m, ty(TPU_C64, 1, 4, 0))));
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.abs: operand type tensor<4xui8> has an unsupported element type",
             tpu_hlo_unary(m, TPU_HLO_ABS, tpu_hlo_param(m, ty(TPU_U8, 1, 4, 0))));
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.compare: direction 2 is not defined for complex<f32>",
             tpu_hv a = tpu_hlo_param(m, ty(TPU_C64, 1, 4, 0));
             tpu_hlo_compare(m, TPU_HLO_LT, a, a));
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.convert: complex<f32> to f32 drops the imaginary part; take REAL first",
             tpu_hlo_convert(m, tpu_hlo_param(m, ty(TPU_C64, 1, 4, 0)), TPU_F32));
  EXPECT_BAD(TPU_ERR_VALUE, "hlo: parameter: invalid type tensor<?> (dtype 0, rank 0)",
             tpu_hlo_param(m, scalar(TPU_INVALID)));
  EXPECT_BAD(TPU_ERR_VALUE, "hlo: parameter: invalid type tensor<-1xf32> (dtype 11, rank 1)",
             tpu_hlo_param(m, ty(TPU_F32, 1, -1, 0)));
  /* A region's values stay inside it. */
  EXPECT_BAD(TPU_ERR_RUNTIME, "hlo: value %v0 is used outside the region that defines it", tpu_hv ra[2];
             tpu_hlo_region_begin(m, sts, 2, ra); tpu_hlo_region_end(m, ra, 1); tpu_hlo_unary(m, TPU_HLO_NEG, ra[0]));
  EXPECT_BAD(TPU_ERR_RUNTIME, "hlo: region 0 was closed but never used", tpu_hv ra[2];
             tpu_hlo_region_begin(m, sts, 2, ra); tpu_hlo_region_end(m, ra, 1));
  /* A region closed inside another region belongs there. */
  EXPECT_BAD(TPU_ERR_RUNTIME, "stablehlo.reduce: region 0 belongs to another block", tpu_hv ra[2], rb[2];
             tpu_hv x = tpu_hlo_param(m, f); tpu_hv z = tpu_hlo_constant(m, TPU_F32, 0);
             tpu_hlo_region_begin(m, sts, 2, ra); tpu_hlo_region_begin(m, sts, 2, rb);
             int inner = tpu_hlo_region_end(m, rb, 1); tpu_hlo_region_end(m, ra, 1); int64_t d0 = 0; tpu_hv o;
             tpu_hlo_reduce_region(m, &x, &z, 1, &d0, 1, inner, &o));
  /* Region signatures are checked by the op that takes them. */
  EXPECT_BAD(TPU_ERR_RUNTIME,
             "stablehlo.sort: region 0 has signature (tensor<f32>, tensor<f32>) -> (tensor<f32>), want "
             "(tensor<f32>, tensor<f32>) -> (tensor<i1>)",
             tpu_hv x = tpu_hlo_param(m, f);
             tpu_hv ra[2]; tpu_hlo_region_begin(m, sts, 2, ra); int r = tpu_hlo_region_end(m, ra, 1); tpu_hv o;
             tpu_hlo_sort(m, &x, 1, 0, true, r, &o));
  EXPECT_BAD(TPU_ERR_RUNTIME,
             "stablehlo.reduce: region 0 has signature (tensor<f32>) -> (tensor<f32>), want "
             "(tensor<f32>, tensor<f32>) -> (tensor<f32>)",
             tpu_hv x = tpu_hlo_param(m, f);
             tpu_hv z = tpu_hlo_constant(m, TPU_F32, 0); tpu_hv ra[1]; tpu_hlo_region_begin(m, &st, 1, ra);
             int r = tpu_hlo_region_end(m, ra, 1); int64_t d0 = 0; tpu_hv o;
             tpu_hlo_reduce_region(m, &x, &z, 1, &d0, 1, r, &o));
  EXPECT_BAD(TPU_ERR_RUNTIME, "stablehlo.reduce: operand types tensor<4xf32> and tensor<i32> differ",
             tpu_hv x = tpu_hlo_param(m, f);
             tpu_hv z = tpu_hlo_constant_int(m, TPU_S32, 0); int64_t d0 = 0;
             tpu_hlo_reduce(m, x, z, &d0, 1, TPU_HLO_ADD));
  EXPECT_BAD(TPU_ERR_INDEX, "stablehlo.sort: dimension 1 out of range for rank 1", tpu_hv x = tpu_hlo_param(m, f);
             tpu_hv ra[2]; tpu_hlo_region_begin(m, sts, 2, ra);
             tpu_hv lt = tpu_hlo_compare(m, TPU_HLO_LT, ra[0], ra[1]); int r = tpu_hlo_region_end(m, &lt, 1); tpu_hv o;
             tpu_hlo_sort(m, &x, 1, 1, true, r, &o));
  EXPECT_BAD(TPU_ERR_RUNTIME, "stablehlo.sort: 9 operands (1 to 8 supported)", tpu_hv xs[9] = {0}; tpu_hv o[9];
             tpu_hlo_sort(m, xs, 9, 0, true, 0, o));
  /* Out-of-range dimension numbers are errors, never out-of-bounds reads. */
  int64_t d33[33];
  for (int i = 0; i < 33; i++) d33[i] = 1;
  char ones33[300] = "stablehlo.dot_general: operand types ", t33[120] = "tensor<";
  for (int i = 0; i < 33; i++) strcat(t33, "1x");
  strcat(t33, "f32>");
  strcat(strcat(strcat(strcat(ones33, t33), " and "), t33), " differ"); /* a result of 66 dims */
  EXPECT_BAD(TPU_ERR_RUNTIME, ones33, tpu_hv a = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 33, d33));
             tpu_hlo_dot_general(m, a, a, 0, NULL, NULL, 0, NULL, NULL, TPU_HLO_PREC_DEFAULT, TPU_INVALID));
  EXPECT_BAD(TPU_ERR_RUNTIME, "stablehlo.dot_general: operand types tensor<4xf32> and tensor<4xf32> differ",
             tpu_hv a = tpu_hlo_param(m, f);
             int64_t big = 5, zero = 0;
             tpu_hlo_dot_general(m, a, a, 0, NULL, NULL, 1, &big, &zero, TPU_HLO_PREC_DEFAULT, TPU_INVALID));
  EXPECT_BAD(TPU_ERR_RUNTIME,
             "stablehlo.gather: bad dimension numbers, slice sizes or types for: operand types tensor<4xf32> and "
             "tensor<2x1xi32> differ",
             tpu_hv a = tpu_hlo_param(m, f);
             tpu_hv ix = tpu_hlo_param(m, ty(TPU_S32, 2, 2, 1)); tpu_hlo_gather_dims g = {0}; g.n_offset = 100;
             int64_t ss = 1; tpu_hlo_gather(m, a, ix, &g, &ss, ty(TPU_F32, 1, 2, 0)));
  EXPECT_BAD(TPU_ERR_TYPE, "stablehlo.rng_bit_generator: state has type tensor<2xui32>, want tensor<2xui64>",
             tpu_hv s = tpu_hlo_param(m, ty(TPU_U32, 1, 2, 0));
             tpu_hv ns; tpu_hlo_rng_bit_generator(m, s, ty(TPU_U32, 1, 4, 0), &ns));
  EXPECT_BAD(TPU_ERR_TYPE,
             "stablehlo.dynamic_slice: start index 0 has type tensor<f32>; want 0-d integers of one dtype",
             tpu_hv a = tpu_hlo_param(m, f);
             tpu_hv s0 = tpu_hlo_constant(m, TPU_F32, 0); int64_t sz = 2; tpu_hlo_dynamic_slice(m, a, &s0, &sz));
  EXPECT_BAD(TPU_ERR_VALUE, "stablehlo.dynamic_slice: size 5 out of range in dimension 0",
             tpu_hv a = tpu_hlo_param(m, f);
             tpu_hv s0 = tpu_hlo_constant_int(m, TPU_S32, 0); int64_t sz = 5; tpu_hlo_dynamic_slice(m, a, &s0, &sz));
  EXPECT_BAD(TPU_ERR_RUNTIME, "stablehlo.pad: operand types tensor<4xf32> and tensor<i32> differ",
             tpu_hv a = tpu_hlo_param(m, f);
             tpu_hv z = tpu_hlo_constant_int(m, TPU_S32, 0); int64_t one = 1; tpu_hlo_pad(m, a, z, &one, &one, NULL));
  EXPECT_BAD(TPU_ERR_INDEX, "stablehlo.reverse: bad dimension list", tpu_hv a = tpu_hlo_param(m, f); int64_t d = 1;
             tpu_hlo_reverse(m, a, &d, 1));
  EXPECT_BAD(TPU_ERR_RUNTIME,
             "stablehlo.convolution: ranks, dtypes or group counts do not fit for: operand types tensor<1x3x5x5xf32> "
             "and tensor<2x2x3x3xf32> differ",
             int64_t di[4] = {1, 3, 5, 5};
             int64_t dk[4] = {2, 2, 3, 3}; tpu_hv in = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 4, di));
             tpu_hv k = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 4, dk));
             tpu_hlo_convolution(m, in, k, 2, NULL, NULL, NULL, NULL, 1, 1, TPU_HLO_PREC_DEFAULT));
  {
    tpu_hlo *m = tpu_hlo_new();
    tpu_hv a = tpu_hlo_param(m, f), b = tpu_hlo_param(m, f);
    tpu_hlo_param_alias(m, a, 0);
    tpu_hlo_param_alias(m, b, 0);
    expect_error(finish_err(m, &a, 1), TPU_ERR_RUNTIME, "hlo: parameters 0 and 1 both alias result 0", "alias twice");
    tpu_hlo_free(m);
  }
  /* Without an earlier error, TPU_HV_NONE is itself the error. */
  EXPECT_BAD(TPU_ERR_RUNTIME, "hlo: invalid value handle -1", tpu_hlo_unary(m, TPU_HLO_NEG, TPU_HV_NONE));
}

/* ---- determinism ---------------------------------------------------------------------------- */

static char *build_mlp(int hidden, size_t *len) {
  tpu_hlo *m = tpu_hlo_new();
  int64_t dx[2] = {4, 8}, dw[2] = {8, hidden};
  tpu_hv x = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 2, dx));
  tpu_hv w = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 2, dw));
  int64_t lc = 1, rc = 0;
  tpu_hv h = tpu_hlo_dot_general(m, x, w, 0, NULL, NULL, 1, &lc, &rc, TPU_HLO_PREC_DEFAULT, TPU_INVALID);
  const tpu_hlo_type *ht = tpu_hlo_typeof(m, h);
  tpu_hv zero = tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant(m, TPU_F32, 0), ht->rank, ht->dims, NULL);
  h = tpu_hlo_binary(m, TPU_HLO_MAX, h, zero);
  int64_t d1 = 1;
  tpu_hv s = tpu_hlo_reduce(m, h, tpu_hlo_constant(m, TPU_F32, 0), &d1, 1, TPU_HLO_ADD);
  char *text = NULL;
  tpu_status *st = tpu_hlo_finish(m, &s, 1, &text, len);
  CHECK(st == NULL, "mlp: %s", st ? tpu_status_message(st) : "");
  tpu_status_free(st);
  tpu_hlo_free(m);
  return text;
}

static void test_determinism(void) {
  size_t la = 0, lb = 0, lc = 0;
  char *a = build_mlp(16, &la), *b = build_mlp(16, &lb), *c = build_mlp(32, &lc);
  CHECK(a && b && c, "mlp texts");
  if (a && b && c) {
    CHECK(la == lb && memcmp(a, b, la) == 0, "same calls gave different text");
    CHECK(tpu_hlo_hash(a, la) == tpu_hlo_hash(b, lb), "same text, different hash");
    CHECK(tpu_hlo_hash(a, la) != tpu_hlo_hash(c, lc), "different programs, same hash");
  }
  free(a);
  free(b);
  free(c);
  /* FNV-1a 64 test vectors. */
  CHECK(tpu_hlo_hash("", 0) == 0xcbf29ce484222325ull, "hash of empty");
  CHECK(tpu_hlo_hash("a", 1) == 0xaf63dc4c8601ec8cull, "hash of a");
  CHECK(tpu_hlo_hash("foobar", 6) == 0x85944171f73967e8ull, "hash of foobar");
}

/* With exact division on, a float divisor that XLA may see as a broadcast or
 * a constant goes through an optimization barrier; a parameter, an integer
 * divisor or exact division off leave the divide as it is. */
static int count_of(const char *text, const char *what) {
  int n = 0;
  for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
  return n;
}

static void test_exact_division(void) {
  for (int on = 0; on < 2; on++) {
    tpu_hlo *m = tpu_hlo_new();
    tpu_hlo_set_exact_division(m, on);
    int64_t d3 = 3, d23[2] = {2, 3}, bd = 1;
    tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3)), b = tpu_hlo_param(m, tpu_hlo_type_make(TPU_F32, 1, &d3));
    tpu_hv bb = tpu_hlo_broadcast_in_dim(m, b, 2, d23, &bd);
    tpu_hv sq = tpu_hlo_unary(m, TPU_HLO_SQRT, bb); /* a broadcast XLA may sink the sqrt below */
    tpu_hv k = tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant(m, TPU_F32, 3), 2, d23, NULL);
    tpu_hv i = tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant_int(m, TPU_S32, 3), 2, d23, NULL);
    tpu_hv ia = tpu_hlo_convert(m, a, TPU_S32);
    tpu_hv r[5] = {tpu_hlo_binary(m, TPU_HLO_DIV, a, bb), tpu_hlo_binary(m, TPU_HLO_DIV, a, sq),
                   tpu_hlo_binary(m, TPU_HLO_DIV, a, k), tpu_hlo_binary(m, TPU_HLO_DIV, bb, a),
                   tpu_hlo_binary(m, TPU_HLO_DIV, ia, i)};
    char *text = finish(m, r, 5, "exact division");
    if (!text) continue;
    int want = on ? 3 : 0;
    CHECK(count_of(text, "stablehlo.optimization_barrier") == want, "exact division %d: %d barriers, want %d\n%s", on,
          count_of(text, "stablehlo.optimization_barrier"), want, text);
    CHECK(count_of(text, "stablehlo.divide") == 5, "exact division %d: divides\n%s", on, text);
    free(text);
  }
  /* atan2 by a constant: XLA would make it atan; the constant goes behind a barrier */
  for (int on = 0; on < 2; on++) {
    tpu_hlo *m = tpu_hlo_new();
    tpu_hlo_set_exact_division(m, on);
    int64_t d23[2] = {2, 3};
    tpu_hv x = tpu_hlo_param(m, ty(TPU_F32, 2, 2, 3));
    tpu_hv r =
        tpu_hlo_binary(m, TPU_HLO_ATAN2, x, tpu_hlo_broadcast_in_dim(m, tpu_hlo_constant(m, TPU_F32, 1), 2, d23, NULL));
    char *text = finish(m, &r, 1, "exact atan2");
    if (!text) continue;
    CHECK(count_of(text, "stablehlo.optimization_barrier") == on && count_of(text, "stablehlo.atan2") == 1,
          "atan2 %d:\n%s", on, text);
    free(text);
  }
  /* rsqrt: 1 / sqrt(x) behind a barrier with exact division on */
  for (int on = 0; on < 2; on++) {
    tpu_hlo *m = tpu_hlo_new();
    tpu_hlo_set_exact_division(m, on);
    tpu_hv r = tpu_hlo_unary(m, TPU_HLO_RSQRT, tpu_hlo_param(m, ty(TPU_BF16, 2, 2, 3)));
    CHECK(tpu_hlo_typeof(m, r)->dtype == TPU_BF16, "rsqrt %d: type", on);
    char *text = finish(m, &r, 1, "exact rsqrt");
    if (!text) continue;
    CHECK(count_of(text, "stablehlo.rsqrt") == !on && count_of(text, "stablehlo.sqrt") == on &&
              count_of(text, "stablehlo.optimization_barrier") == on && count_of(text, "stablehlo.divide") == on,
          "rsqrt %d:\n%s", on, text);
    free(text);
  }
}

/* tpu_hash64, the in-memory signature hash: the same bytes give the same
 * value; a change of any byte, including the tail past the last whole word,
 * or of the length (zeros of two lengths) gives another; inputs shorter than
 * a word are read within their bounds (ASan). */
static void test_hash64(void) {
  uint8_t buf[37];
  for (int i = 0; i < 37; i++) buf[i] = (uint8_t)(i * 7 + 1);
  uint64_t h = tpu_hash64(buf, sizeof buf);
  CHECK(h == tpu_hash64(buf, sizeof buf), "hash64 is deterministic");
  int same = 0;
  for (int i = 0; i < 37; i++) {
    buf[i] ^= 0x10;
    same += tpu_hash64(buf, sizeof buf) == h;
    buf[i] ^= 0x10;
  }
  CHECK(same == 0, "hash64 changes with each byte (%d unchanged)", same);
  uint8_t zeros[16] = {0};
  int collide = 0;
  for (size_t a = 0; a <= 16; a++)
    for (size_t b = a + 1; b <= 16; b++) collide += tpu_hash64(zeros, a) == tpu_hash64(zeros, b);
  CHECK(collide == 0, "hash64 depends on the length (%d collisions)", collide);
  uint8_t *tiny = malloc(3);
  memcpy(tiny, "abc", 3);
  CHECK(tpu_hash64(tiny, 3) != tpu_hash64("abd", 3), "hash64 of 3 bytes");
  free(tiny);
}

/* ---- SPMD: shardings and sharded modules ------------------------------------------------- */

/* A sharding over a mesh of mesh_rank axes (m[0..)) of a rank-`rank`
 * tensor whose dims 0 and 1 are split over axes d0 and d1 (-1: none). */
static tpu_sharding sh(int mesh_rank, const int64_t *mesh, int rank, int d0, int d1) {
  int8_t da[TPU_MAX_RANK];
  memset(da, -1, sizeof da);
  da[0] = (int8_t)d0;
  da[1] = (int8_t)d1;
  return tpu_sharding_make(mesh_rank, mesh, rank, da);
}

static void expect_gspmd(const tpu_sharding *s, const char *want, const char *what) {
  char buf[256];
  int n = tpu_sharding_gspmd(s, buf, sizeof buf);
  CHECK(n == (int)strlen(want) && strcmp(buf, want) == 0, "%s: gspmd \"%s\" (%d), want \"%s\"", what, buf, n, want);
}

static void expect_sdy(const tpu_sharding *s, const char *const *names, const char *want, const char *what) {
  char buf[256];
  int n = tpu_sharding_sdy(s, names, buf, sizeof buf);
  CHECK(n == (int)strlen(want) && strcmp(buf, want) == 0, "%s: sdy \"%s\" (%d), want \"%s\"", what, buf, n, want);
}

static void test_sharding_strings(void) {
  int64_t m4[1] = {4}, m22[2] = {2, 2}, m23[2] = {2, 3}, m222[3] = {2, 2, 2}, m41[2] = {4, 1}, m21[2] = {2, 1};
  /* 1-D mesh */
  tpu_sharding s = sh(1, m4, 1, 0, -1);
  expect_gspmd(&s, "{devices=[4]0,1,2,3}", "[4] dim0");
  s = sh(1, m4, 2, -1, 0);
  expect_gspmd(&s, "{devices=[1,4]0,1,2,3}", "[4] dim1");
  s = sh(1, m4, 2, -1, -1);
  expect_gspmd(&s, "{replicated}", "[4] replicated");
  s = sh(1, m4, 0, -1, -1);
  expect_gspmd(&s, "{replicated}", "[4] scalar");
  /* 2-D meshes */
  s = sh(2, m22, 2, 0, -1);
  expect_gspmd(&s, "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", "2x2 dim0 on 0");
  s = sh(2, m22, 2, 1, -1);
  expect_gspmd(&s, "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}", "2x2 dim0 on 1");
  s = sh(2, m22, 2, 0, 1);
  expect_gspmd(&s, "{devices=[2,2]0,1,2,3}", "2x2 both");
  s = sh(2, m22, 2, 1, 0);
  expect_gspmd(&s, "{devices=[2,2]0,2,1,3}", "2x2 both, swapped");
  s = sh(2, m22, 2, -1, 1);
  expect_gspmd(&s, "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}", "2x2 dim1 on 1");
  s = sh(2, m23, 1, 1, -1);
  expect_gspmd(&s, "{devices=[3,2]0,3,1,4,2,5 last_tile_dim_replicate}", "2x3 dim0 on 1");
  s = sh(2, m23, 2, 1, 0);
  expect_gspmd(&s, "{devices=[3,2]0,3,1,4,2,5}", "2x3 both, swapped");
  s = sh(3, m222, 2, 1, -1);
  expect_gspmd(&s, "{devices=[2,1,4]0,1,4,5,2,3,6,7 last_tile_dim_replicate}", "2x2x2 dim0 on 1");
  /* axes of size 1: no replicate dimension, or nothing split at all */
  s = sh(2, m21, 1, 0, -1);
  expect_gspmd(&s, "{devices=[2]0,1}", "2x1 dim0 on 0");
  s = sh(2, m41, 1, 1, -1);
  CHECK(tpu_sharding_is_replicated(&s), "split over an axis of size 1 is replicated");
  expect_gspmd(&s, "{replicated}", "4x1 dim0 on 1");
  s = sh(2, m22, 2, 0, -1);
  CHECK(!tpu_sharding_is_replicated(&s), "split is not replicated");
  /* snprintf semantics */
  char small[8];
  int n = tpu_sharding_gspmd(&s, small, sizeof small);
  CHECK(n == 48 && strcmp(small, "{device") == 0, "truncated gspmd: %d \"%s\"", n, small);
  CHECK(tpu_sharding_gspmd(&s, NULL, 0) == 48, "gspmd length only");
  s = sh(2, m22, 2, 0, 0);
  CHECK(tpu_sharding_gspmd(&s, small, sizeof small) == -1 && small[0] == 0, "gspmd of a bad sharding");
  /* Shardy */
  const char *xy[2] = {"x", "y_1"};
  s = sh(2, m22, 2, 0, -1);
  expect_sdy(&s, NULL, "#sdy.sharding<@mesh, [{\"a0\"}, {}]>", "sdy dim0");
  expect_sdy(&s, xy, "#sdy.sharding<@mesh, [{\"x\"}, {}]>", "sdy dim0 named");
  s = sh(2, m22, 2, 1, 0);
  expect_sdy(&s, xy, "#sdy.sharding<@mesh, [{\"y_1\"}, {\"x\"}]>", "sdy both");
  s = sh(2, m22, 2, -1, -1);
  expect_sdy(&s, NULL, "#sdy.sharding<@mesh, [{}, {}]>", "sdy replicated");
  s = sh(1, m4, 0, -1, -1);
  expect_sdy(&s, NULL, "#sdy.sharding<@mesh, []>", "sdy scalar");
  char buf[160];
  n = tpu_sdy_mesh(2, m22, NULL, buf, sizeof buf);
  const char *want = "\"sdy.mesh\"() {mesh = #sdy.mesh<[\"a0\"=2, \"a1\"=2]>, sym_name = \"mesh\"} : () -> ()";
  CHECK(n == (int)strlen(want) && strcmp(buf, want) == 0, "sdy mesh: \"%s\"", buf);
  n = tpu_sdy_mesh(1, m4, xy, buf, sizeof buf);
  want = "\"sdy.mesh\"() {mesh = #sdy.mesh<[\"x\"=4]>, sym_name = \"mesh\"} : () -> ()";
  CHECK(n == (int)strlen(want) && strcmp(buf, want) == 0, "sdy mesh named: \"%s\"", buf);
  const char *bad[2] = {"x", "x"}, *quote[2] = {"x", "a\"b"};
  CHECK(tpu_sdy_mesh(2, m22, bad, buf, sizeof buf) == -1 && buf[0] == 0, "sdy mesh with a name twice");
  s = sh(2, m22, 2, 0, -1);
  CHECK(tpu_sharding_sdy(&s, quote, buf, sizeof buf) == -1, "sdy sharding with a quote in a name");
}

static void expect_check(const tpu_sharding *s, const int64_t *dims, const char *msg, const char *what) {
  tpu_status *st = tpu_sharding_check(s, dims);
  if (!msg) {
    CHECK(st == NULL, "%s: %s", what, st ? tpu_status_message(st) : "");
    tpu_status_free(st);
    return;
  }
  expect_error(st, TPU_ERR_VALUE, msg, what);
}

static void test_sharding_geometry(void) {
  int64_t m22[2] = {2, 2}, m4[1] = {4}, m5[5] = {1, 1, 1, 1, 1}, m0[2] = {2, 0}, d46[2] = {4, 6}, d66[2] = {6, 6};
  tpu_sharding s = sh(2, m22, 2, 1, 0);
  expect_check(&s, d46, NULL, "valid");
  expect_check(&s, NULL, NULL, "valid without dims");
  CHECK(tpu_sharding_num_devices(&s) == 4, "devices");
  int64_t shard[2] = {0, 0}, off[2] = {0, 0};
  CHECK(tpu_sharding_shard_dims(&s, d46, shard) && shard[0] == 2 && shard[1] == 3, "shard %lld %lld",
        (long long)shard[0], (long long)shard[1]);
  /* device d has mesh coordinate (d / 2, d % 2); dim0 follows axis 1, dim1 axis 0 */
  const int64_t want[4][2] = {{0, 0}, {2, 0}, {0, 3}, {2, 3}};
  for (int d = 0; d < 4; d++) {
    CHECK(tpu_sharding_shard_offsets(&s, d46, d, off) && off[0] == want[d][0] && off[1] == want[d][1],
          "device %d offsets %lld %lld", d, (long long)off[0], (long long)off[1]);
  }
  CHECK(!tpu_sharding_shard_offsets(&s, d46, 4, off) && !tpu_sharding_shard_offsets(&s, d46, -1, off),
        "device out of range");
  s = sh(2, m22, 2, 0, -1); /* replicated over axis 1 */
  CHECK(tpu_sharding_shard_dims(&s, d46, shard) && shard[0] == 2 && shard[1] == 6, "partly replicated shard");
  CHECK(tpu_sharding_shard_offsets(&s, d46, 3, off) && off[0] == 2 && off[1] == 0, "device 3: %lld %lld",
        (long long)off[0], (long long)off[1]);
  s = sh(1, m4, 2, -1, 0);
  CHECK(tpu_sharding_shard_offsets(&s, (int64_t[]){3, 8}, 3, off) && off[0] == 0 && off[1] == 6, "1-D mesh offsets");
  /* validation */
  s = sh(2, m22, 2, 0, 1);
  expect_check(&s, d66, NULL, "6x6 over 2x2");
  s = sh(1, m4, 2, -1, 0);
  expect_check(&s, d46, "sharding: dimension 1 of size 6 is not divisible by mesh axis 0 of size 4", "divisible");
  CHECK(!tpu_sharding_shard_dims(&s, d46, shard), "shard dims of an indivisible sharding");
  s = sh(2, m22, 2, 2, -1);
  expect_check(&s, NULL, "sharding: dimension 0 is split over mesh axis 2, but the mesh has 2 axes", "axis range");
  s = sh(2, m22, 2, -1, -2);
  expect_check(&s, NULL, "sharding: dimension 1 is split over mesh axis -2, but the mesh has 2 axes", "axis -2");
  s = sh(2, m22, 2, 1, 1);
  expect_check(&s, NULL, "sharding: mesh axis 1 splits both dimension 0 and dimension 1", "axis twice");
  s = sh(5, m5, 1, -1, -1);
  expect_check(&s, NULL, "sharding: mesh rank 5 (0 to 4 supported)", "mesh rank");
  s = sh(2, m0, 1, -1, -1);
  expect_check(&s, NULL, "sharding: mesh axis 1 has size 0", "mesh axis size");
  s = sh(1, m4, TPU_MAX_RANK + 1, -1, -1);
  expect_check(&s, NULL, "sharding: tensor rank 65 (0 to 64 supported)", "tensor rank");
  int64_t big[2] = {1 << 13, 1 << 12};
  s = sh(2, big, 1, -1, -1);
  expect_check(&s, NULL, "sharding: a mesh of more than 16777216 devices", "too many devices");
  const char *empty[1] = {""}, *dup[2] = {"x", "x"}, *ok[2] = {"x", "Y_2"};
  expect_error(tpu_sdy_axis_names_check(1, empty), TPU_ERR_VALUE,
               "sharding: mesh axis 0's name must be 1 to 31 letters, digits or underscores", "empty name");
  expect_error(tpu_sdy_axis_names_check(2, dup), TPU_ERR_VALUE, "sharding: mesh axes 0 and 1 are both named \"x\"",
               "same name");
  CHECK(tpu_sdy_axis_names_check(2, ok) == NULL && tpu_sdy_axis_names_check(2, NULL) == NULL, "good names");
  /* equality looks at the mesh, the rank and the dims below the rank */
  tpu_sharding a = sh(2, m22, 1, 0, -1), b = sh(2, m22, 1, 0, 1);
  CHECK(tpu_sharding_eq(&a, &b), "dims past the rank are ignored");
  b = sh(2, m22, 1, 1, -1);
  CHECK(!tpu_sharding_eq(&a, &b), "another axis");
  b = sh(2, m22, 2, 0, -1);
  CHECK(!tpu_sharding_eq(&a, &b), "another rank");
  int64_t m24[2] = {2, 4};
  b = sh(2, m24, 1, 0, -1);
  CHECK(!tpu_sharding_eq(&a, &b), "another mesh");
  b = sh(1, m22, 1, 0, -1);
  CHECK(!tpu_sharding_eq(&a, &b), "another mesh rank");
}

/* Two sharded parameters (one donated), a constraint, two result shardings. */
static void build_sharded(tpu_hlo *m, tpu_hlo_partitioner p, const char *const *names, tpu_hv *res) {
  int64_t m22[2] = {2, 2};
  tpu_hlo_set_mesh(m, p, 2, m22, names);
  tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 8, 4)), b = tpu_hlo_param(m, ty(TPU_F32, 2, 8, 4));
  tpu_sharding rows = sh(2, m22, 2, 0, -1), tiles = sh(2, m22, 2, 0, 1), cols = sh(2, m22, 2, -1, 1),
               rep = sh(2, m22, 2, -1, -1);
  tpu_hlo_param_sharding(m, a, &rows);
  tpu_hlo_param_sharding(m, b, &tiles);
  tpu_hlo_param_alias(m, a, 1);
  tpu_hv s = tpu_hlo_binary(m, TPU_HLO_ADD, a, b);
  res[0] = tpu_hlo_sharding_constraint(m, s, &cols);
  res[1] = a;
  tpu_hlo_result_sharding(m, 0, &rep);
  tpu_hlo_result_sharding(m, 1, &rows);
}

#define T84 "tensor<8x4xf32>"
#define SPMD_HEAD "module @torchtpu attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {\n"

static void test_sharded_module(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv r[2];
  build_sharded(m, TPU_HLO_GSPMD, NULL, r);
  CHECK(tpu_hlo_ok(m), "gspmd module");
  expect(m, r, 2, "gspmd module",
         SPMD_HEAD "  func.func public @main(%v0: " T84
                   " {mhlo.sharding = \"{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}\", tf.aliasing_output = 1 : "
                   "i32}, %v1: " T84 " {mhlo.sharding = \"{devices=[2,2]0,1,2,3}\"}) -> (" T84
                   " {mhlo.sharding = \"{replicated}\"}, " T84
                   " {mhlo.sharding = \"{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}\"}) {\n"
                   "    %v2 = \"stablehlo.add\"(%v0, %v1) : (" T84 ", " T84 ") -> " T84
                   "\n"
                   "    %v3 = \"stablehlo.custom_call\"(%v2) {call_target_name = \"Sharding\", mhlo.sharding = "
                   "\"{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}\"} : (" T84 ") -> " T84
                   "\n"
                   "    \"func.return\"(%v3, %v0) : (" T84 ", " T84 ") -> ()\n" TAIL);
  m = tpu_hlo_new();
  const char *names[2] = {"x", "y"};
  build_sharded(m, TPU_HLO_SHARDY, names, r);
  CHECK(tpu_hlo_ok(m), "shardy module");
  expect(m, r, 2, "shardy module",
         SPMD_HEAD
         "  \"sdy.mesh\"() {mesh = #sdy.mesh<[\"x\"=2, \"y\"=2]>, sym_name = \"mesh\"} : () -> ()\n"
         "  func.func public @main(%v0: " T84
         " {sdy.sharding = #sdy.sharding<@mesh, [{\"x\"}, {}]>, tf.aliasing_output = 1 : i32}, %v1: " T84
         " {sdy.sharding = #sdy.sharding<@mesh, [{\"x\"}, {\"y\"}]>}) -> (" T84
         " {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, " T84
         " {sdy.sharding = #sdy.sharding<@mesh, [{\"x\"}, {}]>}) {\n"
         "    %v2 = \"stablehlo.add\"(%v0, %v1) : (" T84 ", " T84 ") -> " T84
         "\n"
         "    %v3 = \"sdy.sharding_constraint\"(%v2) {sharding = #sdy.sharding<@mesh, [{}, {\"y\"}]>} : (" T84
         ") -> " T84
         "\n"
         "    \"func.return\"(%v3, %v0) : (" T84 ", " T84 ") -> ()\n" TAIL);
  /* Nothing set, or only the defaults: the text of before. */
  const char *plain = HEAD
      "  func.func public @main(%v0: tensor<3xf32> {tf.aliasing_output = 0 : i32}) -> (tensor<3xf32>) {\n"
      "    \"func.return\"(%v0) : (tensor<3xf32>) -> ()\n" TAIL;
  for (int defaults = 0; defaults < 2; defaults++) {
    m = tpu_hlo_new();
    if (defaults) {
      tpu_hlo_set_num_partitions(m, 1);
      tpu_hlo_set_num_replicas(m, 1);
    }
    tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 1, 3, 0));
    tpu_hlo_param_alias(m, a, 0);
    expect(m, &a, 1, defaults ? "explicit defaults" : "nothing set", plain);
  }
  /* Replicas alone; a 1-D mesh whose result only is sharded. */
  m = tpu_hlo_new();
  tpu_hlo_set_num_replicas(m, 2);
  tpu_hv a = tpu_hlo_param(m, scalar(TPU_F32));
  expect(m, &a, 1, "replicas",
         "module @torchtpu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 2 : i32} {\n"
         "  func.func public @main(%v0: tensor<f32>) -> (tensor<f32>) {\n"
         "    \"func.return\"(%v0) : (tensor<f32>) -> ()\n" TAIL);
  m = tpu_hlo_new();
  int64_t m4 = 4;
  tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 1, &m4, NULL);
  a = tpu_hlo_param(m, ty(TPU_F32, 1, 16, 0));
  tpu_sharding split = sh(1, &m4, 1, 0, -1);
  tpu_hlo_result_sharding(m, 0, &split);
  expect(m, &a, 1, "1-D mesh",
         SPMD_HEAD
         "  func.func public @main(%v0: tensor<16xf32>) -> (tensor<16xf32> {mhlo.sharding = "
         "\"{devices=[4]0,1,2,3}\"}) {\n"
         "    \"func.return\"(%v0) : (tensor<16xf32>) -> ()\n" TAIL);
}

static void test_sharded_errors(void) {
  int64_t m22[2] = {2, 2}, m4 = 4;
  tpu_sharding rows = sh(2, m22, 2, 0, -1);
#define EXPECT_SHARD(code, msg, ...)                    \
  do {                                                  \
    tpu_hlo *m = tpu_hlo_new();                         \
    tpu_hv a = tpu_hlo_param(m, ty(TPU_F32, 2, 6, 4));  \
    __VA_ARGS__;                                        \
    expect_error(finish_err(m, &a, 1), code, msg, msg); \
    tpu_hlo_free(m);                                    \
  } while (0)
  EXPECT_SHARD(TPU_ERR_RUNTIME, "hlo: parameter 0: a sharding without a mesh (tpu_hlo_set_mesh)",
               tpu_hlo_param_sharding(m, a, &rows));
  EXPECT_SHARD(TPU_ERR_RUNTIME, "hlo: result 0: a sharding without a mesh (tpu_hlo_set_mesh)",
               tpu_hlo_result_sharding(m, 0, &rows));
  EXPECT_SHARD(TPU_ERR_VALUE,
               "hlo: parameter 0: sharding: dimension 0 of size 6 is not divisible by mesh axis 0 of size 4",
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 1, &m4, NULL);
               tpu_sharding s = sh(1, &m4, 2, 0, -1); tpu_hlo_param_sharding(m, a, &s));
  EXPECT_SHARD(TPU_ERR_VALUE, "hlo: parameter 0: sharding over mesh [4], but the module's mesh is [2,2]",
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 2, m22, NULL);
               tpu_sharding s = sh(1, &m4, 2, -1, -1); tpu_hlo_param_sharding(m, a, &s));
  EXPECT_SHARD(TPU_ERR_VALUE, "hlo: parameter 0: sharding of rank 1 for a value of rank 2",
               tpu_hlo_set_mesh(m, TPU_HLO_SHARDY, 2, m22, NULL);
               tpu_sharding s = sh(2, m22, 1, 0, -1); tpu_hlo_param_sharding(m, a, &s));
  EXPECT_SHARD(TPU_ERR_VALUE, "hlo: parameter 0: sharding: mesh axis 0 splits both dimension 0 and dimension 1",
               tpu_hlo_set_mesh(m, TPU_HLO_SHARDY, 2, m22, NULL);
               tpu_sharding s = sh(2, m22, 2, 0, 0); tpu_hlo_param_sharding(m, a, &s));
  EXPECT_SHARD(TPU_ERR_RUNTIME, "hlo: sharding of a value that is not a parameter",
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 2, m22, NULL);
               tpu_hv n = tpu_hlo_unary(m, TPU_HLO_NEG, a); tpu_hlo_param_sharding(m, n, &rows));
  EXPECT_SHARD(TPU_ERR_RUNTIME, "hlo: sharding of result 1, but there are 1 results",
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 2, m22, NULL);
               tpu_hlo_result_sharding(m, 1, &rows));
  EXPECT_SHARD(TPU_ERR_RUNTIME, "hlo: sharding of negative result index -1",
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 2, m22, NULL);
               tpu_hlo_result_sharding(m, -1, &rows));
  EXPECT_SHARD(TPU_ERR_VALUE,
               "hlo: result 0: sharding: dimension 1 of size 4 is not divisible by mesh axis 0 of size 3",
               int64_t m3 = 3;
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 1, &m3, NULL); tpu_sharding s = sh(1, &m3, 2, -1, 0);
               tpu_hlo_result_sharding(m, 0, &s));
  EXPECT_SHARD(TPU_ERR_VALUE, "hlo: sharding constraint on value 1: sharding of rank 1 for a value of rank 2",
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 2, m22, NULL);
               tpu_hv n = tpu_hlo_unary(m, TPU_HLO_NEG, a); tpu_sharding s = sh(2, m22, 1, 0, -1);
               CHECK(tpu_hlo_sharding_constraint(m, n, &s) == TPU_HV_NONE, "failed constraint"));
  EXPECT_SHARD(TPU_ERR_RUNTIME, "hlo: the mesh is set once, before any sharding",
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 2, m22, NULL);
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 2, m22, NULL));
  EXPECT_SHARD(TPU_ERR_RUNTIME, "hlo: unknown partitioner 0", tpu_hlo_set_mesh(m, 0, 2, m22, NULL));
  EXPECT_SHARD(TPU_ERR_VALUE, "hlo: sharding: mesh axes 0 and 1 are both named \"x\"",
               const char *names[2] = {"x", "x"};
               tpu_hlo_set_mesh(m, TPU_HLO_SHARDY, 2, m22, names));
  EXPECT_SHARD(TPU_ERR_VALUE, "hlo: sharding: mesh axis 0 has size -2", int64_t bad = -2;
               tpu_hlo_set_mesh(m, TPU_HLO_SHARDY, 1, &bad, NULL));
  EXPECT_SHARD(TPU_ERR_VALUE, "hlo: the mesh has 4 devices, but the module has 8 partitions",
               tpu_hlo_set_mesh(m, TPU_HLO_GSPMD, 2, m22, NULL);
               tpu_hlo_set_num_partitions(m, 8));
  EXPECT_SHARD(TPU_ERR_VALUE, "hlo: 0 replicas (at least 1)", tpu_hlo_set_num_replicas(m, 0));
#undef EXPECT_SHARD
}

/* The layouts XLA chose, read from an optimized module: the output shardings
 * below are the bytes XLA wrote for a jitted program on a 2x2 mesh ("a", "b"):
 * P('a', 'b'), P('b', 'a') (an iota transposed), replicated, and a parameter's
 * P('a', None) (replicated over the last tile dim); then an explicit device
 * list, a split over both axes at once (not a tpu_sharding) and a MAXIMAL. */
static void test_read_output_shardings(void) {
  static const uint8_t e_ab[] = {0x08, 0x03, 0x1a, 0x02, 0x02, 0x02, 0x4a, 0x01, 0x04, 0x52, 0x01, 0x00};
  static const uint8_t e_ba[] = {0x08, 0x03, 0x1a, 0x02, 0x02, 0x02, 0x4a, 0x02, 0x02, 0x02, 0x52, 0x02, 0x01, 0x00};
  static const uint8_t e_a_[] = {0x08, 0x03, 0x1a, 0x03, 0x02, 0x01, 0x02, 0x30,
                                 0x01, 0x4a, 0x01, 0x04, 0x52, 0x01, 0x00};
  static const uint8_t e_list[] = {0x08, 0x03, 0x1a, 0x02, 0x02, 0x02, 0x22, 0x04, 0x00, 0x02, 0x01, 0x03};
  static const uint8_t e_both[] = {0x08, 0x03, 0x1a, 0x02, 0x04, 0x01, 0x4a, 0x01, 0x04, 0x52, 0x01, 0x00};
  static const uint8_t e_max[] = {0x08, 0x01, 0x22, 0x01, 0x00};
  const uint8_t *el[] = {e_ab, e_ba, NULL, e_a_, e_list, e_both, e_max};
  size_t en[] = {sizeof e_ab, sizeof e_ba, 0, sizeof e_a_, sizeof e_list, sizeof e_both, sizeof e_max};
  uint8_t mod[256];
  size_t n = 0;
  mod[n++] = 0x0a; /* name "m" first: fields before 12 are skipped */
  mod[n++] = 1;
  mod[n++] = 'm';
  mod[n++] = 0x62;
  size_t at = n++;
  mod[n++] = 0x08;
  mod[n++] = 0x02; /* TUPLE */
  for (int k = 0; k < 7; k++) {
    mod[n++] = 0x2a;
    mod[n++] = (uint8_t)en[k];
    if (en[k]) memcpy(mod + n, el[k], en[k]);
    n += en[k];
  }
  mod[at] = (uint8_t)(n - at - 1);
  int64_t m22[2] = {2, 2};
  int ranks[7] = {2, 2, 3, 2, 2, 2, 2};
  bool want[7] = {true, true, true, true, true, false, false};
  tpu_sharding out[7];
  tpu_status *st = tpu_hlo_read_output_shardings(mod, n, false, 2, m22, 7, ranks, want, out);
  CHECK(!st, "read: %s", st ? tpu_status_message(st) : "");
  tpu_status_free(st);
  tpu_sharding w_ab = sh(2, m22, 2, 0, 1), w_ba = sh(2, m22, 2, 1, 0), w_rep = sh(2, m22, 3, -1, -1);
  tpu_sharding w_a = sh(2, m22, 2, 0, -1);
  CHECK(tpu_sharding_eq(&out[0], &w_ab), "P('a', 'b')");
  CHECK(tpu_sharding_eq(&out[1], &w_ba), "P('b', 'a'): an iota transposed");
  CHECK(tpu_sharding_eq(&out[2], &w_rep), "replicated");
  CHECK(tpu_sharding_eq(&out[3], &w_a), "P('a', None) replicated over the last tile dim");
  CHECK(tpu_sharding_eq(&out[4], &w_ba), "an explicit device list [0, 2, 1, 3]");
  /* a split over both axes at once, and a MAXIMAL, are refused when wanted */
  for (int k = 5; k < 7; k++) {
    bool w1[7] = {false};
    w1[k] = true;
    st = tpu_hlo_read_output_shardings(mod, n, false, 2, m22, 7, ranks, w1, out);
    CHECK(st && tpu_status_code(st) == TPU_ERR_UNIMPLEMENTED, "output %d refused", k);
    tpu_status_free(st);
  }
  /* the wrong output count, a module without shardings, truncated bytes */
  st = tpu_hlo_read_output_shardings(mod, n, false, 2, m22, 6, ranks, want, out);
  CHECK(st != NULL, "7 shardings for 6 outputs");
  tpu_status_free(st);
  st = tpu_hlo_read_output_shardings(mod, 3, false, 2, m22, 7, ranks, want, out);
  CHECK(st && tpu_status_code(st) == TPU_ERR_UNIMPLEMENTED, "no field 12");
  tpu_status_free(st);
  for (size_t cut = 4; cut < n; cut += 3) {
    st = tpu_hlo_read_output_shardings(mod, cut, false, 2, m22, 7, ranks, want, out);
    CHECK(st != NULL, "truncated at %zu", cut);
    tpu_status_free(st);
  }
  /* a single (non-tuple) sharding for a program's only output */
  uint8_t one[32] = {0x62, (uint8_t)sizeof e_ab};
  memcpy(one + 2, e_ab, sizeof e_ab);
  bool w0 = true;
  st = tpu_hlo_read_output_shardings(one, 2 + sizeof e_ab, false, 2, m22, 1, ranks, &w0, out);
  CHECK(!st && tpu_sharding_eq(&out[0], &w_ab), "one output");
  tpu_status_free(st);
  /* the same module inside an HloModuleProtoWithConfig (field 1; a config, field 2, beside it) */
  uint8_t wrap[300] = {0x12, 0x02, 0x08, 0x01, 0x0a};
  size_t wn = 5;
  wrap[wn++] = (uint8_t)n;
  memcpy(wrap + wn, mod, n);
  wn += n;
  st = tpu_hlo_read_output_shardings(wrap, wn, true, 2, m22, 7, ranks, want, out);
  CHECK(!st && tpu_sharding_eq(&out[1], &w_ba), "with config: %s", st ? tpu_status_message(st) : "");
  tpu_status_free(st);
}

/* Shardy's form (OpSharding field 14, a NamedShardingProto: a mesh of named
 * axes, each dimension's axes by index), as libtpu writes the output
 * shardings of a program on a 4x4 mesh ("a0", "a1"): [{a0}, {a1}],
 * [{a1}, {}] and a replicated scalar; then forms a tpu_sharding cannot say. */
static void test_read_named_shardings(void) {
  static const uint8_t tpu[] = {
      0x62, 0x4a, 0x08, 0x02, 0x2a, 0x22, 0x72, 0x20, 0x12, 0x10, 0x0a, 0x06, 0x0a, 0x02, 0x61, 0x30, 0x10, 0x04, 0x0a,
      0x06, 0x0a, 0x02, 0x61, 0x31, 0x10, 0x04, 0x1a, 0x04, 0x0a, 0x00, 0x10, 0x01, 0x1a, 0x06, 0x0a, 0x02, 0x08, 0x01,
      0x10, 0x01, 0x2a, 0x20, 0x72, 0x1e, 0x12, 0x10, 0x0a, 0x06, 0x0a, 0x02, 0x61, 0x30, 0x10, 0x04, 0x0a, 0x06, 0x0a,
      0x02, 0x61, 0x31, 0x10, 0x04, 0x1a, 0x06, 0x0a, 0x02, 0x08, 0x01, 0x10, 0x01, 0x1a, 0x02, 0x10, 0x01, 0x2a, 0x00};
  int64_t m44[2] = {4, 4};
  int ranks[3] = {2, 2, 0};
  bool want[3] = {true, true, true};
  tpu_sharding out[3];
  tpu_status *st = tpu_hlo_read_output_shardings(tpu, sizeof tpu, false, 2, m44, 3, ranks, want, out);
  CHECK(!st, "named: %s", st ? tpu_status_message(st) : "");
  tpu_status_free(st);
  tpu_sharding w01 = sh(2, m44, 2, 0, 1), w1_ = sh(2, m44, 2, 1, -1), wrep = sh(2, m44, 0, -1, -1);
  CHECK(tpu_sharding_eq(&out[0], &w01), "[{a0}, {a1}]");
  CHECK(tpu_sharding_eq(&out[1], &w1_), "[{a1}, {}]");
  CHECK(tpu_sharding_eq(&out[2], &wrep), "a replicated scalar");
  /* one output, [{a1}, {a0}]: a mesh (a0=4, a1=4), then each dimension */
  static const uint8_t mesh44[] = {0x12, 0x10, 0x0a, 0x06, 0x0a, 0x02, 0x61, 0x30, 0x10,
                                   0x04, 0x0a, 0x06, 0x0a, 0x02, 0x61, 0x31, 0x10, 0x04};
  static const uint8_t d_a1[] = {0x1a, 0x04, 0x0a, 0x02, 0x08, 0x01};
  static const uint8_t d_a0[] = {0x1a, 0x02, 0x0a, 0x00};
  static const uint8_t d_both[] = {0x1a, 0x06, 0x0a, 0x00, 0x0a, 0x02, 0x08, 0x01};            /* a0 then a1 */
  static const uint8_t d_sub[] = {0x1a, 0x08, 0x0a, 0x06, 0x12, 0x04, 0x08, 0x01, 0x10, 0x02}; /* (1)2 of a0 */
  static const uint8_t unreduced[] = {0x2a, 0x00};
  static const uint8_t devices[] = {0x12, 0x02, 0x12, 0x00}; /* a mesh with device_ids */
  struct {
    const uint8_t *a, *b, *c;
    size_t na, nb, nc;
    bool ok;
    const char *what;
  } cases[] = {
      {d_a1, d_a0, NULL, sizeof d_a1, sizeof d_a0, 0, true, "[{a1}, {a0}]"},
      {d_both, d_a0, NULL, sizeof d_both, sizeof d_a0, 0, false, "a dimension over two axes"},
      {d_sub, d_a1, NULL, sizeof d_sub, sizeof d_a1, 0, false, "a sub-axis"},
      {d_a1, d_a0, unreduced, sizeof d_a1, sizeof d_a0, sizeof unreduced, false, "unreduced axes"},
      {d_a1, d_a0, devices, sizeof d_a1, sizeof d_a0, sizeof devices, false, "an explicit device order"},
      {d_a0, d_a0, NULL, sizeof d_a0, sizeof d_a0, 0, false, "one axis for two dimensions"},
      {d_a0, NULL, NULL, sizeof d_a0, 0, 0, false, "one dimension sharding for a rank-2 tensor"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t ns[96], m[128];
    size_t n = 0;
    memcpy(ns + n, mesh44, sizeof mesh44), n += sizeof mesh44;
    memcpy(ns + n, cases[i].a, cases[i].na), n += cases[i].na;
    if (cases[i].b) memcpy(ns + n, cases[i].b, cases[i].nb), n += cases[i].nb;
    if (cases[i].c) memcpy(ns + n, cases[i].c, cases[i].nc), n += cases[i].nc;
    size_t k = 0;
    m[k++] = 0x62; /* spmd_output_sharding: an OpSharding holding field 14 only */
    m[k++] = (uint8_t)(n + 2);
    m[k++] = 0x72;
    m[k++] = (uint8_t)n;
    memcpy(m + k, ns, n), k += n;
    bool w = true;
    int r2 = 2;
    st = tpu_hlo_read_output_shardings(m, k, false, 2, m44, 1, &r2, &w, out);
    CHECK(!st == cases[i].ok, "%s: %s", cases[i].what, st ? tpu_status_message(st) : "read");
    tpu_sharding w10 = sh(2, m44, 2, 1, 0);
    if (cases[i].ok) CHECK(!st && tpu_sharding_eq(&out[0], &w10), "%s", cases[i].what);
    tpu_status_free(st);
  }
}

int main(void) {
  test_add();
  test_constants();
  test_complex_to_bool();
  test_broadcast();
  test_reduce();
  test_reduce_region();
  test_compare_select();
  test_dot_general();
  test_wide_int_dot_and_convolution();
  test_gather();
  test_scatter();
  test_iota();
  test_noops();
  test_slice_concat_pad();
  test_alias();
  test_sort_rng();
  test_conv_pool_transpose();
  test_core();
  test_types();
  test_sticky();
  test_determinism();
  test_float_rounding();
  test_typeof_stable();
  test_checks();
  test_exact_division();
  test_hash64();
  test_sharding_strings();
  test_sharding_geometry();
  test_sharded_module();
  test_sharded_errors();
  test_read_output_shardings();
  test_read_named_shardings();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
