/* spmd.c: tensors laid over a mesh of local devices, and the programs that
 * run on all of them at once (single-controller SPMD).
 *
 * A mesh record holds one buffer per mesh device (devices 0 .. N-1, in the
 * mesh's row-major order) and its sharding: device d's buffer is d's block
 * of the record's global shape (the whole tensor where it is replicated).
 * A program that reads any mesh record is one program over N partitions
 * (fuse.c lowers it with the records' shardings on its parameters and
 * results; XLA partitions it and inserts the collectives); its other inputs
 * are given to every device. Every value it writes becomes a mesh record:
 * a record that was on the mesh keeps its sharding (declared on the
 * program's result), a value a constraint lays out takes the constraint's,
 * and every other new value takes the layout XLA's partitioner chose for it
 * (the result is left undeclared, XLA may choose it, and the choice is read
 * back from the optimized program). Where the plugin does not say its
 * choices, or one is not a tpu_sharding, the program is compiled again with
 * the rule's layouts declared: the shape of a split mesh input takes that
 * input's sharding, the others are replicated. Moving a tensor onto the mesh,
 * reading one back and writing host data into one go through the host.
 */
#define _GNU_SOURCE
#include "spmd.h"

#include <stdlib.h>
#include <string.h>

#include "../hlo/hlo.h"
#include "../mesh.h"
#include "engine_impl.h"

/* Copies block `blk` (shape bd, at offset off of the global shape gd) between
 * a dense global array and a dense block; to_block says which way. */
static void tpu_block_copy(uint8_t *global, uint8_t *blk, size_t isz, int rank, const int64_t *gd, const int64_t *bd,
                           const int64_t *off, bool to_block) {
  if (rank == 0) {
    if (to_block)
      memcpy(blk, global, isz);
    else
      memcpy(global, blk, isz);
    return;
  }
  int64_t idx[TPU_MAX_RANK] = {0}, gstride[TPU_MAX_RANK];
  int64_t acc = 1;
  for (int i = rank - 1; i >= 0; i--) {
    gstride[i] = acc;
    acc *= gd[i];
  }
  int64_t rows = 1;
  for (int i = 0; i < rank - 1; i++) rows *= bd[i];
  size_t run = (size_t)bd[rank - 1] * isz;
  for (int64_t r = 0; r < rows; r++) {
    int64_t g = off[rank - 1];
    for (int i = 0; i < rank - 1; i++) g += (off[i] + idx[i]) * gstride[i];
    uint8_t *gp = global + (size_t)g * isz, *bp = blk + (size_t)r * run;
    if (to_block)
      memcpy(bp, gp, run);
    else
      memcpy(gp, bp, run);
    for (int i = rank - 2; i >= 0; i--) {
      if (++idx[i] < bd[i]) break;
      idx[i] = 0;
    }
  }
}

/* Uploads the global host array data as the shards of sh over the mesh. */
tpu_status *tpu_shards_from_host(tpu_engine *e, const tpu_sharding *sh, const int64_t *gd, tpu_dtype dt,
                                 const void *data, tpu_rt_buffer **shards) {
  if (tpu_engine_mesh_compile_only(e)) return NULL; /* a compile-only mesh holds no values */
  int64_t n = tpu_sharding_num_devices(sh), bd[TPU_MAX_RANK], off[TPU_MAX_RANK];
  if (!tpu_sharding_shard_dims(sh, gd, bd)) return tpu_status_new(TPU_ERR_VALUE, "a sharding that does not fit");
  size_t isz = tpu_dtype_size(dt), bn = isz, inner = isz;
  for (int i = 0; i < sh->rank; i++) bn *= (size_t)bd[i];
  /* a block is one run of the global array when only its first dimension is
   * cut (a batch split over dim 0, or replicated): sent from where it lies */
  bool run = true;
  for (int i = 1; i < sh->rank; i++) {
    run = run && bd[i] == gd[i];
    inner *= (size_t)gd[i];
  }
  uint8_t *blk = run ? NULL : malloc(bn ? bn : 1);
  if (!run && !blk) return tpu_status_new(TPU_ERR_MEMORY, "out of memory allocating %zu bytes", bn);
  tpu_status *s = NULL;
  for (int64_t d = 0; d < n && !s; d++) {
    tpu_sharding_shard_offsets(sh, gd, d, off);
    const uint8_t *src = (const uint8_t *)data + (run && sh->rank ? (size_t)off[0] * inner : 0);
    if (!run) {
      tpu_block_copy((uint8_t *)data, blk, isz, sh->rank, gd, bd, off, true);
      src = blk;
    }
    s = tpu_engine_h2d(e, (int)d, src, dt, bd, sh->rank, &shards[d]);
    if (!s) atomic_fetch_add(&e->metrics.h2d_bytes, (long long)bn);
  }
  free(blk);
  return s;
}

