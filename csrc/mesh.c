/* mesh.c: shardings over a device mesh (see mesh.h): checks, shard shapes
 * and offsets. Their GSPMD and Shardy spellings are hlo/sharding.c's.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "mesh.h"

tpu_sharding tpu_sharding_make(int mesh_rank, const int64_t *mesh, int rank, const int8_t *dim_axis) {
  tpu_sharding s;
  memset(&s, 0, sizeof s);
  s.mesh_rank = mesh_rank;
  s.rank = rank;
  for (int a = 0; a < mesh_rank && a < TPU_MESH_MAX_AXES; a++) s.mesh[a] = mesh[a];
  for (int i = 0; i < TPU_MAX_RANK; i++) s.dim_axis[i] = (int8_t)(dim_axis && i < rank ? dim_axis[i] : -1);
  return s;
}

/* The checks without dims, as a message into msg (empty when valid). */
static bool tpu_shape_ok(const tpu_sharding *s, char *msg, size_t n) {
  msg[0] = 0;
  if (s->mesh_rank < 0 || s->mesh_rank > TPU_MESH_MAX_AXES) {
    snprintf(msg, n, "sharding: mesh rank %d (0 to %d supported)", s->mesh_rank, TPU_MESH_MAX_AXES);
    return false;
  }
  int64_t devices = 1;
  for (int a = 0; a < s->mesh_rank; a++) {
    if (s->mesh[a] < 1 || s->mesh[a] > TPU_MESH_MAX_DEVICES) {
      snprintf(msg, n, "sharding: mesh axis %d has size %lld", a, (long long)s->mesh[a]);
      return false;
    }
    devices *= s->mesh[a];
    if (devices > TPU_MESH_MAX_DEVICES) {
      snprintf(msg, n, "sharding: a mesh of more than %d devices", TPU_MESH_MAX_DEVICES);
      return false;
    }
  }
  if (s->rank < 0 || s->rank > TPU_MAX_RANK) {
    snprintf(msg, n, "sharding: tensor rank %d (0 to %d supported)", s->rank, TPU_MAX_RANK);
    return false;
  }
  for (int i = 0; i < s->rank; i++) {
    int a = s->dim_axis[i];
    if (a < -1 || a >= s->mesh_rank) {
      snprintf(msg, n, "sharding: dimension %d is split over mesh axis %d, but the mesh has %d axes", i, a,
               s->mesh_rank);
      return false;
    }
    for (int j = 0; j < i && a >= 0; j++)
      if (s->dim_axis[j] == a) {
        snprintf(msg, n, "sharding: mesh axis %d splits both dimension %d and dimension %d", a, j, i);
        return false;
      }
  }
  return true;
}

tpu_status *tpu_sharding_check(const tpu_sharding *s, const int64_t *dims) {
  char msg[160];
  if (!tpu_shape_ok(s, msg, sizeof msg)) return tpu_status_new(TPU_ERR_VALUE, "%s", msg);
  for (int i = 0; dims && i < s->rank; i++) {
    if (dims[i] < 0)
      return tpu_status_new(TPU_ERR_VALUE, "sharding: dimension %d has size %lld", i, (long long)dims[i]);
    int a = s->dim_axis[i];
    if (a >= 0 && dims[i] % s->mesh[a] != 0)
      return tpu_status_new(TPU_ERR_VALUE,
                            "sharding: dimension %d of size %lld is not divisible by mesh axis %d of size %lld", i,
                            (long long)dims[i], a, (long long)s->mesh[a]);
  }
  return NULL;
}

bool tpu_sharding_eq(const tpu_sharding *a, const tpu_sharding *b) {
  if (a->mesh_rank != b->mesh_rank || a->rank != b->rank) return false;
  for (int i = 0; i < a->mesh_rank && i < TPU_MESH_MAX_AXES; i++)
    if (a->mesh[i] != b->mesh[i]) return false;
  for (int i = 0; i < a->rank && i < TPU_MAX_RANK; i++)
    if (a->dim_axis[i] != b->dim_axis[i]) return false;
  return true;
}

bool tpu_sharding_is_replicated(const tpu_sharding *s) {
  for (int i = 0; i < s->rank && i < TPU_MAX_RANK; i++)
    if (s->dim_axis[i] >= 0 && s->dim_axis[i] < TPU_MESH_MAX_AXES && s->mesh[s->dim_axis[i]] > 1) return false;
  return true;
}

int64_t tpu_sharding_num_devices(const tpu_sharding *s) {
  int64_t n = 1;
  for (int a = 0; a < s->mesh_rank && a < TPU_MESH_MAX_AXES; a++) n *= s->mesh[a];
  return n;
}

static bool tpu_sharding_valid(const tpu_sharding *s, const int64_t *dims) {
  tpu_status *st = tpu_sharding_check(s, dims);
  tpu_status_free(st);
  return st == NULL;
}

bool tpu_sharding_shard_dims(const tpu_sharding *s, const int64_t *dims, int64_t *shard_dims) {
  if (!tpu_sharding_valid(s, dims)) return false;
  for (int i = 0; i < s->rank; i++) shard_dims[i] = s->dim_axis[i] >= 0 ? dims[i] / s->mesh[s->dim_axis[i]] : dims[i];
  return true;
}

/* Device d's coordinate on each mesh axis (row-major numbering). */
static void tpu_device_coords(const tpu_sharding *s, int64_t d, int64_t *coord) {
  for (int a = s->mesh_rank - 1; a >= 0; a--) {
    coord[a] = d % s->mesh[a];
    d /= s->mesh[a];
  }
}

bool tpu_sharding_shard_offsets(const tpu_sharding *s, const int64_t *dims, int64_t device, int64_t *offsets) {
  if (!tpu_sharding_valid(s, dims) || device < 0 || device >= tpu_sharding_num_devices(s)) return false;
  int64_t coord[TPU_MESH_MAX_AXES];
  tpu_device_coords(s, device, coord);
  for (int i = 0; i < s->rank; i++) {
    int a = s->dim_axis[i];
    offsets[i] = a >= 0 ? coord[a] * (dims[i] / s->mesh[a]) : 0;
  }
  return true;
}
