/* cache.c: the disk tier of the compilation cache (see cache.h).
 *
 * Safety between processes comes from the file system alone: a writer
 * fills "<name>.tmp.<pid>.<n>" and renames it onto "<name>.xc"; two writers
 * of the same entry both rename whole files, and the last one wins. A reader
 * checks magic, lengths and checksum, so a damaged file (a crash of a
 * non-POSIX writer, a disk error, a user's edit) is reported and removed,
 * never loaded. Eviction removes the oldest entries by mtime (a hit
 * refreshes it); a file removed under a concurrent reader is only a miss.
 *
 * Safety against other users: the folder is checked once, at open, on the
 * descriptor of what was opened (so a symbolic link to one's own folder is
 * fine, and a folder renamed or replaced afterwards is not followed): every
 * file is then reached relative to that descriptor (openat and friends),
 * never by a path that could be redirected. An entry is checked on the
 * descriptor it is read from (owner, mode, a regular file) and by its MAC
 * before its payload leaves this file; a refused entry is left alone (it
 * may not be ours to remove) and the next put renames a good one over it.
 */
#define _POSIX_C_SOURCE 200809L
#include "cache.h"
#include "sha256.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint8_t tpu_dc_magic[8] = {'T', 'P', 'U', 'X', 'C', 2, 0, 0};
#define TPU_DC_SUMMED 32 /* magic, key length, payload length, checksum: then the MAC */
#define TPU_DC_HEADER TPU_DC_HEADER_BYTES
#define TPU_DC_KEYFILE "hmac.key"
#define TPU_DC_SECRET 32 /* bytes of the folder's key */

/* Writes between two scans of the folder for its size: in between, the size
 * is this process's estimate (the last scan plus what it wrote since), so a
 * write costs a stat of every entry only once in a while, not every time (a
 * folder of 25,000 entries took ~40 ms a write). Other processes' writes
 * are seen at the next scan. */
#define TPU_DC_RESCAN 256

struct tpu_dcache {
  char *dir;   /* owned: the folder's name, for messages only */
  int dirfd;   /* owned: the folder as checked at open; every file is reached through it */
  uid_t uid;   /* the user entries must belong to (this process's effective user) */
  bool keyed;  /* secret holds the folder's key; false: nothing can be read or written */
  int key_err; /* !keyed: the errno of making the key file (a read-only folder), for put */
  uint8_t secret[TPU_DC_SECRET];
  int64_t max_bytes;     /* <= 0: no limit */
  atomic_uint seq;       /* temporary file names */
  atomic_llong known;    /* the folder's bytes as of the last scan plus our writes; -1 before a scan */
  atomic_uint unscanned; /* writes since the last scan */
};

/* Whether the file open as fd may be trusted: of type `type` (S_IFDIR or
 * S_IFREG), owned by uid, writable by nobody else (and, with keyfile, not
 * readable by anyone else either: a key file). 0 with why filled when not. */
static int tpu_dc_trusted(int fd, mode_t type, uid_t uid, bool keyfile, char *why, size_t whylen) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(why, whylen, "not readable (%s)", strerror(errno));
    return 0;
  }
  if ((st.st_mode & S_IFMT) != type)
    snprintf(why, whylen, "not a %s", type == S_IFDIR ? "folder" : "regular file");
  else if (st.st_uid != uid)
    snprintf(why, whylen, "owned by another user (uid %lu, this process runs as %lu)", (unsigned long)st.st_uid,
             (unsigned long)uid);
  else if (st.st_mode & (S_IWGRP | S_IWOTH))
    snprintf(why, whylen, "writable by group or others (mode %04o)", (unsigned)(st.st_mode & 07777));
  else if (keyfile && (st.st_mode & (S_IRWXG | S_IRWXO)))
    snprintf(why, whylen, "readable by group or others (mode %04o)", (unsigned)(st.st_mode & 07777));
  else
    return 1;
  return 0;
}

/* mkdir -p, each folder made 0700; one this call makes is set to exactly
 * 0700 through a descriptor (the umask may have taken bits away; a path
 * swapped for a link in between is not followed). 0 or an errno. */
static int tpu_mkdirs(const char *path) {
  char *p = strdup(path);
  if (!p) return ENOMEM;
  int err = 0;
  for (char *s = p + 1; !err; s++) {
    if (*s && *s != '/') continue;
    char was = *s;
    *s = 0;
    if (mkdir(p, 0700) == 0) {
      int fd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0 || fchmod(fd, 0700) != 0) err = errno;
      if (fd >= 0) close(fd);
    } else if (errno != EEXIST) {
      err = errno;
    }
    *s = was;
    if (!was) break;
  }
  free(p);
  return err;
}

