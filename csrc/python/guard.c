/* guard.c: the C side of torch's device guard for the tpu (guard_api.h): the
 * local device count as torch.tpu.device_count() says it, kept where any
 * thread can read it without the GIL, and the thread's current device.
 */
#include "bind.h"

#include <stdatomic.h>

#include "guard_api.h"

/* Set by init() (0 when no plugin can be used; TORCHTPU_NUM_DEVICES on the
 * CPU plugin, known without loading it; else 1 until the runtime starts) and
 * at the runtime's start (the devices it has). */
static atomic_int tpu_guard_ndev = 1;

void tpu_guard_set_count(int n) { atomic_store(&tpu_guard_ndev, n); }

static int tpu_guard_count(void) { return atomic_load(&tpu_guard_ndev); }

static void tpu_guard_select(int index) {
  if (index >= 0) tpu_engine_select_device(index);
}

/* The engine whose generator is the default one (set by init). */
static tpu_engine *tpu_guard_engine;

void tpu_guard_set_engine(tpu_engine *e) { tpu_guard_engine = e; }

static void tpu_guard_rng_state(uint64_t *seed, uint64_t *offset) {
  *seed = TPU_DEFAULT_SEED;
  *offset = 0;
  if (tpu_guard_engine) tpu_engine_rng_state(tpu_guard_engine, seed, offset);
}

static void tpu_guard_set_rng_state(uint64_t seed, uint64_t offset) {
  if (tpu_guard_engine) tpu_engine_set_rng_state(tpu_guard_engine, seed, offset);
}

static const tpu_guard_api tpu_guard_table = {
    TPU_GUARD_API_VERSION, tpu_guard_count,     tpu_engine_thread_device,
    tpu_guard_select,      tpu_guard_rng_state, tpu_guard_set_rng_state,
};

PyObject *tpu_guard_capsule(void) { return PyCapsule_New((void *)&tpu_guard_table, TPU_GUARD_API_NAME, NULL); }
