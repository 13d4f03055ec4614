/* tensor_api.h: what torchtpu._device_guard (C++, built against the
 * installed torch) hands torchtpu._C to read a tensor's metadata without
 * Python attribute calls: its dtype, device, sizes, strides, storage offset
 * and storage (six Python calls a tensor otherwise; csrc/python/tensor.c).
 * A capsule named TPU_TENSOR_API_NAME, attribute tensor_api of the module. */
#ifndef TPU_TENSOR_API_H
#define TPU_TENSOR_API_H

#include <stdint.h>

#define TPU_TENSOR_API_NAME "torchtpu._device_guard.tensor_api"
#define TPU_TENSOR_API_VERSION 1
#define TPU_TENSOR_META_RANK 64 /* TPU_MAX_RANK: sizes and strides of more dims are not filled */

typedef struct {
  int scalar_type; /* c10::ScalarType */
  int device_type; /* c10::DeviceType: 0 CPU, TPU_TENSOR_PRIVATEUSE1 the tpu */
  int rank;
  int64_t sizes[TPU_TENSOR_META_RANK], strides[TPU_TENSOR_META_RANK];
  int64_t offset;   /* in elements */
  const void *data; /* the start of the storage; NULL when it has none */
} tpu_tensor_meta;

#define TPU_TENSOR_PRIVATEUSE1 20
#define TPU_SCALAR_TYPES 64 /* c10::ScalarType values mapped */

typedef struct {
  int version; /* TPU_TENSOR_API_VERSION */
  /* tensor: a torch.Tensor (an instance of torch._C.TensorBase, checked by
   * the caller). 0, or -1 when it must be read through Python (a tensor
   * without strides or storage, symbolic sizes, a Python dispatch
   * subclass); never raises, the GIL held. */
  int (*meta)(void *tensor, tpu_tensor_meta *out);
  /* dtype: one of torch's dtype objects (checked by the caller): its
   * c10::ScalarType */
  int (*scalar_type)(void *dtype);
} tpu_tensor_api;

#endif
