/* test_prof.c: the profiler's record (csrc/engine/prof.c): nothing outside a
 * session, what each session kind keeps, the bounded buffer, the order of a
 * device's programs, and programs launched on the real plugin (argv[1]),
 * which end on their completion callbacks, including from another thread.
 * The last line is "N passed, M failed"; the exit status is non-zero on any
 * failure.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/prof.h"
#include "runtime/runtime.h"

#include "check.h"
#include "check_status.h"

static tpu_prof_record recs[TPU_PROF_CAPACITY + 16];

static size_t snap(uint64_t *dropped) { return tpu_prof_snapshot(recs, TPU_PROF_CAPACITY + 16, dropped); }

static void test_outside(void) {
  uint64_t before = tpu_prof_total();
  CHECK(tpu_prof_t0() == 0, "t0 outside a session is %lld", (long long)tpu_prof_t0());
  /* the recorders themselves, called anyway: they check the session too */
  tpu_prof_host(TPU_PROF_COMPILE, 0, 1, 0, "aten::%s", "add.Tensor");
  tpu_prof_host(TPU_PROF_UPLOAD, 0, 1, 64, NULL);
  tpu_prof_launch(NULL, 0, 1, NULL, "aten::mul.Tensor");
  int dev = 0;
  tpu_prof_ran(&dev, 1, 1, "x");
  CHECK(tpu_prof_total() == before, "%llu records outside a session", (unsigned long long)(tpu_prof_total() - before));
}

static void test_session(void) {
  tpu_prof_start(TPU_PROF_HOST | TPU_PROF_DEVICE);
  int64_t t0 = tpu_prof_t0();
  CHECK(t0 > 1500000000LL * 1000000000LL, "t0 %lld is not the wall clock in ns", (long long)t0);
  tpu_prof_set_correlation(42);
  tpu_prof_host(TPU_PROF_COMPILE, 1, t0, 0, "aten::%s", "add.Tensor");
  tpu_prof_host(TPU_PROF_DOWNLOAD, 0, tpu_prof_t0(), 4096, NULL);
  tpu_prof_set_correlation(0);
  tpu_prof_launch(NULL, 0, tpu_prof_t0(), NULL, "fused program of %d ops", 3);
  tpu_prof_stop();
  CHECK(tpu_prof_t0() == 0, "t0 after the session");
  tpu_prof_host(TPU_PROF_WAIT, 0, 1, 0, NULL); /* after stop: not kept */
  uint64_t dropped = 1;
  size_t n = snap(&dropped);
  CHECK(n == 4 && dropped == 0, "%zu records, %llu dropped", n, (unsigned long long)dropped);
  if (n != 4) return;
  CHECK(recs[0].kind == TPU_PROF_COMPILE && recs[0].dev == 1 && strcmp(recs[0].name, "aten::add.Tensor") == 0 &&
            recs[0].corr == 42 && recs[0].tid != 0 && recs[0].t0 == t0 && recs[0].t1 >= t0,
        "compile record: kind %d dev %d name %s corr %llu", recs[0].kind, recs[0].dev, recs[0].name,
        (unsigned long long)recs[0].corr);
  CHECK(recs[1].kind == TPU_PROF_DOWNLOAD && recs[1].bytes == 4096 && recs[1].name[0] == 0 && recs[1].corr == 42,
        "download record: kind %d bytes %lld", recs[1].kind, (long long)recs[1].bytes);
  CHECK(recs[2].kind == TPU_PROF_LAUNCH && recs[3].kind == TPU_PROF_EXECUTE && recs[2].flow != 0 &&
            recs[2].flow == recs[3].flow && strcmp(recs[3].name, "fused program of 3 ops") == 0 && recs[3].corr == 0,
        "launch and execute: kinds %d %d flows %u %u name %s", recs[2].kind, recs[3].kind, recs[2].flow, recs[3].flow,
        recs[3].name);
  CHECK(recs[3].t1 >= recs[3].t0 && recs[3].t0 >= recs[1].t1, "execute span %lld .. %lld", (long long)recs[3].t0,
        (long long)recs[3].t1);
}

/* Host only (CPU activities): no device spans, transfers kept; device only:
 * no compile, launch nor wait. */
static void test_kinds(void) {
  int devs[2] = {0, 1};
  tpu_prof_start(TPU_PROF_HOST);
  tpu_prof_ran(devs, 2, tpu_prof_t0(), "all_reduce over %d devices", 2);
  tpu_prof_host(TPU_PROF_UPLOAD, 0, tpu_prof_t0(), 8, NULL);
  tpu_prof_stop();
  size_t n = snap(NULL);
  CHECK(n == 2 && recs[0].kind == TPU_PROF_LAUNCH && recs[1].kind == TPU_PROF_UPLOAD, "host session: %zu records", n);
  tpu_prof_start(TPU_PROF_DEVICE);
  tpu_prof_host(TPU_PROF_COMPILE, 0, tpu_prof_t0(), 0, "x");
  tpu_prof_host(TPU_PROF_WAIT, 0, tpu_prof_t0(), 0, NULL);
  tpu_prof_ran(devs, 2, tpu_prof_t0(), "all_reduce over %d devices", 2);
  tpu_prof_host(TPU_PROF_UPLOAD, 0, tpu_prof_t0(), 8, NULL);
  tpu_prof_stop();
  n = snap(NULL);
  CHECK(n == 3 && recs[0].kind == TPU_PROF_EXECUTE && recs[1].kind == TPU_PROF_EXECUTE && recs[0].dev == 0 &&
            recs[1].dev == 1 && recs[0].flow != 0 && recs[1].flow == 0 && recs[2].kind == TPU_PROF_UPLOAD,
        "device session: %zu records", n);
}

