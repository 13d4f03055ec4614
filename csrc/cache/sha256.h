/* sha256.h: SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the disk
 * tier of the compilation cache: an entry carries a MAC of its key and
 * payload under a secret only the folder's owner can read, so an entry
 * written by anyone else (or one program's key with another's payload) is
 * refused, whatever checksum it carries. Streaming: init, any number of
 * updates, final. No allocation; a context is plain data the caller owns.
 */
#ifndef TPU_SHA256_H
#define TPU_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define TPU_SHA256_BYTES 32

typedef struct {
  uint32_t h[8];   /* the chaining value */
  uint64_t total;  /* bytes hashed so far */
  uint8_t buf[64]; /* a partial block */
  size_t nbuf;
} tpu_sha256_ctx;

void tpu_sha256_init(tpu_sha256_ctx *s);
void tpu_sha256_update(tpu_sha256_ctx *s, const void *p, size_t n);
void tpu_sha256_final(tpu_sha256_ctx *s, uint8_t out[TPU_SHA256_BYTES]);
void tpu_sha256(const void *p, size_t n, uint8_t out[TPU_SHA256_BYTES]);

typedef struct {
  tpu_sha256_ctx inner, outer; /* keyed with K^ipad and K^opad */
} tpu_hmac_sha256;

void tpu_hmac_init(tpu_hmac_sha256 *h, const void *key, size_t keylen);
void tpu_hmac_update(tpu_hmac_sha256 *h, const void *p, size_t n);
void tpu_hmac_final(tpu_hmac_sha256 *h, uint8_t out[TPU_SHA256_BYTES]);
void tpu_hmac_sha256_of(const void *key, size_t keylen, const void *p, size_t n, uint8_t out[TPU_SHA256_BYTES]);

/* 1 when the n bytes at a and b are equal; the time does not depend on
 * where they differ (for comparing MACs). */
int tpu_equal_ct(const void *a, const void *b, size_t n);

/* Overwrites n bytes in a way the compiler does not remove (key material). */
void tpu_wipe(void *p, size_t n);

#endif
