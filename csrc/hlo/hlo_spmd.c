/* hlo_spmd.c: the StableHLO builder's SPMD settings (see hlo.h): the mesh and
 * partitioner, the partition and replica counts, parameter and result
 * shardings, and sharding constraints.
 *
 * Parameter and result shardings are kept as notes (position, sharding) and
 * printed by finish as the argument's or result's attribute dictionary, the
 * sharding first and tf.aliasing_output after it (MLIR's own order). With
 * nothing set the module line and the signature print exactly as before:
 * program caches key on the text.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hlo_impl.h"

static const char *const *tpu_names(tpu_hlo *m, const char **names) {
  if (!m->named) return NULL;
  for (int a = 0; a < m->mesh.mesh_rank; a++) names[a] = m->axis_names[a];
  return names;
}

/* "[2,2]" */
static void tpu_mesh_str(const tpu_sharding *s, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "[");
  for (int a = 0; a < s->mesh_rank && a < TPU_MESH_MAX_AXES && len < n; a++)
    len += (size_t)snprintf(buf + len, n - len, "%s%lld", a ? "," : "", (long long)s->mesh[a]);
  if (len < n) snprintf(buf + len, n - len, "]");
}

void tpu_hlo_set_mesh(tpu_hlo *m, tpu_hlo_partitioner p, int mesh_rank, const int64_t *mesh,
                      const char *const *axis_names) {
  if (!tpu_hlo_ok(m)) return;
  if (p != TPU_HLO_GSPMD && p != TPU_HLO_SHARDY) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: unknown partitioner %d", (int)p);
    return;
  }
  if (m->partitioner || m->nshards) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: the mesh is set once, before any sharding");
    return;
  }
  tpu_sharding s = tpu_sharding_make(mesh_rank, mesh, 0, NULL);
  tpu_status *st = tpu_sharding_check(&s, NULL);
  if (!st) st = tpu_sdy_axis_names_check(mesh_rank, axis_names);
  if (st) {
    tpu_hlo_fail(m, TPU_ERR_VALUE, "hlo: %s", tpu_status_message(st));
    tpu_status_free(st);
    return;
  }
  m->partitioner = p;
  m->mesh = s;
  m->num_partitions = (int)tpu_sharding_num_devices(&s);
  m->named = axis_names != NULL;
  for (int a = 0; m->named && a < mesh_rank; a++)
    snprintf(m->axis_names[a], sizeof m->axis_names[a], "%s", axis_names[a]);
}

static void tpu_set_count(tpu_hlo *m, int *field, int n, const char *what) {
  if (!tpu_hlo_ok(m)) return;
  if (n < 1) {
    tpu_hlo_fail(m, TPU_ERR_VALUE, "hlo: %d %s (at least 1)", n, what);
    return;
  }
  *field = n;
}

void tpu_hlo_set_num_partitions(tpu_hlo *m, int n) { tpu_set_count(m, &m->num_partitions, n, "partitions"); }
void tpu_hlo_set_num_replicas(tpu_hlo *m, int n) { tpu_set_count(m, &m->num_replicas, n, "replicas"); }

/* s may shard a value of type t in this module; otherwise the sticky error,
 * naming `what`. */
static bool tpu_sharding_fits(tpu_hlo *m, const tpu_sharding *s, const tpu_hlo_type *t, const char *what, int index) {
  if (!tpu_hlo_ok(m)) return false;
  if (!m->partitioner) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: %s %d: a sharding without a mesh (tpu_hlo_set_mesh)", what, index);
    return false;
  }
  tpu_status *st = tpu_sharding_check(s, NULL);
  if (st) {
    tpu_hlo_fail(m, TPU_ERR_VALUE, "hlo: %s %d: %s", what, index, tpu_status_message(st));
    tpu_status_free(st);
    return false;
  }
  tpu_sharding mine = m->mesh, theirs = *s;
  mine.rank = theirs.rank = 0;
  if (!tpu_sharding_eq(&mine, &theirs)) {
    char a[64], b[64];
    tpu_mesh_str(s, a, sizeof a);
    tpu_mesh_str(&m->mesh, b, sizeof b);
    tpu_hlo_fail(m, TPU_ERR_VALUE, "hlo: %s %d: sharding over mesh %s, but the module's mesh is %s", what, index, a, b);
    return false;
  }
  if (s->rank != t->rank) {
    tpu_hlo_fail(m, TPU_ERR_VALUE, "hlo: %s %d: sharding of rank %d for a value of rank %d", what, index, s->rank,
                 t->rank);
    return false;
  }
  st = tpu_sharding_check(s, t->dims);
  if (st) {
    tpu_hlo_fail(m, TPU_ERR_VALUE, "hlo: %s %d: %s", what, index, tpu_status_message(st));
    tpu_status_free(st);
    return false;
  }
  return true;
}

static void tpu_note(tpu_hlo *m, bool result, int index, const tpu_sharding *s) {
  for (int i = 0; i < m->nshards; i++)
    if (m->shards[i].result == result && m->shards[i].index == index) {
      m->shards[i].s = *s;
      return;
    }
  if (m->nshards == m->capshards) {
    int cap = m->capshards ? m->capshards * 2 : 8;
    tpu_shard_note *q = realloc(m->shards, sizeof *q * (size_t)cap);
    if (!q) {
      m->oom = true;
      return;
    }
    m->shards = q;
    m->capshards = cap;
  }
  m->shards[m->nshards++] = (tpu_shard_note){result, index, *s};
}

void tpu_hlo_param_sharding(tpu_hlo *m, tpu_hv p, const tpu_sharding *s) {
  if (!tpu_hlo_ok(m)) return;
  int i = 0;
  while (i < m->nparams && m->params[i] != p) i++;
  if (i == m->nparams) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: sharding of a value that is not a parameter");
    return;
  }
  if (tpu_sharding_fits(m, s, &TY(p), "parameter", i)) tpu_note(m, false, i, s);
}

