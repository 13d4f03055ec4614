/* check.h: the C tests' one assertion. CHECK(cond, fmt, ...) counts a pass,
 * or prints the failed condition with a message and counts a failure; each
 * test prints "N passed, M failed" last and exits non-zero on a failure. */
#ifndef TPU_TEST_CHECK_H
#define TPU_TEST_CHECK_H

#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (cond) {                                                       \
      passed++;                                                       \
    } else {                                                          \
      failed++;                                                       \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fputc('\n', stderr);                                            \
    }                                                                 \
  } while (0)

#endif
