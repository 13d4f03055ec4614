/* sharding_read.c: the layouts XLA's partitioner chose, read back from the
 * program it optimized (the reading half of sharding.c, which writes them).
 *
 * The optimized program is a serialized HloModuleProto (or an
 * HloModuleProtoWithConfig holding it as field 1); its field 12,
 * spmd_output_sharding, is an OpSharding: a TUPLE (type 2) of one OpSharding
 * per output (field 5), or one sharding for a single output. An OpSharding
 * is REPLICATED (type 0) or tiled (OTHER, type 3): tile_assignment_dimensions
 * (field 3) cut the tensor into tiles, one per device, with trailing tile
 * dimensions that replicate (replicate_on_last_tile_dim, field 6, or
 * last_tile_dims, field 8, all REPLICATED); which device holds which tile is
 * an explicit list (field 4) or an iota of iota_reshape_dims (field 9)
 * transposed by iota_transpose_perm (field 10). A tiling is said as a
 * tpu_sharding when each split dimension's tiles follow one whole mesh axis
 * in the mesh's device order; anything else is refused.
 */
#include <stdlib.h>
#include <string.h>

#include "hlo.h"

enum { TPU_OPS_MAX_DIMS = TPU_MAX_RANK + 4 };

typedef struct {
  const uint8_t *p, *end;
} tpu_pb;

typedef struct {
  uint64_t type;
  int ntile, nreshape, nperm, nlast;
  int64_t tile[TPU_OPS_MAX_DIMS], reshape[TPU_OPS_MAX_DIMS], perm[TPU_OPS_MAX_DIMS];
  bool replicate_last, last_ok, dims_ok;
  tpu_pb devices; /* field 4's bytes, packed or one varint per tag (empty: none) */
  bool devices_packed;
  bool named;    /* field 14, a NamedShardingProto: the other fields are ignored */
  tpu_pb nbytes; /* its bytes */
} tpu_opsharding;

static bool tpu_pb_u64(tpu_pb *b, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64 && b->p < b->end; shift += 7) {
    uint8_t x = *b->p++;
    *v |= (uint64_t)(x & 0x7f) << shift;
    if (x < 0x80) return true;
  }
  return false;
}

/* The next field: its number, wire type, and for wire type 2 its bytes. */
static bool tpu_pb_field(tpu_pb *b, uint64_t *field, int *wire, uint64_t *v, tpu_pb *sub) {
  uint64_t key;
  if (!tpu_pb_u64(b, &key)) return false;
  *field = key >> 3;
  *wire = (int)(key & 7);
  switch (*wire) {
    case 0: return tpu_pb_u64(b, v);
    case 1:
    case 5: {
      size_t n = *wire == 1 ? 8 : 4;
      if ((size_t)(b->end - b->p) < n) return false;
      b->p += n;
      return true;
    }
    case 2: {
      uint64_t n;
      if (!tpu_pb_u64(b, &n) || n > (uint64_t)(b->end - b->p)) return false;
      sub->p = b->p;
      sub->end = b->p + n;
      b->p += n;
      return true;
    }
    default: return false;
  }
}

/* The last length-delimited field `field` of b into *sub: 1 found, 0 not
 * there, -1 malformed bytes. */
static int tpu_pb_find(tpu_pb b, uint64_t field, tpu_pb *sub) {
  int found = 0;
  while (b.p < b.end) {
    uint64_t f, v;
    int w;
    tpu_pb s = {NULL, NULL};
    if (!tpu_pb_field(&b, &f, &w, &v, &s)) return -1;
    if (f == field && w == 2) {
      *sub = s;
      found = 1;
    }
  }
  return found;
}

/* A repeated int64 field's value(s) appended to a[*n] (at most TPU_OPS_MAX_DIMS). */
static bool tpu_pb_ints(int wire, uint64_t v, tpu_pb sub, int64_t *a, int *n) {
  if (wire == 0) {
    if (*n >= TPU_OPS_MAX_DIMS) return false;
    a[(*n)++] = (int64_t)v;
    return true;
  }
  while (sub.p < sub.end) {
    if (*n >= TPU_OPS_MAX_DIMS || !tpu_pb_u64(&sub, &v)) return false;
    a[(*n)++] = (int64_t)v;
  }
  return true;
}

