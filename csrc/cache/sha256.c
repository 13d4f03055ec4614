/* sha256.c: SHA-256 after FIPS 180-4 (sections 4.1.2, 4.2.2, 5.1.1, 5.3.3,
 * 6.2) and HMAC after RFC 2104; see sha256.h. Checked against the FIPS and
 * RFC 4231 test vectors in tests/c/test_cache.c. */
#include "sha256.h"

#include <string.h>

/* The first 32 bits of the fractional parts of the cube roots of the first
 * 64 primes (FIPS 180-4, 4.2.2). */
static const uint32_t tpu_sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t tpu_rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block into the chaining value (FIPS 180-4, 6.2.2). */
static void tpu_sha_block(uint32_t h[8], const uint8_t *b) {
  uint32_t w[64];
  for (int t = 0; t < 16; t++)
    w[t] = (uint32_t)b[4 * t] << 24 | (uint32_t)b[4 * t + 1] << 16 | (uint32_t)b[4 * t + 2] << 8 | b[4 * t + 3];
  for (int t = 16; t < 64; t++) {
    uint32_t s0 = tpu_rotr(w[t - 15], 7) ^ tpu_rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = tpu_rotr(w[t - 2], 17) ^ tpu_rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = s1 + w[t - 7] + s0 + w[t - 16];
  }
  uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int t = 0; t < 64; t++) {
    uint32_t S1 = tpu_rotr(e, 6) ^ tpu_rotr(e, 11) ^ tpu_rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = hh + S1 + ch + tpu_sha_k[t] + w[t];
    uint32_t S0 = tpu_rotr(a, 2) ^ tpu_rotr(a, 13) ^ tpu_rotr(a, 22);
    uint32_t maj = (a & bb) ^ (a & c) ^ (bb & c);
    uint32_t t2 = S0 + maj;
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = bb;
    bb = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += bb;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

void tpu_sha256_init(tpu_sha256_ctx *s) {
  /* the first 32 bits of the fractional parts of the square roots of the
   * first 8 primes (5.3.3) */
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->total = 0;
  s->nbuf = 0;
}

void tpu_sha256_update(tpu_sha256_ctx *s, const void *p, size_t n) {
  const uint8_t *b = p;
  s->total += n;
  if (s->nbuf) {
    size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
    memcpy(s->buf + s->nbuf, b, take);
    s->nbuf += take;
    b += take;
    n -= take;
    if (s->nbuf < 64) return;
    tpu_sha_block(s->h, s->buf);
    s->nbuf = 0;
  }
  for (; n >= 64; b += 64, n -= 64) tpu_sha_block(s->h, b);
  memcpy(s->buf, b, n);
  s->nbuf = n;
}

/* Padding (5.1.1): a 1 bit, zeros up to 56 bytes mod 64, the length in bits
 * as a big-endian 64-bit number. */
void tpu_sha256_final(tpu_sha256_ctx *s, uint8_t out[TPU_SHA256_BYTES]) {
  uint64_t bits = s->total * 8;
  uint8_t pad[72] = {0x80};
  size_t npad = (s->nbuf < 56 ? 56 : 120) - s->nbuf;
  for (int i = 0; i < 8; i++) pad[npad + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
  tpu_sha256_update(s, pad, npad + 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
  tpu_wipe(s, sizeof *s);
}

void tpu_sha256(const void *p, size_t n, uint8_t out[TPU_SHA256_BYTES]) {
  tpu_sha256_ctx s;
  tpu_sha256_init(&s);
  tpu_sha256_update(&s, p, n);
  tpu_sha256_final(&s, out);
}

/* RFC 2104: H((K' ^ opad) || H((K' ^ ipad) || m)), K' the key padded with
 * zeros to the block size (64 bytes), or its hash when it is longer. */
void tpu_hmac_init(tpu_hmac_sha256 *h, const void *key, size_t keylen) {
  uint8_t k[64] = {0}, pad[64];
  if (keylen > sizeof k)
    tpu_sha256(key, keylen, k);
  else if (keylen)
    memcpy(k, key, keylen);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
  tpu_sha256_init(&h->inner);
  tpu_sha256_update(&h->inner, pad, sizeof pad);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
  tpu_sha256_init(&h->outer);
  tpu_sha256_update(&h->outer, pad, sizeof pad);
  tpu_wipe(k, sizeof k);
  tpu_wipe(pad, sizeof pad);
}

void tpu_hmac_update(tpu_hmac_sha256 *h, const void *p, size_t n) { tpu_sha256_update(&h->inner, p, n); }

void tpu_hmac_final(tpu_hmac_sha256 *h, uint8_t out[TPU_SHA256_BYTES]) {
  uint8_t in[TPU_SHA256_BYTES];
  tpu_sha256_final(&h->inner, in);
  tpu_sha256_update(&h->outer, in, sizeof in);
  tpu_sha256_final(&h->outer, out);
  tpu_wipe(in, sizeof in);
}

void tpu_hmac_sha256_of(const void *key, size_t keylen, const void *p, size_t n, uint8_t out[TPU_SHA256_BYTES]) {
  tpu_hmac_sha256 h;
  tpu_hmac_init(&h, key, keylen);
  tpu_hmac_update(&h, p, n);
  tpu_hmac_final(&h, out);
}

int tpu_equal_ct(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= (uint8_t)(x[i] ^ y[i]);
  return d == 0;
}

void tpu_wipe(void *p, size_t n) {
  volatile uint8_t *b = p;
  while (n--) *b++ = 0;
}
