/* cache.c: the disk tier of the compilation cache (see cache.h).
 *
 * Safety between processes comes from the file system alone: a writer
 * fills "<name>.tmp.<pid>.<n>" and renames it onto "<name>.xc"; two writers
 * of the same entry both rename whole files, and the last one wins. A reader
 * checks magic, lengths and checksum, so a damaged file (a crash of a
 * non-POSIX writer, a disk error, a user's edit) is reported and removed,
 * never loaded. Eviction removes the oldest entries by mtime (a hit
 * refreshes it); a file removed under a concurrent reader is only a miss.
 */
#define _POSIX_C_SOURCE 200809L
#include "cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint8_t tpu_dc_magic[8] = {'T', 'P', 'U', 'X', 'C', 1, 0, 0};
#define TPU_DC_HEADER 32 /* magic, key length, payload length, checksum */

/* Writes between two scans of the folder for its size: in between, the size
 * is this process's estimate (the last scan plus what it wrote since), so a
 * write costs a stat of every entry only once in a while, not every time (a
 * folder of 25,000 entries took ~40 ms a write). Other processes' writes
 * are seen at the next scan. */
#define TPU_DC_RESCAN 256

struct tpu_dcache {
  char *dir;            /* owned */
  int64_t max_bytes;    /* <= 0: no limit */
  atomic_uint seq;      /* temporary file names */
  atomic_llong known;   /* the folder's bytes as of the last scan plus our writes; -1 before a scan */
  atomic_uint unscanned; /* writes since the last scan */
};

static int tpu_mkdirs(const char *path) {
  char *p = strdup(path);
  if (!p) return ENOMEM;
  int err = 0;
  for (char *s = p + 1; *s && !err; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST) err = errno;
    *s = '/';
  }
  if (!err && mkdir(p, 0777) != 0 && errno != EEXIST) err = errno;
  free(p);
  return err;
}