static bool tpu_opsharding_parse(tpu_pb b, tpu_opsharding *o) {
  memset(o, 0, sizeof *o);
  o->last_ok = o->dims_ok = true;
  while (b.p < b.end) {
    uint64_t f, v = 0;
    int w;
    tpu_pb sub = {NULL, NULL};
    if (!tpu_pb_field(&b, &f, &w, &v, &sub)) return false;
    if (f == 1 && w == 0) o->type = v;
    if (f == 3 && !tpu_pb_ints(w, v, sub, o->tile, &o->ntile)) o->dims_ok = false;
    if (f == 9 && !tpu_pb_ints(w, v, sub, o->reshape, &o->nreshape)) o->dims_ok = false;
    if (f == 10 && !tpu_pb_ints(w, v, sub, o->perm, &o->nperm)) o->dims_ok = false;
    if (f == 6 && w == 0) o->replicate_last = v != 0;
    if (f == 8) { /* last_tile_dims: every one must be REPLICATED (0) */
      int64_t t[TPU_OPS_MAX_DIMS];
      int nt = 0;
      if (!tpu_pb_ints(w, v, sub, t, &nt)) return false;
      for (int i = 0; i < nt; i++) o->last_ok = o->last_ok && t[i] == 0;
      o->nlast += nt;
    }
    if (f == 14 && w == 2) {
      o->named = true;
      o->nbytes = sub;
    }
    if (f == 4) {
      if (w == 2) {
        o->devices = sub;
        o->devices_packed = true;
      } else {
        o->dims_ok = false; /* an unpacked device list: not written by XLA */
      }
    }
  }
  return true;
}

/* pos[d]: the flat tile index device d holds (n devices). */
static bool tpu_opsharding_positions(const tpu_opsharding *o, int64_t n, int64_t *pos) {
  for (int64_t d = 0; d < n; d++) pos[d] = -1;
  if (o->devices_packed) {
    tpu_pb b = o->devices;
    for (int64_t f = 0; f < n; f++) {
      uint64_t d;
      if (!tpu_pb_u64(&b, &d) || d >= (uint64_t)n || pos[d] >= 0) return false;
      pos[d] = f;
    }
    return b.p == b.end;
  }
  /* the iota: device of flat index f of transpose(iota(reshape), perm) */
  int nr = o->nreshape;
  int64_t rdims[TPU_OPS_MAX_DIMS], tdims[TPU_OPS_MAX_DIMS];
  if (nr == 0) { /* none given: devices in order */
    nr = 1;
    rdims[0] = n;
  } else {
    memcpy(rdims, o->reshape, sizeof(int64_t) * (size_t)nr);
  }
  int64_t total = 1;
  bool used[TPU_OPS_MAX_DIMS] = {false};
  if (o->nreshape && o->nperm != nr) return false;
  for (int j = 0; j < nr; j++) {
    int64_t pj = o->nreshape ? o->perm[j] : j;
    if (pj < 0 || pj >= nr || used[pj] || rdims[j] < 1) return false;
    used[pj] = true;
    tdims[j] = rdims[pj];
    total *= rdims[j];
    if (total > n) return false;
  }
  if (total != n) return false;
  for (int64_t f = 0; f < n; f++) {
    int64_t c[TPU_OPS_MAX_DIMS], rem = f, d = 0;
    for (int j = nr - 1; j >= 0; j--) {
      c[j] = rem % tdims[j];
      rem /= tdims[j];
    }
    int64_t orig[TPU_OPS_MAX_DIMS];
    for (int j = 0; j < nr; j++) orig[o->nreshape ? o->perm[j] : j] = c[j];
    for (int j = 0; j < nr; j++) d = d * rdims[j] + orig[j];
    if (pos[d] >= 0) return false;
    pos[d] = f;
  }
  return true;
}

