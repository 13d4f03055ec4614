/* test_core.c: the core's shared helpers that guard sizes (a tensor's span
 * in its storage, with every overflow caught as torch catches it). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

#include "check.h"

static void test_storage_numel(void) {
  int64_t n = -1;
  int64_t s3[] = {2, 3, 4};
  CHECK(tpu_storage_numel(3, s3, NULL, 4, &n) && n == 24, "contiguous 2x3x4: %lld", (long long)n);
  int64_t st[] = {1, 2, 6};
  CHECK(tpu_storage_numel(3, s3, st, 4, &n) && n == 24, "permuted strides: %lld", (long long)n);
  int64_t bst[] = {0, 0, 1};
  CHECK(tpu_storage_numel(3, s3, bst, 4, &n) && n == 4, "broadcast strides: %lld", (long long)n);
  CHECK(tpu_storage_numel(0, NULL, NULL, 8, &n) && n == 1, "0-d: %lld", (long long)n);
  int64_t z[] = {0, INT64_MAX, INT64_MAX};
  CHECK(tpu_storage_numel(3, z, NULL, 8, &n) && n == 0, "zero size with huge dims: %lld", (long long)n);
  int64_t huge[] = {(int64_t)1 << 62};
  CHECK(!tpu_storage_numel(1, huge, NULL, 4, &n), "2**62 floats overflow bytes");
  CHECK(tpu_storage_numel(1, huge, NULL, 1, &n) && n == (int64_t)1 << 62, "2**62 bytes fit");
  int64_t h61[] = {(int64_t)1 << 61};
  CHECK(!tpu_storage_numel(1, h61, NULL, 4, &n), "2**63 bytes do not fit in int64");
  int64_t sq[] = {(int64_t)1 << 32, (int64_t)1 << 32};
  CHECK(!tpu_storage_numel(2, sq, NULL, 1, &n), "2**64 elements overflow the count");
  int64_t one[] = {2}, neg[] = {-1};
  CHECK(!tpu_storage_numel(1, one, neg, 4, &n), "a negative stride is refused (as torch)");
  CHECK(!tpu_storage_numel(1, neg, NULL, 4, &n), "a negative size is refused");
  int64_t big[] = {3}, bigst[] = {INT64_MAX / 2 + 1};
  CHECK(!tpu_storage_numel(1, big, bigst, 1, &n), "a stride whose span overflows");
}

/* The dtype limits the lowerings share (reductions' identities, random_'s
 * ranges, pooling's padding, nan_to_num's defaults). */
static void test_dtype_limits(void) {
  CHECK(tpu_dtype_int_min(TPU_S8) == -128 && tpu_dtype_int_max(TPU_S8) == 127, "s8 range");
  CHECK(tpu_dtype_int_min(TPU_S32) == INT32_MIN && tpu_dtype_int_max(TPU_U32) == 4294967295LL, "32-bit ranges");
  CHECK(tpu_dtype_int_min(TPU_S64) == INT64_MIN && tpu_dtype_int_max(TPU_S64) == INT64_MAX, "s64 range");
  CHECK(tpu_dtype_int_min(TPU_U64) == 0 && tpu_dtype_int_max(TPU_U64) == INT64_MAX, "u64 clamped to int64");
  CHECK(tpu_dtype_int_min(TPU_PRED) == 0 && tpu_dtype_int_max(TPU_PRED) == 1, "bool range");
  CHECK(tpu_dtype_lowest(TPU_S16) == -32768.0 && tpu_dtype_highest(TPU_U16) == 65535.0, "16-bit as doubles");
  CHECK(tpu_dtype_lowest(TPU_U8) == 0 && tpu_dtype_highest(TPU_PRED) == 1, "u8 lowest, bool highest");
  CHECK(tpu_dtype_lowest(TPU_BF16) < -1e308 && tpu_dtype_highest(TPU_F32) > 1e308, "floats: -inf and inf");
  CHECK(tpu_dtype_highest(TPU_C64) > 1e308, "complex: inf");
  CHECK(tpu_dtype_float_max(TPU_F16) == 65504.0 && tpu_dtype_float_max(TPU_F32) == 3.4028234663852886e38,
        "largest finite f16, f32");
  CHECK(tpu_dtype_float_digits(TPU_BF16) == 8 && tpu_dtype_float_digits(TPU_F64) == 53 &&
            tpu_dtype_float_digits(TPU_S32) == 0,
        "significand bits");
}

static void test_bytes_str(void) {
  char b[32];
  struct {
    int64_t n;
    const char *want;
  } cases[] = {{0, "0 bytes"},         {1023, "1023 bytes"},         {1024, "1.0 KiB"},
               {1536, "1.5 KiB"},      {1048575, "1.0 MiB"},         {(int64_t)1 << 40, "1.0 TiB"},
               {INT64_MAX, "8.0 EiB"}, {(int64_t)5 << 30, "5.0 GiB"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tpu_bytes_str(cases[i].n, b, sizeof b);
    CHECK(strcmp(b, cases[i].want) == 0, "%lld bytes: \"%s\", want \"%s\"", (long long)cases[i].n, b, cases[i].want);
  }
}

static void test_bytes_in_text(void) {
  int64_t n = 0;
  const char *m = "Out of memory allocating 68719476736 bytes.";
  int at = tpu_bytes_in_text(m, (int)strlen(m), &n);
  CHECK(at == 42 && n == 68719476736LL, "at %d, %lld", at, (long long)n);
  const char *small = "need 512 bytes, have 3 bytes";
  CHECK(tpu_bytes_in_text(small, (int)strlen(small), &n) == 0, "under 1 KiB is not rewritten");
  const char *none = "x12345 bytesy 99999999999999999999999 bytes";
  at = tpu_bytes_in_text(none, 6, &n); /* the text ends before " bytes" */
  CHECK(at == 0, "cut text: %d", at);
}

int main(void) {
  test_bytes_str();
  test_bytes_in_text();
  test_storage_numel();
  test_dtype_limits();
  printf("test_core: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