void tpu_hlo_result_sharding(tpu_hlo *m, int result_index, const tpu_sharding *s) {
  if (!tpu_hlo_ok(m)) return;
  if (result_index < 0) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: sharding of negative result index %d", result_index);
    return;
  }
  if (!m->partitioner) {
    tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: result %d: a sharding without a mesh (tpu_hlo_set_mesh)", result_index);
    return;
  }
  tpu_note(m, true, result_index, s); /* checked against the result at finish */
}

/* `<key> = <sharding>` in the module's form; the GSPMD string is quoted. */
static void tpu_put_sharding(tpu_hlo *m, tpu_buf *b, const char *key, const tpu_sharding *s) {
  const char *names[TPU_MESH_MAX_AXES];
  bool gspmd = m->partitioner == TPU_HLO_GSPMD;
  int n = gspmd ? tpu_sharding_gspmd(s, NULL, 0) : tpu_sharding_sdy(s, tpu_names(m, names), NULL, 0);
  char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!text) {
    if (n >= 0)
      m->oom = true;
    else
      tpu_hlo_fail(m, TPU_ERR_VALUE, "hlo: a sharding that cannot be written");
    return;
  }
  if (gspmd)
    tpu_sharding_gspmd(s, text, (size_t)n + 1);
  else
    tpu_sharding_sdy(s, tpu_names(m, names), text, (size_t)n + 1);
  tpu_hloi_buf_printf(m, b, gspmd ? "%s = \"%s\"" : "%s = %s", key, text);
  free(text);
}

bool tpu_hlo_has_mesh(const tpu_hlo *m) { return m->partitioner != 0; }

tpu_hv tpu_hlo_sharding_constraint(tpu_hlo *m, tpu_hv x, const tpu_sharding *s) {
  if (!tpu_hloi_check(m, &x, 1) || !tpu_sharding_fits(m, s, &TY(x), "sharding constraint on value", x))
    return TPU_HV_NONE;
  tpu_attrs a = {{0}};
  bool gspmd = m->partitioner == TPU_HLO_GSPMD;
  if (gspmd) tpu_hloi_buf_printf(m, &a.b, "call_target_name = \"Sharding\", ");
  tpu_put_sharding(m, &a.b, gspmd ? "mhlo.sharding" : "sharding", s);
  tpu_hv out = TPU_HV_NONE;
  if (tpu_hlo_ok(m))
    out = tpu_hlo_emit1(m, gspmd ? "stablehlo.custom_call" : "sdy.sharding_constraint", &x, 1, tpu_hloi_attrs_str(&a),
                        TY(x));
  tpu_hloi_attrs_free(&a);
  return out;
}

/* ---- finish ------------------------------------------------------------------------ */

bool tpu_hloi_spmd_check(tpu_hlo *m, const tpu_hv *results, int n) {
  for (int i = 0; i < m->nshards && tpu_hlo_ok(m); i++) {
    const tpu_shard_note *k = &m->shards[i];
    if (!k->result) continue;
    if (k->index >= n)
      tpu_hlo_fail(m, TPU_ERR_RUNTIME, "hlo: sharding of result %d, but there are %d results", k->index, n);
    else
      tpu_sharding_fits(m, &k->s, &TY(results[k->index]), "result", k->index);
  }
  if (tpu_hlo_ok(m) && m->partitioner && m->num_partitions != tpu_sharding_num_devices(&m->mesh))
    tpu_hlo_fail(m, TPU_ERR_VALUE, "hlo: the mesh has %lld devices, but the module has %d partitions",
                 (long long)tpu_sharding_num_devices(&m->mesh), m->num_partitions);
  return tpu_hlo_ok(m);
}

void tpu_hloi_spmd_put_head(tpu_hlo *m, tpu_buf *b) {
  tpu_hloi_buf_printf(m, b,
                      "module @torchtpu attributes {mhlo.num_partitions = %d : i32, mhlo.num_replicas = %d : i32} {\n",
                      m->num_partitions ? m->num_partitions : 1, m->num_replicas ? m->num_replicas : 1);
  if (m->partitioner != TPU_HLO_SHARDY) return;
  const char *names[TPU_MESH_MAX_AXES];
  const char *const *nm = tpu_names(m, names);
  int n = tpu_sdy_mesh(m->mesh.mesh_rank, m->mesh.mesh, nm, NULL, 0);
  char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!text) {
    m->oom = true;
    return;
  }
  tpu_sdy_mesh(m->mesh.mesh_rank, m->mesh.mesh, nm, text, (size_t)n + 1);
  tpu_hloi_buf_printf(m, b, "  %s\n", text);
  free(text);
}

void tpu_hloi_spmd_put_attrs(tpu_hlo *m, tpu_buf *b, bool result, int index, int alias) {
  const tpu_shard_note *k = NULL;
  for (int i = 0; i < m->nshards && !k; i++)
    if (m->shards[i].result == result && m->shards[i].index == index) k = &m->shards[i];
  if (!k && alias < 0) return;
  tpu_hloi_buf_put(m, b, " {", 2);
  if (k) tpu_put_sharding(m, b, m->partitioner == TPU_HLO_GSPMD ? "mhlo.sharding" : "sdy.sharding", &k->s);
  if (k && alias >= 0) tpu_hloi_buf_put(m, b, ", ", 2);
  if (alias >= 0) tpu_hloi_buf_printf(m, b, "tf.aliasing_output = %d : i32", alias);
  tpu_hloi_buf_put(m, b, "}", 1);
}
