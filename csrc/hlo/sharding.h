/* sharding.h: the StableHLO spellings of a sharding over a device mesh
 * (the tpu_sharding itself and its geometry: mesh.h), included by hlo.h.
 *
 * Two spellings of the same thing are written here: GSPMD's (the string of an
 * mhlo.sharding attribute) and Shardy's (#sdy.sharding<@mesh, ...> over an
 * sdy.mesh named "mesh" whose axes are named by the caller, or a0, a1, ...).
 * The string functions work like snprintf: they write at most n bytes (NUL
 * included; buf may be NULL when n is 0) and return the full length, or -1
 * (buf set to "") for an invalid sharding or name.
 */
#ifndef TPU_HLO_SHARDING_H
#define TPU_HLO_SHARDING_H

#include "../mesh.h"

#define TPU_MESH_NAME_MAX 31 /* bytes of a Shardy axis name */

/* GSPMD: "{replicated}", or "{devices=[t_0,...,t_r-1(,t_rep)]d,d,... (last_tile_dim_replicate)}" with an
 * explicit device list (the tile assignment in row-major order). */
int tpu_sharding_gspmd(const tpu_sharding *s, char *buf, size_t n);

/* Shardy axis names: NULL means a0, a1, ...; otherwise mesh_rank distinct
 * names of 1..TPU_MESH_NAME_MAX letters, digits and underscores. NULL when
 * valid, else an owned TPU_ERR_VALUE status. */
tpu_status *tpu_sdy_axis_names_check(int mesh_rank, const char *const *axis_names);
/* Shardy: `#sdy.sharding<@mesh, [{"a0"}, {}]>`. */
int tpu_sharding_sdy(const tpu_sharding *s, const char *const *axis_names, char *buf, size_t n);
/* Shardy: the mesh's declaration, an op at module level:
 * `"sdy.mesh"() {mesh = #sdy.mesh<["a0"=2, "a1"=2]>, sym_name = "mesh"} : () -> ()`. */
int tpu_sdy_mesh(int mesh_rank, const int64_t *mesh, const char *const *axis_names, char *buf, size_t n);

#endif
