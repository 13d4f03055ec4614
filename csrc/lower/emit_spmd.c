/* emit_spmd.c: ops of programs over a mesh of devices (ops_spmd.def). */
#include "emit.h"

#include "../mesh.h"

/* tpu::spmd_constraint(self, mesh, dim_axis): self, laid out inside the
 * program as dim_axis says over the program's mesh (dimension i split over
 * mesh axis dim_axis[i], -1: not split); the partitioner moves the data. Only
 * in a program over a mesh (one that reads a tensor laid over one). */
void tpu_emit_spmd_constraint(tpu_lower *L) {
  tpu_hv x = tpu_lower_tensor(L, 0, -1);
  const tpu_arg *mesh = &L->args[1], *axes = &L->args[2];
  int rank = L->args[0].t.rank;
  if (!tpu_hlo_has_mesh(H) && L->plans_only) { /* the program that runs it says */
    tpu_lower_out(L, x);
    return;
  }
  if (!tpu_hlo_has_mesh(H)) {
    tpu_lower_fail(L, TPU_ERR_RUNTIME,
                   "spmd.constrain: the tensor is not on a mesh of devices (lay it out with torchtpu.spmd.shard)");
    return;
  }
  if (axes->nints != rank || mesh->nints < 1 || mesh->nints > TPU_MESH_MAX_AXES) {
    tpu_lower_fail(L, TPU_ERR_VALUE, "spmd.constrain: %d placements for a tensor of %d dimensions", axes->nints, rank);
    return;
  }
  int8_t dim_axis[TPU_MAX_RANK];
  for (int i = 0; i < rank; i++) dim_axis[i] = (int8_t)axes->ints[i];
  tpu_sharding sh = tpu_sharding_make(mesh->nints, mesh->ints, rank, dim_axis);
  tpu_lower_out(L, tpu_hlo_sharding_constraint(H, x, &sh));
}
