/* aot.h: a compile-only target beside the runtime's client: a PJRT plugin
 * (libtpu) and a topology description ("v5e:2x2", "v6e:2x2", "v5p:2x2x1", as
 * libtpu spells them), no devices. Programs are compiled for the topology's
 * chips on any host, and what the compiler says of them is read back: its
 * cost analysis, the memory the program needs on each chip, and the
 * serialized executable (loadable only on a machine with those chips and
 * the same libtpu build). Nothing here runs a program.
 *
 * Before the plugin initializes, libtpu's environment is made fit for a host
 * without a TPU, each variable only where the user has not set it:
 * TPU_SKIP_MDS_QUERY=1 (else libtpu asks the cloud metadata server, minutes
 * of retries off Google Cloud), ALLOW_MULTIPLE_LIBTPU_LOAD=1 (else a second
 * process compiling at the same time fails on libtpu's lock file), and
 * TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES (only to quiet its warnings;
 * they do not change the topology compiled for).
 *
 * Errors: statuses as runtime.h's (the plugin's RESOURCE_EXHAUSTED, which is
 * how a program larger than the chip's memory is refused, is TPU_ERR_MEMORY).
 */
#ifndef TPU_AOT_H
#define TPU_AOT_H

#include "runtime.h"

typedef struct tpu_rt_target tpu_rt_target;

/* NULL when topology is "<generation>:<A>x<B>" or ":<A>x<B>x<C>" with every
 * chip count from 1 to TPU_TOPOLOGY_MAX_DIM, and, for v5e, A and B at most 16
 * and C 1 (libtpu 0.0.52 ends the process on those: SIGFPE on a 0, a CHECK
 * failure past v5e's bounds); otherwise an owned TPU_ERR_VALUE naming the
 * part that is wrong. Whether libtpu knows the generation is its own check. */
enum { TPU_TOPOLOGY_MAX_DIM = 64 };
tpu_status *tpu_rt_topology_check(const char *topology);
/* dlopen the plugin (never closed), initialize it, describe the topology
 * (checked first by tpu_rt_topology_check). A name libtpu does not know is
 * TPU_ERR_VALUE naming it and quoting libtpu. */
tpu_status *tpu_rt_target_open(const char *plugin_path, const char *topology, tpu_rt_target **out);
void tpu_rt_target_close(tpu_rt_target *t);

/* Borrowed strings, lifetime of t. */
const char *tpu_rt_target_topology(const tpu_rt_target *t);         /* as given: "v5e:2x2" */
const char *tpu_rt_target_kind(const tpu_rt_target *t);             /* "TPU v5 lite" */
const char *tpu_rt_target_platform_version(const tpu_rt_target *t); /* libtpu's build */
int tpu_rt_target_num_devices(const tpu_rt_target *t);
int64_t tpu_rt_target_hbm_bytes(const tpu_rt_target *t); /* per chip; -1 unknown */
/* What a serialized executable depends on: libtpu's build (the platform
 * version, which names it, and the file's size), its PJRT version, the
 * topology. Not the file's path nor mtime: the same build elsewhere matches.
 * Owned. */
char *tpu_rt_target_cache_salt(const tpu_rt_target *t);

/* What the compiler says of one program (per chip for a partitioned one).
 * A number the plugin does not report is -1; optimal_seconds < 0 means no
 * estimate. */
typedef struct {
  double flops, bytes_accessed, transcendentals, optimal_seconds;
  int64_t code_bytes, argument_bytes, output_bytes, alias_bytes, temp_bytes, peak_bytes;
  int64_t serialized_bytes;
  int partitions;
  char fingerprint[65]; /* hex of the executable's fingerprint (at most 32 bytes), "" if none */
} tpu_rt_aot_stats;

/* Compile StableHLO text for the topology with o's replicas and partitions
 * (NULL: one chip). Fills *st; with bytes, *bytes receives the serialized
 * executable (owned, free()) and *nbytes its size; with opt, the program as
 * libtpu optimized it (the layouts its partitioner chose: runtime.h). */
tpu_status *tpu_rt_target_compile(tpu_rt_target *t, const char *mlir, size_t len, const tpu_rt_compile_opts *o,
                                  tpu_rt_aot_stats *st, void **bytes, size_t *nbytes, tpu_rt_module *opt);

#endif