/* A program launched while the device still ran the one before starts at
 * that one's completion; one on another device keeps its launch time. */
static void test_order(void) {
  tpu_prof_start(TPU_PROF_DEVICE);
  int64_t a0 = tpu_prof_t0();
  tpu_prof_launch(NULL, 0, a0, NULL, "a");
  tpu_prof_launch(NULL, 0, a0 + 1, NULL, "b"); /* launched before a completed */
  tpu_prof_launch(NULL, 1, a0 + 1, NULL, "c");
  tpu_prof_stop();
  size_t n = snap(NULL);
  CHECK(n == 3 && recs[1].t0 == recs[0].t1 && recs[1].t1 >= recs[1].t0 && recs[2].t0 == a0 + 1,
        "b starts at %lld (a ends %lld), c at %lld", (long long)recs[1].t0, (long long)recs[0].t1,
        (long long)recs[2].t0);
}

static void test_bounded(void) {
  tpu_prof_start(TPU_PROF_HOST);
  for (int k = 0; k < TPU_PROF_CAPACITY + 10; k++) tpu_prof_host(TPU_PROF_WAIT, 0, tpu_prof_t0(), 0, NULL);
  tpu_prof_stop();
  uint64_t dropped = 0;
  size_t n = snap(&dropped);
  CHECK(n == TPU_PROF_CAPACITY && dropped == 10, "%zu kept, %llu dropped", n, (unsigned long long)dropped);
  tpu_prof_start(TPU_PROF_HOST); /* a new session starts empty */
  tpu_prof_stop();
  CHECK(snap(&dropped) == 0 && dropped == 0, "the next session is not empty");
}

/* Programs on the plugin: their EXECUTE ends on the completion callback. */
static tpu_rt *rt;
static tpu_rt_exec *square;

static void launch_square(tpu_rt_buffer *in, int times) {
  tpu_rt_buffer *cur = in, *next = NULL;
  tpu_rt_event *ev[8] = {0};
  for (int k = 0; k < times; k++) {
    int64_t p0 = tpu_prof_t0();
    if (!OK(tpu_rt_execute_async(rt, square, &cur, 1, &next, &ev[k]), "launch")) break;
    tpu_prof_launch(rt, 0, p0, ev[k], "aten::%s", "mul.Tensor");
    if (cur != in) tpu_rt_buffer_free(cur);
    cur = next;
  }
  for (int k = 0; k < times; k++) OK(tpu_rt_event_wait(rt, ev[k]), "wait");
  if (cur != in) tpu_rt_buffer_free(cur);
}

static void *launch_thread(void *in) {
  launch_square(in, 3);
  return NULL;
}

static void test_plugin(void) {
  static const char prog[] =
      "module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
      "  func.func public @main(%arg0: tensor<256xf32>) -> tensor<256xf32> {\n"
      "    %0 = \"stablehlo.multiply\"(%arg0, %arg0) : (tensor<256xf32>, tensor<256xf32>) -> tensor<256xf32>\n"
      "    \"func.return\"(%0) : (tensor<256xf32>) -> ()\n"
      "  }\n"
      "}\n";
  if (!OK(tpu_rt_compile(rt, prog, sizeof prog - 1, &square), "compile")) return;
  float x[256] = {0};
  int64_t d = 256;
  tpu_rt_buffer *in = NULL;
  if (!OK(tpu_rt_buffer_from_host(rt, x, TPU_F32, &d, 1, &in), "upload")) return;
  tpu_prof_start(TPU_PROF_HOST | TPU_PROF_DEVICE);
  int64_t start = tpu_prof_now();
  launch_square(in, 4);
  pthread_t th;
  if (pthread_create(&th, NULL, launch_thread, in) == 0) pthread_join(th, NULL);
  tpu_prof_stop();
  int64_t end = tpu_prof_now();
  size_t n = snap(NULL);
  int launches = 0, done = 0;
  for (size_t k = 0; k < n; k++) {
    if (recs[k].kind == TPU_PROF_LAUNCH) launches++;
    if (recs[k].kind != TPU_PROF_EXECUTE) continue;
    CHECK(recs[k].t1 >= recs[k].t0 && recs[k].t0 >= start && recs[k].t1 <= end && recs[k].flow == recs[k - 1].flow,
          "execute %zu: %lld .. %lld in %lld .. %lld", k, (long long)recs[k].t0, (long long)recs[k].t1,
          (long long)start, (long long)end);
    done += recs[k].t1 >= 0;
  }
  CHECK(launches == 7 && done == 7, "%d launches, %d completed executions of 7", launches, done);
  tpu_rt_buffer_free(in);
  tpu_rt_exec_free(square);
}

int main(int argc, char **argv) {
  test_outside();
  test_session();
  test_kinds();
  test_order();
  test_bounded();
  if (argc > 1) {
    tpu_rt_options o = {argv[1], "cpu", 1, 0, 1};
    if (OK(tpu_rt_open(&o, &rt), "tpu_rt_open")) {
      test_plugin();
      tpu_rt_close(rt);
    }
  }
  test_outside();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
