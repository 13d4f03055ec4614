/* spmd.h: tensors laid over a mesh of local devices, and the programs that
 * run on all of them at once (spmd.c). */
#ifndef TPU_ENGINE_SPMD_H
#define TPU_ENGINE_SPMD_H

#include "programs.h"
#include "record.h"

/* Where Python called the op of a fused program's check (owned; NULL: not known). */
typedef char *(*tpu_site_fn)(const tpu_engine *e, const tpu_fcheck *w);

/* Uploads the global host array data (global shape gd) as the shards of sh. */
tpu_status *tpu_shards_from_host(tpu_engine *e, const tpu_sharding *sh, const int64_t *gd, tpu_dtype dt,
                                 const void *data, tpu_rt_buffer **shards);
/* A mesh record's value, gathered on the host, and host data written into its shards. */
tpu_status *tpu_spmd_download(tpu_engine *e, tpu_record *rec, void *dst, size_t nbytes);
tpu_status *tpu_spmd_upload(tpu_engine *e, tpu_record *rec, const void *data);
tpu_status *tpu_spmd_mesh(const tpu_rectab *tab, const tpu_sharding **mesh);
tpu_sharding tpu_spmd_choose(const tpu_rectab *tab, const tpu_sharding *mesh, const tpu_record *r);
/* Whether XLA's partitioner lays out r as a program over the mesh writes it
 * (a new value with no constraint), instead of the rule's layout. */
bool tpu_spmd_chosen_by_xla(const tpu_record *r);
/* The layouts XLA chose for the results k < nres with prop[k] (global shapes
 * dims[k]) of a program of nout outputs into sh[k], from its optimized form:
 * opt's where it holds one (a compile-only mesh's: libtpu's), else exec's.
 * False (sh untouched) when the plugin does not say them or one is not a
 * tpu_sharding (a dimension split over two mesh axes, an uneven split, ...). */
bool tpu_spmd_read_layouts(tpu_engine *e, tpu_rt_exec *exec, const tpu_rt_module *opt, const tpu_sharding *mesh,
                           int nres, int nout, const int64_t (*dims)[TPU_MAX_RANK], const bool *prop, tpu_sharding *sh);
/* site: the Python sites of the checks (NULL: none known). */
tpu_status *tpu_spmd_launch(tpu_engine *e, tpu_cache_entry *c, tpu_rt_buffer **in, tpu_record **dst, tpu_site_fn site);
tpu_status *tpu_spmd_record_input(tpu_engine *e, tpu_record *r, int d, tpu_rt_buffer **b, tpu_rt_buffer **own);

#endif