/* n random bytes (the kernel's generator). 0 or an errno. */
static int tpu_dc_random(uint8_t *out, size_t n) {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, out + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  return got == n ? 0 : EIO;
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

/* Makes the folder's key file: random bytes in a 0600 temporary file, then
 * linked to its name, which fails if another process made it first (that
 * key is then the one read; nothing is ever overwritten). 0, EEXIST, or
 * the errno that stopped it. */
static int tpu_dc_make_key(tpu_dcache *c) {
  uint8_t k[TPU_DC_SECRET];
  int err = tpu_dc_random(k, sizeof k);
  if (err) return err;
  char tmp[64];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", TPU_DC_KEYFILE, (long)getpid(), atomic_fetch_add(&c->seq, 1));
  int fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    tpu_wipe(k, sizeof k);
    return errno;
  }
  if (fchmod(fd, 0600) != 0) err = errno;
  if (!err) err = tpu_write_all(fd, k, sizeof k);
  if (!err && fsync(fd) != 0) err = errno; /* never a short key file after a crash */
  tpu_wipe(k, sizeof k);
  if (close(fd) != 0 && !err) err = errno;
  if (!err && linkat(c->dirfd, tmp, c->dirfd, TPU_DC_KEYFILE, 0) != 0) err = errno;
  unlinkat(c->dirfd, tmp, 0);
  return err;
}

/* Reads the folder's key into c->secret, making the key file first when
 * there is none. A folder where it cannot be made (read-only) is left
 * unkeyed (every get a miss, every put an error); a key file that is not a
 * private file of ours, or cannot be read, refuses the folder. */
static tpu_status *tpu_dc_load_key(tpu_dcache *c) {
  for (int attempt = 0;; attempt++) {
    int fd = openat(c->dirfd, TPU_DC_KEYFILE, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      char bad[160];
      size_t got = 0;
      struct stat st;
      bool ok = tpu_dc_trusted(fd, S_IFREG, c->uid, true, bad, sizeof bad);
      if (ok && (fstat(fd, &st) != 0 || st.st_size != TPU_DC_SECRET)) {
        snprintf(bad, sizeof bad, "not %d bytes long", TPU_DC_SECRET);
      } else if (ok) {
        while (got < sizeof c->secret) {
          ssize_t r = read(fd, c->secret + got, sizeof c->secret - got);
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) break;
          got += (size_t)r;
        }
        if (got != sizeof c->secret) snprintf(bad, sizeof bad, "not readable");
      }
      close(fd);
      if (got == sizeof c->secret) {
        c->keyed = true;
        return NULL;
      }
      tpu_wipe(c->secret, sizeof c->secret);
      return tpu_status_new(TPU_ERR_RUNTIME, "cannot use %s as a cache folder: its key file %s is %s", c->dir,
                            TPU_DC_KEYFILE, bad);
    }
    int err = errno;
    if (err == ELOOP)
      return tpu_status_new(TPU_ERR_RUNTIME, "cannot use %s as a cache folder: its key file %s is a symbolic link",
                            c->dir, TPU_DC_KEYFILE);
    if (err != ENOENT || attempt)
      return tpu_status_new(TPU_ERR_RUNTIME, "cannot use %s as a cache folder: cannot read its key file %s: %s", c->dir,
                            TPU_DC_KEYFILE, strerror(err));
    err = tpu_dc_make_key(c);
    if (err && err != EEXIST) {
      c->key_err = err; /* a folder we cannot write: entries can be neither checked nor written (put says so) */
      return NULL;
    }
  }
}