tpu_status *tpu_spmd_download(tpu_engine *e, tpu_record *rec, void *dst, size_t nbytes) {
  const tpu_sharding *sh = rec->sh;
  if (tpu_engine_mesh_compile_only(e))
    return tpu_status_new(TPU_ERR_RUNTIME,
                          "this tensor is on a compile-only mesh (TORCHTPU_SPMD_COMPILE_ONLY=1): programs over the "
                          "mesh are compiled for TPU %s and never run, so its values are not computed",
                          e->aot.topology);
  size_t isz = tpu_dtype_size(rec->dtype);
  if (nbytes != (size_t)rec->numel * isz)
    return tpu_status_new(TPU_ERR_VALUE, "device to host: %zu bytes asked of a %lld-element record", nbytes,
                          (long long)rec->numel);
  if (tpu_sharding_is_replicated(sh)) return tpu_engine_d2h(e, rec->shards[0], dst, nbytes);
  int64_t bd[TPU_MAX_RANK], off[TPU_MAX_RANK], n = tpu_sharding_num_devices(sh);
  tpu_sharding_shard_dims(sh, rec->gdims, bd);
  size_t bn = isz;
  for (int i = 0; i < sh->rank; i++) bn *= (size_t)bd[i];
  uint8_t *blk = malloc(bn ? bn : 1);
  if (!blk) return tpu_status_new(TPU_ERR_MEMORY, "out of memory allocating %zu bytes", bn);
  tpu_status *s = NULL;
  /* devices holding the same block (replicated over an axis) are read once */
  bool *seen = calloc((size_t)n, 1);
  for (int64_t d = 0; d < n && !s && seen; d++) {
    tpu_sharding_shard_offsets(sh, rec->gdims, d, off);
    bool again = false;
    for (int64_t k = 0; k < d && !again; k++) {
      int64_t o2[TPU_MAX_RANK];
      tpu_sharding_shard_offsets(sh, rec->gdims, k, o2);
      again = memcmp(o2, off, sizeof(int64_t) * (size_t)sh->rank) == 0;
    }
    if (again) continue;
    s = tpu_engine_d2h(e, rec->shards[d], blk, bn);
    if (!s) tpu_block_copy(dst, blk, isz, sh->rank, rec->gdims, bd, off, false);
  }
  if (!seen) s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  free(seen);
  free(blk);
  return s;
}

tpu_status *tpu_spmd_upload(tpu_engine *e, tpu_record *rec, const void *data) {
  if (tpu_engine_mesh_compile_only(e)) return NULL; /* no values to write */
  int64_t n = tpu_sharding_num_devices(rec->sh);
  tpu_rt_buffer **shards = calloc((size_t)n, sizeof *shards);
  if (!shards) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  tpu_status *s = tpu_shards_from_host(e, rec->sh, rec->gdims, rec->dtype, data, shards);
  if (s) {
    for (int64_t d = 0; d < n; d++) tpu_rt_buffer_free(shards[d]);
    free(shards);
    return s;
  }
  for (int64_t d = 0; d < n; d++) tpu_rt_buffer_free(rec->shards[d]);
  free(rec->shards);
  rec->shards = shards;
  return NULL;
}

