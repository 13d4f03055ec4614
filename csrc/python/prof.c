/* prof.c: what torch's profiler session for the tpu reads (prof_api.h; the
 * session is csrc/guard/profiler.cpp). The records made are counted in
 * metrics() as profiler_records.
 */
#include "bind.h"
#include "prof_api.h"

static const tpu_prof_api tpu_prof_table = {
    TPU_PROF_API_VERSION, tpu_prof_start, tpu_prof_stop, tpu_prof_snapshot, tpu_prof_set_correlation,
};

PyObject *tpu_prof_capsule(void) { return PyCapsule_New((void *)&tpu_prof_table, TPU_PROF_API_NAME, NULL); }
