/* mesh.h: how a tensor is laid out over a device mesh, for single-controller
 * SPMD programs: the tpu_sharding and its pure geometry (pure C, no module
 * needed). It sits beside call.h, below the engine, the lowering and the
 * HLO builder; hlo/sharding.h writes it as GSPMD and Shardy text.
 *
 * The mesh is a 1- to 4-axis grid of mesh[0] x ... x mesh[mesh_rank-1]
 * devices, numbered 0..N-1 in row-major order of their mesh coordinates (a
 * mesh of rank 0 is one device). A tpu_sharding splits each tensor dimension
 * over at most one mesh axis (dim_axis[i], -1 for none), each mesh axis splits
 * at most one dimension, and the tensor is replicated over the axes that split
 * nothing. Device d holds the block of the tensor whose index along a
 * dimension split over axis a is d's coordinate on a.
 */
#ifndef TPU_MESH_H
#define TPU_MESH_H

#include "core.h"

#define TPU_MESH_MAX_AXES 4
#define TPU_MESH_MAX_DEVICES (1 << 24)

typedef struct {
  int mesh_rank;                   /* 0..TPU_MESH_MAX_AXES */
  int64_t mesh[TPU_MESH_MAX_AXES]; /* axis sizes, >= 1 */
  int8_t dim_axis[TPU_MAX_RANK];   /* per tensor dim: the mesh axis it is split over, -1 none */
  int rank;                        /* the tensor's rank */
} tpu_sharding;

/* A sharding of a rank-`rank` tensor over mesh[0..mesh_rank); dim_axis NULL:
 * replicated. Not checked (see tpu_sharding_check). */
tpu_sharding tpu_sharding_make(int mesh_rank, const int64_t *mesh, int rank, const int8_t *dim_axis);
/* NULL when s is well formed (ranks in range, axes >= 1 and in range, no axis
 * used twice, at most TPU_MESH_MAX_DEVICES devices) and, with dims (the
 * tensor's shape, rank s->rank) given, every split dimension is divisible by
 * its axis's size; otherwise an owned TPU_ERR_VALUE status naming the
 * dimension, its size and the axis's size. */
tpu_status *tpu_sharding_check(const tpu_sharding *s, const int64_t *dims);
/* Same mesh, same rank, same split of every dimension. */
bool tpu_sharding_eq(const tpu_sharding *a, const tpu_sharding *b);
/* Every device holds the whole tensor: no dimension is split over an axis
 * larger than 1. */
bool tpu_sharding_is_replicated(const tpu_sharding *s);
/* mesh[0] * ... * mesh[mesh_rank-1] (1 for rank 0). */
int64_t tpu_sharding_num_devices(const tpu_sharding *s);
/* Each device's block of a tensor of shape dims: its shape, and for device
 * `device` (0..N-1) its offset in each dimension. False (outputs untouched)
 * when s and dims fail tpu_sharding_check or device is out of range. */
bool tpu_sharding_shard_dims(const tpu_sharding *s, const int64_t *dims, int64_t *shard_dims);
bool tpu_sharding_shard_offsets(const tpu_sharding *s, const int64_t *dims, int64_t device, int64_t *offsets);

#endif
