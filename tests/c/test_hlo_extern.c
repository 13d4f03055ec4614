/* test_hlo_extern.c: functions from StableHLO text (csrc/hlo/hlo_extern.c):
 * locations and comments stripped, only the module's own symbols renamed
 * (never a custom call's target, never inside strings), @main's signature
 * read, calls and the definitions in a finished module, the TPU variant
 * swapped in by tpu_hlo_retarget, and bad text refused with a status. Run
 * under AddressSanitizer and UndefinedBehaviorSanitizer by `make check`. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hlo/hlo.h"

/* JAX's pretty form: locations, a helper function, a region. */
static const char *JAX =
    "#loc1 = loc(\"x\")\n"
    "module @jit_g attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 1 : i32} {\n"
    "  func.func public @main(%arg0: tensor<4x8xf32> loc(\"x\"), %arg1: tensor<8xf32> {mhlo.sharding = \"{replicated}\"}"
    " loc(\"w\")) -> (tensor<4x8xf32> {jax.result_info = \"result[0]\"}, tensor<i1> {jax.result_info = \"r(1)\"}) {\n"
    "    %0 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32> loc(#loc3)\n"
    "    %1 = call @_where(%arg0, %0) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32> loc(\"a\"(#loc1))\n"
    "    %c = stablehlo.constant dense<true> : tensor<i1> // a comment with \"quote and @main\n"
    "    return %1, %c : tensor<4x8xf32>, tensor<i1> loc(#loc)\n"
    "  } loc(#loc)\n"
    "  func.func private @_where(%arg0: tensor<4x8xf32> loc(unknown), %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {\n"
    "    %0 = stablehlo.custom_call @main_like(%arg0) {backend_config = \"call @_where loc(x) \\22}\"} : "
    "(tensor<4x8xf32>) -> tensor<4x8xf32>\n"
    "    %1 = stablehlo.add %0, %arg1 : tensor<4x8xf32> loc(#loc7)\n"
    "    return %1 : tensor<4x8xf32>\n"
    "  } loc(#loc29)\n"
    "} loc(#loc)\n"
    "#loc = loc(unknown)\n"
    "#loc3 = loc(\"/a/file.py\":8:4 to :132)\n"
    "#loc7 = loc(callsite(#loc1 at #loc3))\n";

/* The same function's TPU form: a Mosaic custom call. */
static const char *TPU =
    "module @jit_g {\n"
    "  func.func public @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<i1>) {\n"
    "    %0:2 = stablehlo.custom_call @tpu_custom_call(%arg0, %arg1) {backend_config = \"{\\22body\\22: 1}\"} : "
    "(tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<i1>)\n"
    "    return %0#0, %0#1 : tensor<4x8xf32>, tensor<i1>\n"
    "  }\n"
    "}\n";

static bool has(const char *text, const char *s) { return text && strstr(text, s) != NULL; }

static int count(const char *text, const char *s) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, s)); p += strlen(s)) n++;
  return n;
}