/* Whether dim_axis[0..rank) lays every device's tile as the mesh says. */
static bool tpu_opsharding_matches(const tpu_opsharding *o, int rank, int mesh_rank, const int64_t *mesh, int64_t n,
                                   const int64_t *pos, const int8_t *dim_axis) {
  for (int64_t d = 0; d < n; d++) {
    int64_t mc[TPU_MESH_MAX_AXES], rem = d, tc[TPU_OPS_MAX_DIMS], f = pos[d];
    for (int a = mesh_rank - 1; a >= 0; a--) {
      mc[a] = rem % mesh[a];
      rem /= mesh[a];
    }
    for (int i = o->ntile - 1; i >= 0; i--) {
      tc[i] = f % o->tile[i];
      f /= o->tile[i];
    }
    for (int i = 0; i < rank; i++)
      if (tc[i] != (dim_axis[i] < 0 ? 0 : mc[dim_axis[i]])) return false;
  }
  return true;
}

/* Backtracking over the tensor's dims: each split one takes an unused mesh
 * axis of its tile count. */
static bool tpu_opsharding_assign(const tpu_opsharding *o, int rank, int mesh_rank, const int64_t *mesh, int64_t n,
                                  const int64_t *pos, int i, int8_t *dim_axis, unsigned used) {
  if (i == rank) return tpu_opsharding_matches(o, rank, mesh_rank, mesh, n, pos, dim_axis);
  if (o->tile[i] == 1) {
    dim_axis[i] = -1;
    return tpu_opsharding_assign(o, rank, mesh_rank, mesh, n, pos, i + 1, dim_axis, used);
  }
  for (int a = 0; a < mesh_rank; a++) {
    if ((used & (1u << a)) || mesh[a] != o->tile[i]) continue;
    dim_axis[i] = (int8_t)a;
    if (tpu_opsharding_assign(o, rank, mesh_rank, mesh, n, pos, i + 1, dim_axis, used | (1u << a))) return true;
  }
  return false;
}

/* Our mesh axis of a named mesh's axis (name, size): "a<k>" as sharding.c
 * names them, else the same position when the meshes have as many axes;
 * -1 when neither holds with the same size. */
static int tpu_named_axis(tpu_pb name, int64_t size, int j, int naxes, int mesh_rank, const int64_t *mesh) {
  size_t n = (size_t)(name.end - name.p);
  if (n >= 2 && n <= 3 && name.p[0] == 'a') {
    int k = 0;
    for (size_t i = 1; i < n; i++) k = name.p[i] >= '0' && name.p[i] <= '9' ? k * 10 + (name.p[i] - '0') : -1000;
    if (k >= 0 && k < mesh_rank) return mesh[k] == size ? k : -1;
  }
  return naxes == mesh_rank && j < mesh_rank && mesh[j] == size ? j : -1;
}

/* A NamedShardingProto (OpSharding's field 14, Shardy's form: a mesh of named
 * axes, per dimension the axes it is split over) as a tpu_sharding: the mesh
 * is ours (same axes, devices in order), each dimension split over at most
 * one whole axis, nothing unreduced. */
