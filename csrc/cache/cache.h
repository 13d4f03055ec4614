/* cache.h: the disk tier of the compilation cache.
 *
 * One file per compiled program in one folder, shared by any number of
 * processes of one user. An entry is found by the hash of its key and holds
 * the whole key, so a hash collision reads as a miss, never as the wrong
 * program. The key is what the program's result depends on: the program
 * text and a salt (compile options, plugin platform/version/file, PJRT API
 * version, torchtpu version), built by the caller.
 *
 * Trust: a cache entry is code this process will run, so the folder is the
 * trust boundary. It is created 0700 (whatever the umask) and must be owned
 * by this user and not writable by group or others, or it is refused at
 * open; an entry must be a regular file owned by this user and not writable
 * by group or others, and must carry an HMAC-SHA-256, under the folder's
 * secret key file ("hmac.key", 32 random bytes, 0600), of its header, key
 * and payload: so an entry someone else wrote, or one program's key with
 * another's payload, is refused (TPU_DC_REFUSED) however its checksum reads.
 *
 * File: magic "TPUXC\2\0\0", u64 key length, u64 payload length, u64
 * FNV-1a checksum of key and payload (accidental damage), 32-byte MAC, then
 * key and payload. An entry of an older format is a miss (rewritten by the
 * next put). Writes go to a temporary file (0600) in the folder, renamed
 * into place (atomic on POSIX), so a reader sees a whole entry or none. A
 * hit refreshes the entry's mtime; when the folder holds more than
 * max_bytes of entries, the oldest are removed.
 */
#ifndef TPU_CACHE_H
#define TPU_CACHE_H

#include "../core.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tpu_dcache tpu_dcache;

typedef enum {
  TPU_DC_HIT,     /* *payload set */
  TPU_DC_MISS,    /* no entry for this key */
  TPU_DC_CORRUPT, /* an entry was there but damaged (removed); why says how */
  TPU_DC_REFUSED  /* an entry was there but is not trusted (left alone; a put replaces it); why says why */
} tpu_dc_result;

/* Bytes of an entry's header (the rest is key and payload). */
#define TPU_DC_HEADER_BYTES 64

/* Open dir (created 0700 with parents if missing). max_bytes <= 0: no
 * limit. On failure (a folder that cannot be made, or one not owned by this
 * user or writable by others, or whose key file is not trusted) returns a
 * status saying why (the caller falls back to memory). A folder that can be
 * read but not written (no key file can be made there) opens: every get is
 * then a miss unless the key file exists, and put reports the error. */
tpu_status *tpu_dcache_open(const char *dir, int64_t max_bytes, tpu_dcache **out);
void tpu_dcache_free(tpu_dcache *c);
const char *tpu_dcache_dir(const tpu_dcache *c);

/* Look key up. On a hit *payload is owned by the caller (free()). */
tpu_dc_result tpu_dcache_get(tpu_dcache *c, const void *key, size_t keylen, void **payload, size_t *len, char *why,
                             size_t whylen);
/* Remove the entry of this key (a payload the plugin refused). */
void tpu_dcache_remove(tpu_dcache *c, const void *key, size_t keylen);
/* Store an entry (0600). Returns 0, or the errno of the failed write (why
 * says what failed); the folder is left without a partial entry either way. */
int tpu_dcache_put(tpu_dcache *c, const void *key, size_t keylen, const void *payload, size_t len, char *why,
                   size_t whylen);
/* Bytes of entries in the folder (a scan). */
int64_t tpu_dcache_size(tpu_dcache *c);

#endif
