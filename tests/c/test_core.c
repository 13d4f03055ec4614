/* test_core.c: the core's shared helpers that guard sizes (a tensor's span
 * in its storage, with every overflow caught as torch catches it). */
#include <stdint.h>
#include <stdio.h>

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

int main(void) {
  test_storage_numel();
  printf("test_core: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
