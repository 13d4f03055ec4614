/* check_status.h: OK(status, what) for the C tests that call the core:
 * counts a pass when the status is NULL (success), else prints its message
 * and counts a failure; consumes the status and is true on success. */
#ifndef TPU_TEST_CHECK_STATUS_H
#define TPU_TEST_CHECK_STATUS_H

#include <stdbool.h>
#include <stdio.h>

#include "check.h"
#include "core.h"

static bool ok_(tpu_status *s, const char *what, const char *file, int line) {
  if (!s) {
    passed++;
    return true;
  }
  failed++;
  fprintf(stderr, "FAIL %s:%d: %s: %s\n", file, line, what, tpu_status_message(s));
  tpu_status_free(s);
  return false;
}
#define OK(s, what) ok_((s), (what), __FILE__, __LINE__)

#endif
