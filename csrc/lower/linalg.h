/* linalg.h: what the linalg emitters share across files (emit_linalg.c
 * defines these; emit_svd.c the SVD). Matrices are stacks [..., m, n]. */
#ifndef TPU_LINALG_H
#define TPU_LINALG_H

#include "emit.h"

/* A float matrix stack argument (rank >= 2, square when asked), else fails as torch. */
bool tpu_check_matrix(tpu_lower *L, int i, bool square, const char *fn);
/* x with its last two dims swapped. */
tpu_hv tpu_mT(tpu_lower *L, tpu_hv x);
/* [..., m, k] @ [..., k, n] with equal batch dims. */
tpu_hv tpu_bmatmul(tpu_lower *L, tpu_hv a, tpu_hv b);
/* Broadcasts the batch dims of matrix stacks a and b against each other
 * (false, L failed, when they do not broadcast). */
bool tpu_batch_bcast(tpu_lower *L, tpu_hv *a, tpu_hv *b);
/* The identity of t's last two dims, broadcast over its batch. */
tpu_hv tpu_eye_like(tpu_lower *L, const tpu_hlo_type *t);
/* `sweeps` cyclic Jacobi sweeps over the column pairs of *a, the rotations
 * accumulated into *v: two-sided (eigh) or one-sided (SVD). */
bool tpu_jacobi_sweeps(tpu_lower *L, bool two_sided, int sweeps, tpu_hv *a, tpu_hv *v);
/* s [..., k] sorted descending (stable), and the one-hot M with X M = X's columns in that order. */
tpu_hv tpu_sort_desc(tpu_lower *L, tpu_hv s, tpu_hv *mat);
/* LAPACK's geqrf: packed reflectors and R, taus [..., min(m, n)]. */
void tpu_geqrf(tpu_lower *L, tpu_hv a, tpu_hv *packed, tpu_hv *taus);
/* The first ncols columns of Q = H_0 ... H_{k-1}. */
tpu_hv tpu_hh_product(tpu_lower *L, tpu_hv packed, tpu_hv taus, int64_t ncols);

/* SVD (emit_svd.c): U [..., m, m or k], S [..., k] descending, V [..., n, n or k]
 * (full or thin) of a [..., m, n], k = min(m, n); U and V orthonormal. */
void tpu_svd(tpu_lower *L, tpu_hv a, bool full, tpu_hv *U, tpu_hv *S, tpu_hv *V);

#endif