/* The mesh of a flush: the sharding of its first mesh record (NULL: none);
 * every mesh record must be on the same mesh. */
tpu_status *tpu_spmd_mesh(const tpu_rectab *tab, const tpu_sharding **mesh) {
  *mesh = NULL;
  for (int k = 0; k < tab->n; k++) {
    const tpu_sharding *s = tab->r[k]->sh;
    if (!s) continue;
    if (!*mesh) {
      *mesh = s;
      continue;
    }
    if (s->mesh_rank != (*mesh)->mesh_rank ||
        memcmp(s->mesh, (*mesh)->mesh, sizeof(int64_t) * (size_t)s->mesh_rank) != 0)
      return tpu_status_new(TPU_ERR_VALUE, "tensors sharded over two different meshes are used together");
  }
  return NULL;
}

/* The sharding a value written by an SPMD program takes (see the top). */
tpu_sharding tpu_spmd_choose(const tpu_rectab *tab, const tpu_sharding *mesh, const tpu_record *r) {
  if (r->sh) return *r->sh;
  if (!r->fuse_new) return tpu_sharding_make(mesh->mesh_rank, mesh->mesh, r->grank, NULL); /* whole */
  if (r->fuse_has_sh) return r->fuse_sh; /* a sharding constraint's value */
  for (int k = 0; k < tab->n; k++) {
    const tpu_record *m = tab->r[k];
    if (m->sh && m->fuse_param != TPU_HV_NONE && !tpu_sharding_is_replicated(m->sh) && m->grank == r->grank &&
        memcmp(m->gdims, r->gdims, sizeof(int64_t) * (size_t)r->grank) == 0)
      return *m->sh;
  }
  return tpu_sharding_make(mesh->mesh_rank, mesh->mesh, r->grank, NULL);
}

bool tpu_spmd_chosen_by_xla(const tpu_record *r) { return !r->sh && r->fuse_new && !r->fuse_has_sh; }

bool tpu_spmd_read_layouts(tpu_engine *e, tpu_rt_exec *exec, const tpu_rt_module *opt, const tpu_sharding *mesh,
                           int nres, int nout, const int64_t (*dims)[TPU_MAX_RANK], const bool *prop,
                           tpu_sharding *sh) {
  /* the program's outputs: its records' values, then its value checks (not read) */
  tpu_rt_module own = {0};
  tpu_status *s = opt && opt->bytes ? NULL
                  : exec            ? tpu_rt_exec_optimized(exec, &own)
                                    : tpu_status_new(TPU_ERR_UNIMPLEMENTED, "no program");
  const tpu_rt_module *mod = opt && opt->bytes ? opt : &own;
  size_t cap = (size_t)nout + 1;
  bool *want = s || nout < nres ? NULL : calloc(cap, sizeof *want);
  int *ranks = want ? calloc(cap, sizeof *ranks) : NULL;
  tpu_sharding *got = ranks ? malloc(sizeof *got * cap) : NULL;
  bool ok = got != NULL;
  if (ok) {
    for (int k = 0; k < nres; k++) {
      want[k] = prop[k];
      ranks[k] = sh[k].rank;
    }
    s = tpu_hlo_read_output_shardings(mod->bytes, mod->len, mod->with_config, mesh->mesh_rank, mesh->mesh, nout, ranks,
                                      want, got);
    ok = s == NULL;
  }
  for (int k = 0; k < nres && ok; k++) { /* an uneven split is not a tpu_sharding */
    tpu_status *c = prop[k] ? tpu_sharding_check(&got[k], dims[k]) : NULL;
    ok = c == NULL;
    tpu_status_free(c);
  }
  if (ok) {
    int chosen = 0;
    for (int k = 0; k < nres; k++)
      if (prop[k]) {
        sh[k] = got[k];
        chosen++;
      }
    atomic_fetch_add(&e->metrics.spmd_layouts, chosen);
  }
  tpu_status_free(s);
  free(own.bytes);
  free(want);
  free(ranks);
  free(got);
  return ok;
}

