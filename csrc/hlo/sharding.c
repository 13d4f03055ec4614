/* sharding.c: shardings over a device mesh (see sharding.h): checks, shard
 * shapes and offsets, and their GSPMD and Shardy spellings.
 *
 * GSPMD's tile assignment has one tile dimension per tensor dimension (the
 * size of the axis splitting it, or 1) and, when some unused axes are larger
 * than 1, a last dimension enumerating those axes (row-major, in mesh order)
 * marked last_tile_dim_replicate. Its device list is the device of each tile
 * index in row-major order: the device whose coordinate on the axis splitting
 * dimension i is t_i, and whose coordinates on the unused axes are t_rep.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "sharding.h"

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

/* ---- text ------------------------------------------------------------------------ */

/* snprintf into buf[0..n) at a running length; the length counts on past n. */
typedef struct {
  char *buf;
  size_t n, len;
} tpu_sink;

static void tpu_sink_printf(tpu_sink *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tpu_sink_printf(tpu_sink *k, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bool room = k->len < k->n;
  int r = vsnprintf(room ? k->buf + k->len : NULL, room ? k->n - k->len : 0, fmt, ap);
  va_end(ap);
  if (r > 0) k->len += (size_t)r;
}

static int tpu_sink_end(tpu_sink *k) {
  if (k->len > INT_MAX) {
    if (k->n) k->buf[0] = 0;
    return -1;
  }
  return (int)k->len;
}

static int tpu_sink_fail(char *buf, size_t n) {
  if (n) buf[0] = 0;
  return -1;
}

int tpu_sharding_gspmd(const tpu_sharding *s, char *buf, size_t n) {
  char msg[160];
  if (!tpu_shape_ok(s, msg, sizeof msg)) return tpu_sink_fail(buf, n);
  tpu_sink k = {buf, n, 0};
  if (n) buf[0] = 0;
  if (tpu_sharding_is_replicated(s)) {
    tpu_sink_printf(&k, "{replicated}");
    return tpu_sink_end(&k);
  }
  bool used[TPU_MESH_MAX_AXES] = {false};
  int64_t tile[TPU_MAX_RANK + 1], rep = 1;
  for (int i = 0; i < s->rank; i++) {
    tile[i] = s->dim_axis[i] >= 0 ? s->mesh[s->dim_axis[i]] : 1;
    if (s->dim_axis[i] >= 0) used[s->dim_axis[i]] = true;
  }
  for (int a = 0; a < s->mesh_rank; a++)
    if (!used[a]) rep *= s->mesh[a];
  int ntile = s->rank + (rep > 1);
  tile[s->rank] = rep;
  tpu_sink_printf(&k, "{devices=[");
  for (int i = 0; i < ntile; i++) tpu_sink_printf(&k, "%s%lld", i ? "," : "", (long long)tile[i]);
  tpu_sink_printf(&k, "]");
  int64_t total = tpu_sharding_num_devices(s);
  for (int64_t idx = 0; idx < total; idx++) {
    int64_t t[TPU_MAX_RANK + 1], rem = idx;
    for (int i = ntile - 1; i >= 0; i--) {
      t[i] = rem % tile[i];
      rem /= tile[i];
    }
    int64_t coord[TPU_MESH_MAX_AXES] = {0};
    for (int i = 0; i < s->rank; i++)
      if (s->dim_axis[i] >= 0) coord[s->dim_axis[i]] = t[i];
    rem = rep > 1 ? t[s->rank] : 0;
    for (int a = s->mesh_rank - 1; a >= 0; a--)
      if (!used[a]) {
        coord[a] = rem % s->mesh[a];
        rem /= s->mesh[a];
      }
    int64_t device = 0;
    for (int a = 0; a < s->mesh_rank; a++) device = device * s->mesh[a] + coord[a];
    tpu_sink_printf(&k, "%s%lld", idx ? "," : "", (long long)device);
  }
  tpu_sink_printf(&k, "%s}", rep > 1 ? " last_tile_dim_replicate" : "");
  return tpu_sink_end(&k);
}

tpu_status *tpu_sdy_axis_names_check(int mesh_rank, const char *const *axis_names) {
  if (mesh_rank < 0 || mesh_rank > TPU_MESH_MAX_AXES)
    return tpu_status_new(TPU_ERR_VALUE, "sharding: mesh rank %d (0 to %d supported)", mesh_rank, TPU_MESH_MAX_AXES);
  for (int a = 0; axis_names && a < mesh_rank; a++) {
    const char *p = axis_names[a];
    size_t len = p ? strlen(p) : 0;
    bool ok = len >= 1 && len <= TPU_MESH_NAME_MAX;
    for (size_t i = 0; ok && i < len; i++)
      ok = (p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= '0' && p[i] <= '9') || p[i] == '_';
    if (!ok)
      return tpu_status_new(TPU_ERR_VALUE,
                            "sharding: mesh axis %d's name must be 1 to %d letters, digits or underscores", a,
                            TPU_MESH_NAME_MAX);
    for (int b = 0; b < a; b++)
      if (strcmp(axis_names[b], p) == 0)
        return tpu_status_new(TPU_ERR_VALUE, "sharding: mesh axes %d and %d are both named \"%s\"", b, a, p);
  }
  return NULL;
}

static void tpu_sink_axis(tpu_sink *k, const char *const *axis_names, int a) {
  if (axis_names)
    tpu_sink_printf(k, "\"%s\"", axis_names[a]);
  else
    tpu_sink_printf(k, "\"a%d\"", a);
}

int tpu_sharding_sdy(const tpu_sharding *s, const char *const *axis_names, char *buf, size_t n) {
  char msg[160];
  tpu_status *st = tpu_sdy_axis_names_check(s->mesh_rank, axis_names);
  tpu_status_free(st);
  if (st || !tpu_shape_ok(s, msg, sizeof msg)) return tpu_sink_fail(buf, n);
  tpu_sink k = {buf, n, 0};
  if (n) buf[0] = 0;
  tpu_sink_printf(&k, "#sdy.sharding<@mesh, [");
  for (int i = 0; i < s->rank; i++) {
    tpu_sink_printf(&k, "%s{", i ? ", " : "");
    if (s->dim_axis[i] >= 0) tpu_sink_axis(&k, axis_names, s->dim_axis[i]);
    tpu_sink_printf(&k, "}");
  }
  tpu_sink_printf(&k, "]>");
  return tpu_sink_end(&k);
}

int tpu_sdy_mesh(int mesh_rank, const int64_t *mesh, const char *const *axis_names, char *buf, size_t n) {
  tpu_sharding s = tpu_sharding_make(mesh_rank, mesh, 0, NULL);
  char msg[160];
  tpu_status *st = tpu_sdy_axis_names_check(mesh_rank, axis_names);
  tpu_status_free(st);
  if (st || !tpu_shape_ok(&s, msg, sizeof msg)) return tpu_sink_fail(buf, n);
  tpu_sink k = {buf, n, 0};
  if (n) buf[0] = 0;
  tpu_sink_printf(&k, "\"sdy.mesh\"() {mesh = #sdy.mesh<[");
  for (int a = 0; a < mesh_rank; a++) {
    if (a) tpu_sink_printf(&k, ", ");
    tpu_sink_axis(&k, axis_names, a);
    tpu_sink_printf(&k, "=%lld", (long long)mesh[a]);
  }
  tpu_sink_printf(&k, "]>, sym_name = \"mesh\"} : () -> ()");
  return tpu_sink_end(&k);
}