static bool tpu_named_to(tpu_pb b, int rank, int mesh_rank, const int64_t *mesh, tpu_sharding *out) {
  if (rank < 0 || rank > TPU_MAX_RANK || mesh_rank < 0 || mesh_rank > TPU_MESH_MAX_AXES) return false;
  int amap[TPU_OPS_MAX_DIMS], naxes = 0, ndims = 0;
  tpu_pb meshb = {NULL, NULL}, dims[TPU_MAX_RANK];
  while (b.p < b.end) {
    uint64_t f, v = 0;
    int w;
    tpu_pb sub = {NULL, NULL};
    if (!tpu_pb_field(&b, &f, &w, &v, &sub)) return false;
    if (f == 1 || f == 5) return false; /* a tuple here, unreduced axes */
    if (f == 2 && w == 2) meshb = sub;
    if (f == 3) {
      if (w != 2 || ndims >= rank) return false;
      dims[ndims++] = sub;
    }
  }
  if (ndims != rank) return false;
  /* the mesh: its axes mapped to ours; an explicit device order is not ours */
  tpu_pb names[TPU_OPS_MAX_DIMS];
  int64_t sizes[TPU_OPS_MAX_DIMS];
  while (meshb.p && meshb.p < meshb.end) {
    uint64_t f, v = 0;
    int w;
    tpu_pb sub = {NULL, NULL};
    if (!tpu_pb_field(&meshb, &f, &w, &v, &sub)) return false;
    if (f == 2) return false; /* device_ids */
    if (f != 1 || w != 2) continue;
    if (naxes >= TPU_OPS_MAX_DIMS) return false;
    names[naxes] = (tpu_pb){NULL, NULL};
    sizes[naxes] = 1;
    while (sub.p < sub.end) {
      uint64_t g, x = 0;
      int wx;
      tpu_pb s2 = {NULL, NULL};
      if (!tpu_pb_field(&sub, &g, &wx, &x, &s2)) return false;
      if (g == 1 && wx == 2) names[naxes] = s2;
      if (g == 2 && wx == 0) sizes[naxes] = (int64_t)x;
    }
    naxes++;
  }
  for (int j = 0; j < naxes; j++)
    amap[j] = names[j].p ? tpu_named_axis(names[j], sizes[j], j, naxes, mesh_rank, mesh) : -1;
  int8_t dim_axis[TPU_MAX_RANK];
  for (int i = 0; i < rank; i++) {
    dim_axis[i] = -1;
    tpu_pb d = dims[i];
    while (d.p < d.end) {
      uint64_t f, v = 0;
      int w;
      tpu_pb ref = {NULL, NULL};
      if (!tpu_pb_field(&d, &f, &w, &v, &ref)) return false;
      if (f != 1) continue;
      if (w != 2) return false;
      uint64_t idx = 0; /* AxisRefProto: mesh_axis_index (1); a sub-axis (2) is not ours */
      while (ref.p < ref.end) {
        uint64_t g, x = 0;
        int wx;
        tpu_pb s2 = {NULL, NULL};
        if (!tpu_pb_field(&ref, &g, &wx, &x, &s2)) return false;
        if (g == 2) return false;
        if (g == 1 && wx == 0) idx = x;
      }
      if (idx >= (uint64_t)naxes || amap[idx] < 0) return false;
      if (mesh[amap[idx]] == 1) continue; /* split over a 1-device axis: whole */
      if (dim_axis[i] >= 0) return false; /* split over two axes */
      dim_axis[i] = (int8_t)amap[idx];
    }
  }
  *out = tpu_sharding_make(mesh_rank, mesh, rank, dim_axis);
  tpu_status *c = tpu_sharding_check(out, NULL); /* no axis twice */
  bool ok = c == NULL;
  tpu_status_free(c);
  return ok;
}

/* One output's OpSharding as a tpu_sharding of a rank-`rank` tensor. */
static bool tpu_opsharding_to(const tpu_opsharding *o, int rank, int mesh_rank, const int64_t *mesh,
                              tpu_sharding *out) {
  if (o->named) return tpu_named_to(o->nbytes, rank, mesh_rank, mesh, out);
  if (o->type == 0) { /* REPLICATED */
    *out = tpu_sharding_make(mesh_rank, mesh, rank, NULL);
    return true;
  }
  if (rank < 0 || rank > TPU_MAX_RANK || mesh_rank < 0 || mesh_rank > TPU_MESH_MAX_AXES) return false;
  if (o->type != 3 || !o->dims_ok || !o->last_ok) return false; /* MAXIMAL, MANUAL, UNKNOWN, ... */
  int extra = o->replicate_last ? 1 : o->nlast;
  if (o->ntile != rank + extra) return false;
  int64_t n = 1, tiles = 1;
  for (int a = 0; a < mesh_rank; a++) n *= mesh[a];
  for (int i = 0; i < o->ntile; i++) {
    if (o->tile[i] < 1 || o->tile[i] > n) return false;
    tiles *= o->tile[i];
    if (tiles > n) return false;
  }
  if (tiles != n) return false;
  int64_t *pos = malloc(sizeof *pos * (size_t)n);
  if (!pos) return false;
  int8_t dim_axis[TPU_MAX_RANK];
  bool ok =
      tpu_opsharding_positions(o, n, pos) && tpu_opsharding_assign(o, rank, mesh_rank, mesh, n, pos, 0, dim_axis, 0);
  free(pos);
  if (ok) *out = tpu_sharding_make(mesh_rank, mesh, rank, dim_axis);
  return ok;
}