tpu_status *tpu_dcache_open(const char *dir, int64_t max_bytes, tpu_dcache **out) {
  *out = NULL;
  if (!dir || !*dir) return tpu_status_new(TPU_ERR_VALUE, "no cache folder given");
  int err = tpu_mkdirs(dir);
  int fd = err ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return tpu_status_new(TPU_ERR_RUNTIME, "cannot use %s as a cache folder: %s", dir, strerror(err ? err : errno));
  char bad[160];
  if (!tpu_dc_trusted(fd, S_IFDIR, geteuid(), false, bad, sizeof bad)) {
    close(fd);
    return tpu_status_new(TPU_ERR_RUNTIME,
                          "cannot use %s as a cache folder: it is %s, and its entries are code this process "
                          "would run (chmod go-w it, or choose another folder)",
                          dir, bad);
  }
  tpu_dcache *c = calloc(1, sizeof *c);
  if (!c || !(c->dir = strdup(dir))) {
    free(c);
    close(fd);
    return tpu_status_new(TPU_ERR_MEMORY, "out of memory");
  }
  c->dirfd = fd;
  c->uid = geteuid();
  c->max_bytes = max_bytes;
  atomic_init(&c->seq, 0);
  atomic_init(&c->known, -1);
  atomic_init(&c->unscanned, 0);
  tpu_status *s = tpu_dc_load_key(c);
  if (s) {
    tpu_dcache_free(c);
    return s;
  }
  *out = c;
  return NULL;
}

void tpu_dcache_free(tpu_dcache *c) {
  if (!c) return;
  tpu_wipe(c->secret, sizeof c->secret);
  close(c->dirfd);
  free(c->dir);
  free(c);
}

const char *tpu_dcache_dir(const tpu_dcache *c) { return c->dir; }

/* "<16 hex digits of the key hash>.xc" (in the folder) into buf. */
static void tpu_dc_name(const void *key, size_t keylen, char *buf, size_t n) {
  snprintf(buf, n, "%016llx.xc", (unsigned long long)tpu_fnv1a(TPU_FNV_BASIS, key, keylen));
}

static void tpu_put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t tpu_get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The MAC of an entry: HMAC-SHA-256 under the folder's key of the summed
 * part of the header (magic, lengths, checksum), the key and the payload. */
static void tpu_dc_mac(const tpu_dcache *c, const uint8_t *head, const void *key, size_t keylen, const void *payload,
                       size_t len, uint8_t out[TPU_SHA256_BYTES]) {
  tpu_hmac_sha256 h;
  tpu_hmac_init(&h, c->secret, sizeof c->secret);
  tpu_hmac_update(&h, head, TPU_DC_SUMMED);
  tpu_hmac_update(&h, key, keylen);
  tpu_hmac_update(&h, payload, len);
  tpu_hmac_final(&h, out);
}

/* Reads the whole file open as fd (closed here); NULL on failure. Owned result. */
static uint8_t *tpu_read_fd(int fd, size_t *len) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return NULL;
  }
  size_t n = (size_t)st.st_size;
  uint8_t *buf = malloc(n ? n : 1);
  size_t got = 0;
  while (buf && got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  *len = got;
  return buf;
}

tpu_dc_result tpu_dcache_get(tpu_dcache *c, const void *key, size_t keylen, void **payload, size_t *len, char *why,
                             size_t whylen) {
  *payload = NULL;
  *len = 0;
  if (whylen) why[0] = 0;
  if (!c->keyed) return TPU_DC_MISS; /* no key: nothing can be checked */
  char name[32], bad[160];
  tpu_dc_name(key, keylen, name, sizeof name);
  int fd = openat(c->dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ELOOP) return TPU_DC_MISS;
    snprintf(why, whylen, "%s/%s: a symbolic link", c->dir, name);
    return TPU_DC_REFUSED;
  }
  if (!tpu_dc_trusted(fd, S_IFREG, c->uid, false, bad, sizeof bad)) {
    close(fd);
    snprintf(why, whylen, "%s/%s: %s", c->dir, name, bad);
    return TPU_DC_REFUSED;
  }
  size_t n = 0;
  uint8_t *buf = tpu_read_fd(fd, &n);
  if (!buf) return TPU_DC_MISS;
  const char *damaged = NULL;
  uint64_t kl = 0, pl = 0;
  size_t m = n < sizeof tpu_dc_magic ? n : sizeof tpu_dc_magic;
  if (n > 5 && memcmp(buf, tpu_dc_magic, 5) == 0 && buf[5] != tpu_dc_magic[5]) {
    free(buf); /* another format version: a miss, replaced by the next put */
    return TPU_DC_MISS;
  } else if (memcmp(buf, tpu_dc_magic, m) != 0) {
    damaged = "not a torchtpu cache entry";
  } else if (n < TPU_DC_HEADER) {
    damaged = "truncated";
  } else {
    kl = tpu_get_u64(buf + 8);
    pl = tpu_get_u64(buf + 16);
    if (kl > n || pl > n || TPU_DC_HEADER + kl + pl != n) {
      damaged = TPU_DC_HEADER + kl + pl > n ? "truncated" : "wrong length";
    } else {
      uint64_t sum = tpu_fnv1a(TPU_FNV_BASIS, buf + TPU_DC_HEADER, (size_t)(kl + pl));
      if (sum != tpu_get_u64(buf + 24)) damaged = "checksum mismatch";
    }
  }
  if (damaged) {
    snprintf(why, whylen, "%s/%s: %s", c->dir, name, damaged);
    unlinkat(c->dirfd, name, 0);
    free(buf);
    return TPU_DC_CORRUPT;
  }
  uint8_t mac[TPU_SHA256_BYTES];
  tpu_dc_mac(c, buf, buf + TPU_DC_HEADER, (size_t)kl, buf + TPU_DC_HEADER + kl, (size_t)pl, mac);
  if (!tpu_equal_ct(mac, buf + TPU_DC_SUMMED, sizeof mac)) {
    snprintf(why, whylen, "%s/%s: tampered or foreign entry (its MAC does not match this folder's key)", c->dir, name);
    free(buf);
    return TPU_DC_REFUSED;
  }
  if (kl != keylen || memcmp(buf + TPU_DC_HEADER, key, keylen) != 0) {
    free(buf); /* another key with the same hash: a miss */
    return TPU_DC_MISS;
  }
  memmove(buf, buf + TPU_DC_HEADER + kl, (size_t)pl);
  *payload = buf;
  *len = (size_t)pl;
  utimensat(c->dirfd, name, NULL, AT_SYMLINK_NOFOLLOW); /* recently used: evicted last */
  return TPU_DC_HIT;
}

