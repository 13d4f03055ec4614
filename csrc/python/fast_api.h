/* fast_api.h: how torch's dispatcher calls a Kernel (kernel.c) with no
 * Python between them. torchtpu._device_guard (C++, csrc/guard/boxed.cpp)
 * registers a boxed kernel per ATen row; it reads torch's argument stack into
 * these plain values, takes the GIL and calls the Kernel through this table,
 * then makes the returned records tensors (a DLPack import in C++). What it
 * cannot read, and what the Kernel asks Python for, goes through the Kernel's
 * Python call as before. A capsule named TPU_FAST_API_NAME, attribute
 * fast_api of torchtpu._C. */
#ifndef TPU_FAST_API_H
#define TPU_FAST_API_H

#include <stdint.h>

#include "generator_api.h"
#include "tensor_api.h"

#define TPU_FAST_API_NAME "torchtpu._C.fast_api"
#define TPU_FAST_API_VERSION 2
#define TPU_FAST_MAX_ARGS 24 /* TPU_MAX_ARGS */
#define TPU_FAST_MAX_RETS 8
#define TPU_FAST_PYTHON (-2) /* call's answer: run the Kernel's Python call instead */

enum {
  TPU_FA_NONE,
  TPU_FA_TENSOR,    /* t: one */
  TPU_FA_TENSORS,   /* t: n of them; an item of rank -1 is None */
  TPU_FA_INT,       /* i */
  TPU_FA_FLOAT,     /* f */
  TPU_FA_BOOL,      /* i: 0 or 1 */
  TPU_FA_COMPLEX,   /* f, f_imag */
  TPU_FA_INTS,      /* ints: n */
  TPU_FA_FLOATS,    /* floats: n */
  TPU_FA_STR,       /* str */
  TPU_FA_DEVICE,    /* i: its index + 1, 0 when it has none */
  TPU_FA_GENERATOR, /* gen: a tpu generator's own state (a default one is NONE) */
  TPU_FA_OTHER      /* anything else (a layout, a memory format): ignored or refused by its kind */
};

typedef struct {
  int tag;        /* TPU_FA_* */
  int is_default; /* equal to the schema's default */
  int64_t i;
  double f, f_imag;
  const tpu_tensor_meta *t;
  const int64_t *ints;
  const double *floats;
  int n;
  const char *str;
  tpu_generator_state *gen;
} tpu_fast_arg;

/* One value the call returns: a new tensor (dlpack: a DLManagedTensor the
 * caller imports, which then owns it), or argument arg (item >= 0: that item
 * of a tensor list argument). resize: the new tensor becomes argument arg's
 * contents (Tensor.set_), and the argument is returned. */
typedef struct {
  void *dlpack;
  int arg, item, resize;
} tpu_fast_ret;

typedef struct {
  int version; /* TPU_FAST_API_VERSION */
  /* Runs kernel (a torchtpu._C.Kernel) on nargs arguments, the GIL held.
   * Returns how many values rets holds, -1 with a Python exception set, or
   * TPU_FAST_PYTHON (nothing done). */
  int (*call)(void *kernel, const tpu_fast_arg *args, int nargs, tpu_fast_ret *rets, int maxrets);
  /* Frees a returned DLManagedTensor that was not imported. */
  void (*release)(void *dlpack);
} tpu_fast_api;

#endif