/* The n output shardings of a tuple: the length-delimited fields `field` of
 * t, each a NamedShardingProto (named) or an OpSharding. */
static tpu_status *tpu_read_tuple(tpu_pb t, uint64_t field, bool named, int mesh_rank, const int64_t *mesh, int n,
                                  const int *ranks, const bool *want, tpu_sharding *out) {
  int k = 0;
  while (t.p < t.end) {
    uint64_t f, v;
    int w;
    tpu_pb sub = {NULL, NULL};
    if (!tpu_pb_field(&t, &f, &w, &v, &sub)) return tpu_status_new(TPU_ERR_RUNTIME, "a malformed output sharding");
    if (f != field || w != 2) continue;
    if (k >= n) return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "more output shardings than the program's %d outputs", n);
    if (want[k]) {
      tpu_opsharding e;
      if (!named && !tpu_opsharding_parse(sub, &e))
        return tpu_status_new(TPU_ERR_RUNTIME, "output %d: a malformed sharding", k);
      if (named ? !tpu_named_to(sub, ranks[k], mesh_rank, mesh, &out[k])
                : !tpu_opsharding_to(&e, ranks[k], mesh_rank, mesh, &out[k]))
        return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "output %d: a layout the mesh cannot say", k);
    }
    k++;
  }
  if (k != n) return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "%d output shardings for %d outputs", k, n);
  return NULL;
}

tpu_status *tpu_hlo_read_output_shardings(const uint8_t *module, size_t len, bool with_config, int mesh_rank,
                                          const int64_t *mesh, int n, const int *ranks, const bool *want,
                                          tpu_sharding *out) {
  tpu_pb b = {module, module + len}, top = {NULL, NULL};
  int got = with_config ? tpu_pb_find(b, 1, &b) : 1; /* the wrapper's field 1 is the module */
  if (got < 0)
    return tpu_status_new(TPU_ERR_RUNTIME, "the optimized program is not a well-formed HloModuleProtoWithConfig");
  if (got == 0) return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "the optimized program holds no module");
  got = tpu_pb_find(b, 12, &top);
  if (got < 0) return tpu_status_new(TPU_ERR_RUNTIME, "the optimized program is not a well-formed HloModuleProto");
  bool found = got > 0;
  if (!found) return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "the optimized program names no output shardings");
  tpu_opsharding o;
  if (!tpu_opsharding_parse(top, &o))
    return tpu_status_new(TPU_ERR_RUNTIME, "an output sharding that is not well formed");
  tpu_pb tuple = {NULL, NULL};
  if (o.named && tpu_pb_find(o.nbytes, 1, &tuple) > 0) /* Shardy's form of a tuple: field 1, one per output */
    return tpu_read_tuple(o.nbytes, 1, true, mesh_rank, mesh, n, ranks, want, out);
  if (o.type != 2 || o.named) { /* one sharding: the program's only output */
    if (n != 1) return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "one output sharding for %d outputs", n);
    if (want[0] && !tpu_opsharding_to(&o, ranks[0], mesh_rank, mesh, &out[0]))
      return tpu_status_new(TPU_ERR_UNIMPLEMENTED, "output 0: a layout the mesh cannot say");
    return NULL;
  }
  return tpu_read_tuple(top, 5, false, mesh_rank, mesh, n, ranks, want, out); /* a TUPLE: field 5, one per output */
}