tpu_status *tpu_dcache_open(const char *dir, int64_t max_bytes, tpu_dcache **out) {
  *out = NULL;
  if (!dir || !*dir) return tpu_status_new(TPU_ERR_VALUE, "no cache folder given");
  int err = tpu_mkdirs(dir);
  struct stat st;
  if (err || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return tpu_status_new(TPU_ERR_RUNTIME, "cannot use %s as a cache folder: %s", dir,
                          strerror(err ? err : (errno ? errno : ENOTDIR)));
  tpu_dcache *c = calloc(1, sizeof *c);
  if (!c || !(c->dir = strdup(dir))) {
    free(c);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  c->max_bytes = max_bytes;
  atomic_init(&c->seq, 0);
  atomic_init(&c->known, -1);
  atomic_init(&c->unscanned, 0);
  *out = c;
  return NULL;
}

void tpu_dcache_free(tpu_dcache *c) {
  if (!c) return;
  free(c->dir);
  free(c);
}

const char *tpu_dcache_dir(const tpu_dcache *c) { return c->dir; }

/* "<dir>/<16 hex digits of the key hash>.xc" into buf. */
static void tpu_dc_path(const tpu_dcache *c, const void *key, size_t keylen, char *buf, size_t n) {
  snprintf(buf, n, "%s/%016llx.xc", c->dir, (unsigned long long)tpu_fnv1a(TPU_FNV_BASIS, key, keylen));
}

static void tpu_put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t tpu_get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Reads the whole file; NULL with *err set on failure. Owned result. */
static uint8_t *tpu_read_file(const char *path, size_t *len, int *err) {
  *err = 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    *err = errno;
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *err = errno;
    close(fd);
    return NULL;
  }
  size_t n = (size_t)st.st_size;
  uint8_t *buf = malloc(n ? n : 1);
  size_t got = 0;
  while (buf && got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (!buf) {
    *err = ENOMEM;
    return NULL;
  }
  *len = got;
  return buf;
}

tpu_dc_result tpu_dcache_get(tpu_dcache *c, const void *key, size_t keylen, void **payload, size_t *len,
                             char *why, size_t whylen) {
  *payload = NULL;
  *len = 0;
  if (whylen) why[0] = 0;
  char path[4096];
  tpu_dc_path(c, key, keylen, path, sizeof path);
  size_t n = 0;
  int err;
  uint8_t *buf = tpu_read_file(path, &n, &err);
  if (!buf) return TPU_DC_MISS;
  const char *bad = NULL;
  uint64_t kl = 0, pl = 0;
  size_t m = n < sizeof tpu_dc_magic ? n : sizeof tpu_dc_magic;
  if (memcmp(buf, tpu_dc_magic, m) != 0) {
    bad = "not a torchtpu cache entry";
  } else if (n < TPU_DC_HEADER) {
    bad = "truncated";
  } else {
    kl = tpu_get_u64(buf + 8);
    pl = tpu_get_u64(buf + 16);
    if (kl > n || pl > n || TPU_DC_HEADER + kl + pl != n) {
      bad = TPU_DC_HEADER + kl + pl > n ? "truncated" : "wrong length";
    } else {
      uint64_t sum = tpu_fnv1a(TPU_FNV_BASIS, buf + TPU_DC_HEADER, (size_t)(kl + pl));
      if (sum != tpu_get_u64(buf + 24)) bad = "checksum mismatch";
    }
  }
  if (bad) {
    snprintf(why, whylen, "%s: %s", path, bad);
    unlink(path);
    free(buf);
    return TPU_DC_CORRUPT;
  }
  if (kl != keylen || memcmp(buf + TPU_DC_HEADER, key, keylen) != 0) {
    free(buf); /* another key with the same hash: a miss */
    return TPU_DC_MISS;
  }
  memmove(buf, buf + TPU_DC_HEADER + kl, (size_t)pl);
  *payload = buf;
  *len = (size_t)pl;
  utimensat(AT_FDCWD, path, NULL, 0); /* recently used: evicted last */
  return TPU_DC_HIT;
}

void tpu_dcache_remove(tpu_dcache *c, const void *key, size_t keylen) {
  char path[4096];
  tpu_dc_path(c, key, keylen, path, sizeof path);
  unlink(path);
}

static int tpu_write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

typedef struct {
  char *name;
  int64_t size;
  struct timespec mtime;
} tpu_dc_file;

static int tpu_dc_older(const void *a, const void *b) {
  const tpu_dc_file *x = a, *y = b;
  if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
  if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int tpu_is_entry(const char *name) {
  size_t n = strlen(name);
  return n > 3 && strcmp(name + n - 3, ".xc") == 0;
}

/* Entries of the folder (owned array and names); -1 when it cannot be read. */
static int tpu_dc_list(tpu_dcache *c, tpu_dc_file **out) {
  *out = NULL;
  DIR *d = opendir(c->dir);
  if (!d) return -1;
  int n = 0, cap = 0;
  tpu_dc_file *fs = NULL;
  struct dirent *e;
  char path[4096];
  while ((e = readdir(d))) {
    if (!tpu_is_entry(e->d_name)) continue;
    snprintf(path, sizeof path, "%s/%s", c->dir, e->d_name);
    struct stat st;
    if (stat(path, &st) != 0) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      tpu_dc_file *g = realloc(fs, sizeof *fs * (size_t)cap);
      if (!g) break;
      fs = g;
    }
    fs[n].name = strdup(e->d_name);
    if (!fs[n].name) break;
    fs[n].size = (int64_t)st.st_size;
    fs[n].mtime = st.st_mtim;
    n++;
  }
  closedir(d);
  *out = fs;
  return n;
}

static void tpu_dc_list_free(tpu_dc_file *fs, int n) {
  for (int i = 0; i < n; i++) free(fs[i].name);
  free(fs);
}

int64_t tpu_dcache_size(tpu_dcache *c) {
  tpu_dc_file *fs;
  int n = tpu_dc_list(c, &fs);
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += fs[i].size;
  if (n >= 0) tpu_dc_list_free(fs, n);
  return total;
}

/* Removes the oldest entries until the folder holds at most 90% of the limit
 * (so that every write does not evict). */
static void tpu_dc_evict(tpu_dcache *c) {
  if (c->max_bytes <= 0) return;
  tpu_dc_file *fs;
  int n = tpu_dc_list(c, &fs);
  if (n < 0) return;
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += fs[i].size;
  if (total > c->max_bytes) {
    qsort(fs, (size_t)n, sizeof *fs, tpu_dc_older);
    char path[4096];
    for (int i = 0; i < n && total > c->max_bytes - c->max_bytes / 10; i++) {
      snprintf(path, sizeof path, "%s/%s", c->dir, fs[i].name);
      if (unlink(path) == 0 || errno == ENOENT) total -= fs[i].size;
    }
  }
  tpu_dc_list_free(fs, n);
  atomic_store(&c->known, (long long)total);
  atomic_store(&c->unscanned, 0);
}

/* After writing an entry of `bytes`: scan and evict when the estimate says
 * the folder is over its limit, or when it is stale. */
static void tpu_dc_after_write(tpu_dcache *c, int64_t bytes) {
  if (c->max_bytes <= 0) return;
  long long k = atomic_fetch_add(&c->known, (long long)bytes);
  unsigned w = atomic_fetch_add(&c->unscanned, 1) + 1;
  if (k < 0 || w >= TPU_DC_RESCAN || k + bytes > c->max_bytes) tpu_dc_evict(c);
}

int tpu_dcache_put(tpu_dcache *c, const void *key, size_t keylen, const void *payload, size_t len, char *why,
                   size_t whylen) {
  if (whylen) why[0] = 0;
  char path[4096], tmp[4200];
  tpu_dc_path(c, key, keylen, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&c->seq, 1));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    int err = errno;
    snprintf(why, whylen, "cannot create %s: %s", tmp, strerror(err));
    return err;
  }
  uint8_t head[TPU_DC_HEADER];
  memcpy(head, tpu_dc_magic, sizeof tpu_dc_magic);
  tpu_put_u64(head + 8, keylen);
  tpu_put_u64(head + 16, len);
  tpu_put_u64(head + 24, tpu_fnv1a(tpu_fnv1a(TPU_FNV_BASIS, key, keylen), payload, len));
  int err = tpu_write_all(fd, head, sizeof head);
  if (!err) err = tpu_write_all(fd, key, keylen);
  if (!err) err = tpu_write_all(fd, payload, len);
  if (close(fd) != 0 && !err) err = errno;
  if (!err && rename(tmp, path) != 0) err = errno;
  if (err) {
    snprintf(why, whylen, "cannot write %s: %s", path, strerror(err));
    unlink(tmp);
    return err;
  }
  tpu_dc_after_write(c, (int64_t)(sizeof head + keylen + len));
  return 0;
}