static void test_parse(void) {
  tpu_hlo_fn *f = NULL;
  tpu_status *s = tpu_hlo_fn_parse(JAX, strlen(JAX), &f);
  CHECK(!s, "%s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  if (!f) return;
  CHECK(tpu_hlo_fn_nargs(f) == 2 && tpu_hlo_fn_nresults(f) == 2, "signature");
  const tpu_hlo_type *a0 = tpu_hlo_fn_arg(f, 0), *a1 = tpu_hlo_fn_arg(f, 1), *r1 = tpu_hlo_fn_result(f, 1);
  CHECK(a0->dtype == TPU_F32 && a0->rank == 2 && a0->dims[0] == 4 && a0->dims[1] == 8, "arg 0");
  CHECK(a1->rank == 1 && a1->dims[0] == 8, "arg 1");
  CHECK(r1->dtype == TPU_PRED && r1->rank == 0, "result 1");
  const char *t = tpu_hlo_fn_text(f);
  char pre[32];
  snprintf(pre, sizeof pre, "@x%016llx_", (unsigned long long)tpu_hlo_fn_hash(f));
  CHECK(!has(t, "loc(\"") && !has(t, "loc(#") && !has(t, "#loc") && !has(t, "a comment"),
        "locations and comments stripped: %s", t);
  CHECK(count(t, "func.func private @") == 2 && !has(t, "public"), "private: %s", t);
  CHECK(count(t, pre) == 3, "the two definitions and the call renamed: %s", t);
  CHECK(has(t, "@main_like(") && has(t, "\"call @_where loc(x) \\22}\""), "other symbols and strings kept: %s", t);
  CHECK(!has(t, "jax.result_info") && !has(t, "mhlo.sharding"), "main's attributes dropped: %s", t);

  /* the same text with other locations: the same function */
  tpu_hlo_fn *g = NULL;
  const char *jax2 =
      "module {\n func.func @main(%a: tensor<2xf32> loc(\"p\")) -> tensor<2xf32> {\n return %a : "
      "tensor<2xf32>\n }\n}\n";
  const char *jax3 =
      "module {\n func.func @main(%a: tensor<2xf32> loc(\"q\")) -> tensor<2xf32> {\n return %a : "
      "tensor<2xf32>\n }\n}\n";
  tpu_hlo_fn *h = NULL;
  s = tpu_hlo_fn_parse(jax2, strlen(jax2), &g);
  CHECK(!s && g, "bare module");
  tpu_status_free(s);
  s = tpu_hlo_fn_parse(jax3, strlen(jax3), &h);
  CHECK(!s && h && tpu_hlo_fn_hash(g) == tpu_hlo_fn_hash(h), "locations do not change the hash");
  CHECK(g && tpu_hlo_fn_hash(g) != tpu_hlo_fn_hash(f), "another function, another hash");
  tpu_status_free(s);

  /* a module calling f twice and g once: each defined once */
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv x = tpu_hlo_param(m, *a0), w = tpu_hlo_param(m, *a1), outs[2], o2[2], args[2] = {x, w};
  CHECK(tpu_hlo_call(m, f, args, 2, outs), "call");
  CHECK(tpu_hlo_call(m, f, args, 2, o2), "call again");
  tpu_hv v = tpu_hlo_param(m, *tpu_hlo_fn_arg(g, 0)), gv;
  CHECK(tpu_hlo_call(m, g, &v, 1, &gv), "call g");
  char *text = NULL;
  size_t len = 0;
  tpu_hv res[3] = {outs[0], o2[1], gv};
  s = tpu_hlo_finish(m, res, 3, &text, &len);
  CHECK(!s && text, "finish");
  CHECK(count(text, "\"func.call\"") == 3 && count(text, "func.func private") == 3, "%s", text);
  CHECK(text && strstr(text, "func.func public @main") < strstr(text, "func.func private"), "definitions after @main");
  tpu_status_free(s);

  /* the TPU variant swapped in */
  s = tpu_hlo_fn_add_variant(f, "tpu", TPU, strlen(TPU));
  CHECK(!s, "%s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  const tpu_hlo_fn *fns[2] = {f, g};
  char *tt = NULL;
  size_t tl = 0;
  s = tpu_hlo_retarget(text, len, fns, 2, "tpu", &tt, &tl);
  CHECK(!s && tt && tl == strlen(tt), "retarget");
  CHECK(has(tt, "@tpu_custom_call(") && !has(tt, "@main_like") && count(tt, "func.func private") == 2, "%s", tt);
  CHECK(count(tt, pre) == 3, "the calls still reach the variant's @main: %s", tt);
  tpu_status_free(s);
  free(tt);
  const char *bad_tpu = "func.func @main(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {\n return %a : tensor<4x8xf32>\n}\n";
  s = tpu_hlo_fn_add_variant(f, "tpu", bad_tpu, strlen(bad_tpu));
  CHECK(s && tpu_status_code(s) == TPU_ERR_VALUE && has(tpu_status_message(s), "another signature"),
        "variant signature");
  tpu_status_free(s);

  /* a call of the wrong types is refused */
  tpu_hlo *m2 = tpu_hlo_new();
  tpu_hv p = tpu_hlo_param(m2, *a1), q[2] = {p, p}, o[2];
  CHECK(!tpu_hlo_call(m2, f, q, 2, o), "wrong operand types");
  char *t2 = NULL;
  size_t l2 = 0;
  s = tpu_hlo_finish(m2, o, 0, &t2, &l2);
  CHECK(s && has(tpu_status_message(s), "operand 0"), "%s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  tpu_hlo_free(m2);
  free(text);
  tpu_hlo_free(m);
  tpu_hlo_fn_free(f);
  tpu_hlo_fn_free(g);
  tpu_hlo_fn_free(h);
}

/* Aliases other than locations (an affine map, whose arrow is no closing
 * bracket) are renamed with the prefix and put before the module. */
static void test_aliases(void) {
  const char *t =
      "#map = affine_map<(d0) -> (d0)>\n"
      "#loc = loc(unknown)\n"
      "module {\n  func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> attributes {m = #map} {\n"
      "    return %a : tensor<2xf32>\n  }\n}\n";
  tpu_hlo_fn *f = NULL;
  tpu_status *s = tpu_hlo_fn_parse(t, strlen(t), &f);
  CHECK(!s && f, "%s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  if (!f) return;
  tpu_hlo *m = tpu_hlo_new();
  tpu_hv a = tpu_hlo_param(m, *tpu_hlo_fn_arg(f, 0)), r;
  tpu_hlo_call(m, f, &a, 1, &r);
  char *text = NULL;
  size_t len = 0;
  s = tpu_hlo_finish(m, &r, 1, &text, &len);
  char want[128];
  snprintf(want, sizeof want, "#x%016llx_map = affine_map<(d0) -> (d0)>\nmodule @torchtpu",
           (unsigned long long)tpu_hlo_fn_hash(f));
  CHECK(!s && text && strncmp(text, want, strlen(want)) == 0, "%s", text ? text : "");
  tpu_status_free(s);
  free(text);
  tpu_hlo_free(m);
  tpu_hlo_fn_free(f);
}

static void bad(const char *text, const char *want) {
  tpu_hlo_fn *f = NULL;
  tpu_status *s = tpu_hlo_fn_parse(text, strlen(text), &f);
  CHECK(s && !f && tpu_status_code(s) == TPU_ERR_VALUE && has(tpu_status_message(s), want), "%s: got %s", want,
        s ? tpu_status_message(s) : "success");
  tpu_status_free(s);
  tpu_hlo_fn_free(f);
}

static void test_bad(void) {
  bad("", "empty");
  bad("module {\n}\n", "no function @main");
  bad("func.func @f(%a: tensor<f32>) -> tensor<f32> {\n return %a : tensor<f32>\n}\n", "no function @main");
  bad("func.func @main(%a: tensor<?xf32>) -> tensor<f32> {\n}\n", "tensor<?xf32> is not supported");
  bad("func.func @main(%a: !stablehlo.token) -> tensor<f32> {\n}\n", "!stablehlo.token is not supported");
  bad("func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n return %a\n", "balanced braces");
  bad("func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n %0 = \"x\n}\n", "unterminated string");
  bad("module {\n sdy.mesh @m = <[\"x\"=2]>\n}\n", "only func.func definitions");
  bad("func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n}\nfunc.func @main() {\n}\n", "defined twice");
  bad("func.func @main(%a: tensor<2xf32> loc(\"x\" -> tensor<2xf32> {\n}\n", "unbalanced parentheses");
  bad("garbage", "only func.func definitions");
}

/* Exact division's barriers (the CPU compiler only) are identities in a
 * program's TPU form; other barriers stay, and the CPU form is unchanged. */
static void test_cpu_barriers(void) {
  tpu_hlo *m = tpu_hlo_new();
  tpu_hlo_set_exact_division(m, true);
  tpu_hlo_type t = tpu_hlo_type_make(TPU_F32, 2, (int64_t[]){4, 8}), st = tpu_hlo_type_make(TPU_F32, 0, NULL);
  tpu_hv x = tpu_hlo_param(m, t), s = tpu_hlo_param(m, st);
  tpu_hv q = tpu_hlo_binary(m, TPU_HLO_DIV, x, tpu_hlo_broadcast_in_dim(m, s, 2, t.dims, NULL));
  tpu_hv r = tpu_hlo_unary(m, TPU_HLO_RSQRT, q);
  tpu_hv kept = tpu_hlo_emit1(m, "stablehlo.optimization_barrier", &r, 1, NULL, t);
  char *text = NULL, *tt = NULL, *ct = NULL;
  size_t len = 0, tl = 0, cl = 0;
  tpu_status *st_ = tpu_hlo_finish(m, &kept, 1, &text, &len);
  CHECK(!st_ && text, "finish");
  CHECK(count(text, "optimization_barrier") == 3 && count(text, TPU_HLO_CPU_EXACT) == 2, "%s", text);
  st_ = tpu_hlo_retarget(text, len, NULL, 0, "tpu", &tt, &tl);
  CHECK(!st_ && tt && tl == strlen(tt), "retarget");
  CHECK(count(tt, "optimization_barrier") == 1 && count(tt, TPU_HLO_CPU_EXACT) == 0, "%s", tt);
  CHECK(count(tt, "\"stablehlo.reshape\"(") == count(text, "\"stablehlo.reshape\"(") + 2, "%s", tt);
  CHECK(has(tt, "= \"stablehlo.reshape\"(%v") && has(tt, ") : (tensor<4x8xf32>) -> tensor<4x8xf32>"), "%s", tt);
  st_ = tpu_hlo_retarget(text, len, NULL, 0, "cpu", &ct, &cl);
  CHECK(!st_ && cl == len && memcmp(ct, text, len) == 0, "another target keeps them");
  free(text);
  free(tt);
  free(ct);
  tpu_hlo_free(m);
}

int main(void) {
  test_parse();
  test_cpu_barriers();
  test_aliases();
  test_bad();
  printf("test_hlo_extern: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