void tpu_dcache_remove(tpu_dcache *c, const void *key, size_t keylen) {
  char name[32];
  tpu_dc_name(key, keylen, name, sizeof name);
  unlinkat(c->dirfd, name, 0);
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

/* Entries of the folder (owned array and names); -1 when it cannot be read.
 * The folder is opened afresh (its own read position) through dirfd. */
static int tpu_dc_list(tpu_dcache *c, tpu_dc_file **out) {
  *out = NULL;
  int fd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return -1;
  }
  int n = 0, cap = 0;
  tpu_dc_file *fs = NULL;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!tpu_is_entry(e->d_name)) continue;
    struct stat st;
    if (fstatat(c->dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
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
  closedir(d); /* closes fd */
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
    for (int i = 0; i < n && total > c->max_bytes - c->max_bytes / 10; i++)
      if (unlinkat(c->dirfd, fs[i].name, 0) == 0 || errno == ENOENT) total -= fs[i].size;
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
  if (!c->keyed) {
    int err = c->key_err ? c->key_err : EACCES;
    snprintf(why, whylen, "cannot make its key file %s/%s: %s", c->dir, TPU_DC_KEYFILE, strerror(err));
    return err;
  }
  char name[32], tmp[96];
  tpu_dc_name(key, keylen, name, sizeof name);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", name, (long)getpid(), atomic_fetch_add(&c->seq, 1));
  int fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    int err = errno;
    snprintf(why, whylen, "cannot create %s/%s: %s", c->dir, tmp, strerror(err));
    return err;
  }
  uint8_t head[TPU_DC_HEADER];
  memcpy(head, tpu_dc_magic, sizeof tpu_dc_magic);
  tpu_put_u64(head + 8, keylen);
  tpu_put_u64(head + 16, len);
  tpu_put_u64(head + 24, tpu_fnv1a(tpu_fnv1a(TPU_FNV_BASIS, key, keylen), payload, len));
  tpu_dc_mac(c, head, key, keylen, payload, len, head + TPU_DC_SUMMED);
  int err = fchmod(fd, 0600) != 0 ? errno : 0; /* exactly 0600, whatever the umask */
  if (!err) err = tpu_write_all(fd, head, sizeof head);
  if (!err) err = tpu_write_all(fd, key, keylen);
  if (!err) err = tpu_write_all(fd, payload, len);
  if (close(fd) != 0 && !err) err = errno;
  if (!err && renameat(c->dirfd, tmp, c->dirfd, name) != 0) err = errno;
  if (err) {
    snprintf(why, whylen, "cannot write %s/%s: %s", c->dir, name, strerror(err));
    unlinkat(c->dirfd, tmp, 0);
    return err;
  }
  tpu_dc_after_write(c, (int64_t)(sizeof head + keylen + len));
  return 0;
}
