/* sharding.c: the GSPMD and Shardy spellings of a sharding over a device
 * mesh (the sharding itself and its geometry: mesh.c).
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
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sharding.h"

/* The sharding is well formed, its shape aside (tpu_sharding_check without dims). */
static bool tpu_shape_ok(const tpu_sharding *s) {
  tpu_status *st = tpu_sharding_check(s, NULL);
  tpu_status_free(st);
  return st == NULL;
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
  if (!tpu_shape_ok(s)) return tpu_sink_fail(buf, n);
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
  tpu_status *st = tpu_sdy_axis_names_check(s->mesh_rank, axis_names);
  tpu_status_free(st);
  if (st || !tpu_shape_ok(s)) return tpu_sink_fail(buf, n);
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
  tpu_status *st = tpu_sdy_axis_names_check(mesh_rank, axis_names);
  tpu_status_free(st);
  if (st || !tpu_shape_ok(&s)) return tpu_sink_fail(buf, n);
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