/* Runs c's rows on in (rows x inputs, borrowed); the record outputs become
 * the shards of dst[k] (laid out as c says), the value checks are queued. */
tpu_status *tpu_spmd_launch(tpu_engine *e, tpu_cache_entry *c, tpu_rt_buffer **in, tpu_record **dst, tpu_site_fn site) {
  int rows = c->spmd_rows, nout = c->nfout + c->nfchk;
  size_t no = (size_t)rows * (size_t)(nout ? nout : 1);
  tpu_rt_buffer **out = calloc(no, sizeof *out);
  if (!out) return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  int64_t t0 = tpu_now_ns();
  tpu_status *s = tpu_engine_wait(e); /* launched one-device programs first: this one waits for its rows */
  int64_t p0 = tpu_prof_t0();
  /* a compile-only mesh's program (no exec) is not run: its values have no shards */
  if (!s && c->exec) s = tpu_rt_execute_rows(e->rt, c->exec, in, c->nfin, out);
  if (p0 && !s && c->exec) tpu_prof_rows(c->exec, p0, "fused program");
  atomic_fetch_add(&e->metrics.execute_ns, tpu_now_ns() - t0);
  if (s) s = tpu_status_prefix(s, "running a program over %d devices", rows);
  for (int k = 0; k < c->nfout && !s; k++) {
    tpu_record *r = dst[k];
    tpu_rt_buffer **shards = calloc((size_t)rows, sizeof *shards);
    tpu_sharding *sh = malloc(sizeof *sh);
    if (!shards || !sh) {
      free(shards);
      free(sh);
      s = tpu_status_new(TPU_ERR_MEMORY, "out of memory");
      break;
    }
    for (int d = 0; d < rows; d++) {
      shards[d] = out[d * nout + k];
      out[d * nout + k] = NULL;
    }
    *sh = c->fsh[k];
    tpu_record_free_shards(r);
    tpu_rt_buffer_free(r->buf);
    r->buf = NULL;
    r->device = 0;
    r->sh = sh;
    r->shards = shards;
    r->grank = sh->rank;
    memcpy(r->gdims, c->fdims[k], sizeof(int64_t) * (size_t)sh->rank);
  }
  for (int k = 0; k < c->nfchk && !s && c->exec; k++) { /* every row computes the same checks */
    tpu_check_push(e, out[c->nfout + k], c->fchk[k], site ? site(e, &c->fchk[k]) : NULL);
    out[c->nfout + k] = NULL;
  }
  if (!s) atomic_fetch_add(c->exec ? &e->metrics.spmd_programs : &e->metrics.spmd_unrun, 1);
  if (!s) tpu_engine_aot_ran(e, c->aot);
  for (size_t k = 0; k < no; k++) tpu_rt_buffer_free(out[k]);
  free(out);
  return s;
}

/* The buffers of a record as the input of row d: a mesh record's shard, or
 * (own) a copy of a one-device record on device d. */
tpu_status *tpu_spmd_record_input(tpu_engine *e, tpu_record *r, int d, tpu_rt_buffer **b, tpu_rt_buffer **own) {
  *own = NULL;
  if (r->sh) {
    *b = r->shards[d];
    return NULL;
  }
  int call_dev = e->dev;
  e->dev = r->device;
  tpu_status *s = tpu_record_materialize(e, r);
  e->dev = call_dev;
  if (s) return s;
  if (d == r->device) {
    *b = r->buf;
    return NULL;
  }
  s = tpu_rt_buffer_copy(e->rt, r->buf, d, own);
  *b = *own;
  return s;
}
