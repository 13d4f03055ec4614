/* test_cache.c: the disk tier of the compilation cache (csrc/cache), on a
 * temporary folder: round trips, keys that share a file name, damaged files
 * (removed and reported), eviction by size and age, a folder that cannot be
 * created; SHA-256 and HMAC-SHA-256 against the FIPS 180-4 / RFC 4231
 * vectors; the trust rules: folders 0700 and entries 0600 under any umask,
 * folders and entries writable by others or owned by another user refused,
 * an entry with another entry's payload (checksum recomputed) or another
 * folder's MAC refused. The last line is "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/sha256.h"

#include "check.h"

static char root[256];

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".xc")) n++;
  if (d) closedir(d);
  return n;
}

/* The path of the only entry in dir (static buffer). */
static const char *only_entry(const char *dir) {
  static char path[600];
  DIR *d = opendir(dir);
  struct dirent *e;
  path[0] = 0;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".xc")) snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
  if (d) closedir(d);
  return path;
}

static void rm_entries(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[600];
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  if (d) closedir(d);
}

static void test_round_trip(void) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/a/b", root); /* parents are created */
  tpu_dcache *c = NULL;
  tpu_status *s = tpu_dcache_open(dir, 0, &c);
  CHECK(!s && c, "open: %s", s ? tpu_status_message(s) : "");
  if (!c) return;
  char why[512];
  void *p = NULL;
  size_t n = 0;
  CHECK(tpu_dcache_get(c, "k1", 2, &p, &n, why, sizeof why) == TPU_DC_MISS, "empty folder");
  CHECK(tpu_dcache_put(c, "k1", 2, "payload-one", 11, why, sizeof why) == 0, "put: %s", why);
  CHECK(tpu_dcache_get(c, "k1", 2, &p, &n, why, sizeof why) == TPU_DC_HIT, "hit");
  CHECK(p && n == 11 && memcmp(p, "payload-one", 11) == 0, "payload");
  free(p);
  CHECK(tpu_dcache_put(c, "k1", 2, "two", 3, why, sizeof why) == 0, "overwrite: %s", why);
  CHECK(tpu_dcache_get(c, "k1", 2, &p, &n, why, sizeof why) == TPU_DC_HIT && n == 3, "overwritten");
  free(p);
  CHECK(tpu_dcache_get(c, "k2", 2, &p, &n, why, sizeof why) == TPU_DC_MISS && !p, "other key");
  CHECK(count_entries(dir) == 1, "one entry");
  CHECK(tpu_dcache_size(c) == TPU_DC_HEADER_BYTES + 2 + 3, "size %lld", (long long)tpu_dcache_size(c));
  /* An entry whose stored key differs (a hash collision) is a miss, not a hit. */
  char from[600], to[700];
  snprintf(from, sizeof from, "%s", only_entry(dir));
  tpu_dcache_put(c, "k2", 2, "x", 1, why, sizeof why);
  CHECK(count_entries(dir) == 2, "two entries");
  snprintf(to, sizeof to, "%s", from);
  unlink(to);
  /* rename k2's file onto k1's name */
  DIR *d = opendir(dir);
  struct dirent *e;
  char k2path[600] = "";
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".xc")) snprintf(k2path, sizeof k2path, "%s/%s", dir, e->d_name);
  if (d) closedir(d);
  CHECK(rename(k2path, to) == 0, "rename");
  CHECK(tpu_dcache_get(c, "k1", 2, &p, &n, why, sizeof why) == TPU_DC_MISS && !p, "collision is a miss");
  tpu_dcache_remove(c, "k1", 2);
  CHECK(count_entries(dir) == 0, "removed");
  tpu_dcache_free(c);
}

static void damage(const char *path, int how) {
  struct stat st;
  stat(path, &st);
  if (how == 0) {
    CHECK(truncate(path, st.st_size / 2) == 0, "truncate");
  } else {
    int fd = open(path, O_RDWR);
    unsigned char b;
    off_t at = how == 1 ? st.st_size - 1 : 0; /* payload byte, or the magic */
    pread(fd, &b, 1, at);
    b ^= 0x5a;
    CHECK(pwrite(fd, &b, 1, at) == 1, "write");
    close(fd);
  }
}

static void test_damaged(void) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/damaged", root);
  tpu_dcache *c = NULL;
  tpu_status_free(tpu_dcache_open(dir, 0, &c));
  if (!c) return;
  static const char *what[] = {"truncated", "checksum mismatch", "not a torchtpu cache entry"};
  for (int how = 0; how < 3; how++) {
    char why[512];
    void *p = NULL;
    size_t n = 0;
    tpu_dcache_put(c, "key", 3, "0123456789", 10, why, sizeof why);
    damage(only_entry(dir), how);
    CHECK(tpu_dcache_get(c, "key", 3, &p, &n, why, sizeof why) == TPU_DC_CORRUPT && !p, "damage %d", how);
    CHECK(strstr(why, what[how]) != NULL, "damage %d why: %s", how, why);
    CHECK(count_entries(dir) == 0, "damaged entry removed");
    CHECK(tpu_dcache_get(c, "key", 3, &p, &n, why, sizeof why) == TPU_DC_MISS, "then a miss");
  }
  tpu_dcache_free(c);
}

static void test_eviction(void) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/evict", root);
  tpu_dcache *c = NULL;
  tpu_status_free(tpu_dcache_open(dir, 4 * (TPU_DC_HEADER_BYTES + 4 + 100), &c)); /* room for 4 entries */
  if (!c) return;
  char payload[100] = {0}, why[512], key[8];
  for (int i = 0; i < 6; i++) {
    snprintf(key, sizeof key, "k%03d", i);
    CHECK(tpu_dcache_put(c, key, 4, payload, sizeof payload, why, sizeof why) == 0, "put %d", i);
    /* distinct mtimes for the age order */
    char path[600];
    struct timespec ts[2] = {{1000 + i, 0}, {1000 + i, 0}};
    snprintf(path, sizeof path, "%s", dir);
    (void)path;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (!strstr(e->d_name, ".xc")) continue;
      char p[600];
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      struct stat st;
      if (stat(p, &st) == 0 && st.st_mtime > 100000) utimensat(AT_FDCWD, p, ts, 0);
    }
    if (d) closedir(d);
  }
  CHECK(tpu_dcache_size(c) <= 4 * (TPU_DC_HEADER_BYTES + 4 + 100), "under the limit: %lld",
        (long long)tpu_dcache_size(c));
  void *p = NULL;
  size_t n = 0;
  CHECK(tpu_dcache_get(c, "k005", 4, &p, &n, why, sizeof why) == TPU_DC_HIT, "newest kept");
  free(p);
  CHECK(tpu_dcache_get(c, "k000", 4, &p, &n, why, sizeof why) == TPU_DC_MISS, "oldest evicted");
  tpu_dcache_free(c);
  rm_entries(dir);
}

/* The folder's size is scanned once per TPU_DC_RESCAN (256) writes, not on
 * each: entries another process wrote (here: files made directly) count at
 * the next scan, which evicts the oldest down to 90% of the limit. */
static void test_eviction_of_other_writers(void) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/others", root);
  const int64_t entry = TPU_DC_HEADER_BYTES + 5 + 100, limit = 300 * entry;
  tpu_dcache *c = NULL;
  tpu_status_free(tpu_dcache_open(dir, limit, &c));
  if (!c) return;
  char payload[100] = {0}, why[512], key[8];
  CHECK(tpu_dcache_put(c, "first", 5, payload, sizeof payload, why, sizeof why) == 0, "first put (scans)");
  /* another writer: 400 entries' worth of bytes in old files */
  for (int i = 0; i < 4; i++) {
    char p[600];
    snprintf(p, sizeof p, "%s/other%d.xc", dir, i);
    FILE *f = fopen(p, "wb");
    static char big[100 * (TPU_DC_HEADER_BYTES + 5 + 100)];
    if (f) {
      fwrite(big, 1, sizeof big, f);
      fclose(f);
    }
    struct timespec ts[2] = {{500 + i, 0}, {500 + i, 0}};
    utimensat(AT_FDCWD, p, ts, 0);
  }
  CHECK(tpu_dcache_size(c) > limit, "over the limit by others' files: %lld", (long long)tpu_dcache_size(c));
  for (int i = 0; i < 256; i++) {
    snprintf(key, sizeof key, "n%04d", i);
    tpu_dcache_put(c, key, 5, payload, sizeof payload, why, sizeof why);
  }
  CHECK(tpu_dcache_size(c) <= limit, "evicted at the rescan: %lld", (long long)tpu_dcache_size(c));
  void *p = NULL;
  size_t n = 0;
  CHECK(tpu_dcache_get(c, "n0255", 5, &p, &n, why, sizeof why) == TPU_DC_HIT, "newest kept");
  free(p);
  tpu_dcache_free(c);
  rm_entries(dir);
}

static void test_unusable_folder(void) {
  char file[300], dir[400];
  snprintf(file, sizeof file, "%s/plain-file", root);
  FILE *f = fopen(file, "w");
  if (f) fclose(f);
  snprintf(dir, sizeof dir, "%s/sub", file);
  tpu_dcache *c = NULL;
  tpu_status *s = tpu_dcache_open(dir, 0, &c);
  CHECK(s && !c, "a folder under a file cannot be used");
  CHECK(s && strstr(tpu_status_message(s), "cannot use"), "message: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  s = tpu_dcache_open("", 0, &c);
  CHECK(s && !c, "empty path");
  tpu_status_free(s);
  tpu_dcache_free(NULL);
  unlink(file);
}

static void hex(const uint8_t *d, char *out) {
  for (int i = 0; i < TPU_SHA256_BYTES; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* FIPS 180-4 examples (and the empty message), RFC 4231 HMAC cases 1-4, 6, 7. */
static void test_sha256_vectors(void) {
  uint8_t d[TPU_SHA256_BYTES];
  char h[2 * TPU_SHA256_BYTES + 1];
  static const struct {
    const char *msg, *want;
  } sha[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  for (size_t i = 0; i < sizeof sha / sizeof sha[0]; i++) {
    tpu_sha256(sha[i].msg, strlen(sha[i].msg), d);
    hex(d, h);
    CHECK(strcmp(h, sha[i].want) == 0, "sha256 vector %zu: %s", i, h);
  }
  /* a million 'a', fed in uneven pieces (the partial-block paths) */
  static char a[1000];
  memset(a, 'a', sizeof a);
  tpu_sha256_ctx s;
  tpu_sha256_init(&s);
  size_t fed = 0;
  for (size_t step = 1; fed < 1000000; step = step % 990 + 7) {
    size_t n = step < 1000000 - fed ? step : 1000000 - fed;
    tpu_sha256_update(&s, a, n);
    fed += n;
  }
  tpu_sha256_final(&s, d);
  hex(d, h);
  CHECK(strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0, "million a: %s", h);

  uint8_t k1[20], k3[20], k4[25], k6[131], d3[50], d4[50];
  memset(k1, 0x0b, sizeof k1);
  memset(k3, 0xaa, sizeof k3);
  for (int i = 0; i < 25; i++) k4[i] = (uint8_t)(i + 1);
  memset(k6, 0xaa, sizeof k6);
  memset(d3, 0xdd, sizeof d3);
  memset(d4, 0xcd, sizeof d4);
  static const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  static const char *m7 =
      "This is a test using a larger than block-size key and a larger than block-size data. The "
      "key needs to be hashed before being used by the HMAC algorithm.";
  const struct {
    const void *key;
    size_t keylen;
    const void *msg;
    size_t len;
    const char *want;
  } mac[] = {
      {k1, sizeof k1, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", 4, "what do ya want for nothing?", 28,
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {k3, sizeof k3, d3, sizeof d3, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {k4, sizeof k4, d4, sizeof d4, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {k6, sizeof k6, m6, strlen(m6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {k6, sizeof k6, m7, strlen(m7), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t i = 0; i < sizeof mac / sizeof mac[0]; i++) {
    tpu_hmac_sha256_of(mac[i].key, mac[i].keylen, mac[i].msg, mac[i].len, d);
    hex(d, h);
    CHECK(strcmp(h, mac[i].want) == 0, "hmac vector %zu: %s", i, h);
  }
  CHECK(tpu_equal_ct("abcd", "abcd", 4) && !tpu_equal_ct("abcd", "abce", 4), "constant-time compare");
}

static unsigned mode_of(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 ? (unsigned)(st.st_mode & 07777) : 01000000;
}

/* A cache made under umask 000: folders 0700, entries and the key 0600. */
static void test_modes_under_umask_000(void) {
  char dir[300], parent[300], key[400];
  snprintf(parent, sizeof parent, "%s/umask", root);
  snprintf(dir, sizeof dir, "%s/umask/cache", root);
  snprintf(key, sizeof key, "%s/hmac.key", dir);
  mode_t old = umask(0);
  tpu_dcache *c = NULL;
  tpu_status *s = tpu_dcache_open(dir, 0, &c);
  CHECK(!s && c, "open: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  char why[512];
  if (c) CHECK(tpu_dcache_put(c, "k", 1, "p", 1, why, sizeof why) == 0, "put: %s", why);
  umask(old);
  CHECK(mode_of(dir) == 0700, "folder mode %o", mode_of(dir));
  CHECK(mode_of(parent) == 0700, "parent mode %o", mode_of(parent));
  CHECK(mode_of(key) == 0600, "key file mode %o", mode_of(key));
  CHECK(mode_of(only_entry(dir)) == 0600, "entry mode %o", mode_of(only_entry(dir)));
  tpu_dcache_free(c);
}

/* Opens dir, expecting a refusal whose message holds `what`. */
static void expect_refused(const char *dir, const char *what, const char *label) {
  tpu_dcache *c = NULL;
  tpu_status *s = tpu_dcache_open(dir, 0, &c);
  CHECK(s && !c, "%s: refused", label);
  CHECK(s && strstr(tpu_status_message(s), what), "%s: message: %s", label, s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  tpu_dcache_free(c);
}

static void test_untrusted_folders(void) {
  char dir[300], key[400];
  snprintf(dir, sizeof dir, "%s/folder", root);
  snprintf(key, sizeof key, "%s/hmac.key", dir);
  tpu_dcache *c = NULL;
  tpu_status_free(tpu_dcache_open(dir, 0, &c));
  CHECK(c != NULL, "made");
  tpu_dcache_free(c);
  chmod(dir, 0777);
  expect_refused(dir, "writable by group or others (mode 0777)", "0777 folder");
  chmod(dir, 0770);
  expect_refused(dir, "writable by group or others", "0770 folder");
  chmod(dir, 0755); /* readable by others is the user's choice: opens */
  c = NULL;
  tpu_status *s = tpu_dcache_open(dir, 0, &c);
  CHECK(!s && c, "0755 folder opens: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  tpu_dcache_free(c);
  /* the key file must be private, whole, and not a link */
  chmod(key, 0640);
  expect_refused(dir, "readable by group or others", "key file 0640");
  chmod(key, 0600);
  truncate(key, 16);
  expect_refused(dir, "not 32 bytes long", "short key file");
  unlink(key);
  CHECK(symlink("/dev/null", key) == 0, "symlink");
  expect_refused(dir, "symbolic link", "key file a link");
  unlink(key);
  if (geteuid() == 0) { /* only root can give a file away */
    CHECK(chown(dir, 65534, 65534) == 0, "chown");
    expect_refused(dir, "owned by another user (uid 65534", "foreign folder");
    CHECK(chown(dir, 0, 0) == 0, "chown back");
    c = NULL;
    tpu_status_free(tpu_dcache_open(dir, 0, &c)); /* a new key */
    CHECK(c != NULL, "own folder again");
    tpu_dcache_free(c);
    CHECK(chown(key, 65534, 65534) == 0, "chown key");
    expect_refused(dir, "owned by another user", "foreign key file");
    CHECK(chown(key, 0, 0) == 0, "chown key back");
  } else {
    printf("skip: foreign owners (needs root to give files away)\n");
  }
  /* a folder that is a symbolic link to one's own folder is that folder */
  char link[400];
  snprintf(link, sizeof link, "%s/link", root);
  CHECK(symlink(dir, link) == 0, "symlink folder");
  c = NULL;
  s = tpu_dcache_open(link, 0, &c);
  CHECK(!s && c, "a link to our folder opens: %s", s ? tpu_status_message(s) : "");
  tpu_status_free(s);
  tpu_dcache_free(c);
  unlink(link);
}

/* Writes `len` bytes as the file at path (mode 0600). */
static void write_file(const char *path, const void *p, size_t len) {
  unlink(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0 && write(fd, p, len) == (ssize_t)len, "write %s", path);
  if (fd >= 0) close(fd);
}

static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  *n = 0;
  if (!f) return NULL;
  static uint8_t buf[1 << 16];
  *n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  return buf;
}

/* The path of the entry of key in dir (the FNV-1a of the key names it). */
static void entry_path(const char *dir, const char *key, char *out, size_t n) {
  snprintf(out, n, "%s/%016llx.xc", dir, (unsigned long long)tpu_fnv1a(TPU_FNV_BASIS, key, strlen(key)));
}

static void test_untrusted_entries(void) {
  char dir[300], other[300], a[500], b[500], why[512];
  snprintf(dir, sizeof dir, "%s/entries", root);
  snprintf(other, sizeof other, "%s/someone-else", root);
  tpu_dcache *c = NULL, *o = NULL;
  tpu_status_free(tpu_dcache_open(dir, 0, &c));
  tpu_status_free(tpu_dcache_open(other, 0, &o));
  CHECK(c && o, "open");
  if (!c || !o) goto done;
  void *p = NULL;
  size_t n = 0;
  const char *pa = "program A (neg)", *pb = "program B (abs): longer";
  CHECK(tpu_dcache_put(c, "key-A", 5, pa, strlen(pa), why, sizeof why) == 0, "put A");
  CHECK(tpu_dcache_put(c, "key-B", 5, pb, strlen(pb), why, sizeof why) == 0, "put B");
  entry_path(dir, "key-A", a, sizeof a);
  entry_path(dir, "key-B", b, sizeof b);

  /* the attack: A's key with B's payload, lengths and checksum
   * rewritten so that only the MAC can tell */
  size_t na, nb;
  uint8_t ea[4096], eb[4096];
  const uint8_t *got = slurp(a, &na);
  memcpy(ea, got, na);
  got = slurp(b, &nb);
  memcpy(eb, got, nb);
  CHECK(na > TPU_DC_HEADER_BYTES + 5 && nb > na, "entries read");
  const size_t H = TPU_DC_HEADER_BYTES;
  uint8_t forged[4096];
  size_t kl = 5, pl = nb - H - kl;
  memcpy(forged, ea, H + kl);
  for (int i = 0; i < 8; i++) forged[16 + i] = (uint8_t)((uint64_t)pl >> (8 * i));
  memcpy(forged + H + kl, eb + H + kl, pl);
  uint64_t sum = tpu_fnv1a(TPU_FNV_BASIS, forged + H, kl + pl);
  for (int i = 0; i < 8; i++) forged[24 + i] = (uint8_t)(sum >> (8 * i));
  for (int mac_from = 0; mac_from < 2; mac_from++) { /* A's MAC, then B's */
    memcpy(forged + 32, (mac_from ? eb : ea) + 32, 32);
    write_file(a, forged, H + kl + pl);
    tpu_dc_result r = tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why);
    CHECK(r == TPU_DC_REFUSED && !p, "swapped payload refused (%d)", (int)r);
    CHECK(strstr(why, "tampered or foreign entry"), "why: %s", why);
    CHECK(access(a, F_OK) == 0, "a refused entry is left alone");
  }
  /* an entry made whole by another folder's key (someone else's cache) */
  CHECK(tpu_dcache_put(o, "key-A", 5, pb, strlen(pb), why, sizeof why) == 0, "put in the other folder");
  char oa[500];
  entry_path(other, "key-A", oa, sizeof oa);
  uint8_t *foreign = slurp(oa, &n);
  write_file(a, foreign, n);
  CHECK(tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why) == TPU_DC_REFUSED && !p, "other folder's entry");
  CHECK(strstr(why, "tampered or foreign entry"), "why: %s", why);
  /* the next put replaces a refused entry; a good entry loads */
  CHECK(tpu_dcache_put(c, "key-A", 5, pa, strlen(pa), why, sizeof why) == 0, "put A again");
  CHECK(
      tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why) == TPU_DC_HIT && n == strlen(pa) && memcmp(p, pa, n) == 0,
      "good entry loads");
  free(p);
  p = NULL;

  /* modes and owners of entries */
  chmod(a, 0666);
  CHECK(tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why) == TPU_DC_REFUSED && !p, "0666 entry refused");
  CHECK(strstr(why, "writable by group or others (mode 0666)"), "why: %s", why);
  chmod(a, 0620);
  CHECK(tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why) == TPU_DC_REFUSED, "0620 entry refused");
  chmod(a, 0644);
  CHECK(tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why) == TPU_DC_HIT, "0644 entry loads");
  free(p);
  p = NULL;
  if (geteuid() == 0) {
    CHECK(chown(a, 65534, 65534) == 0, "chown");
    CHECK(tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why) == TPU_DC_REFUSED && !p, "foreign entry refused");
    CHECK(strstr(why, "owned by another user"), "why: %s", why);
    CHECK(access(a, F_OK) == 0, "another user's entry is not removed");
    CHECK(chown(a, 0, 0) == 0, "chown back");
  }
  /* a symbolic link, even to a good entry of ours */
  unlink(a);
  CHECK(symlink(b, a) == 0, "symlink");
  CHECK(tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why) == TPU_DC_REFUSED && !p, "link refused");
  CHECK(strstr(why, "symbolic link"), "why: %s", why);
  unlink(a);
  /* an entry of the earlier format is a plain miss, with nothing to report */
  uint8_t v1[64] = {'T', 'P', 'U', 'X', 'C', 1, 0, 0};
  write_file(a, v1, sizeof v1);
  CHECK(tpu_dcache_get(c, "key-A", 5, &p, &n, why, sizeof why) == TPU_DC_MISS && !p && !why[0], "old format");
  /* a new key file (the old one lost) makes earlier entries untrusted */
  tpu_dcache_free(c);
  char key[400];
  snprintf(key, sizeof key, "%s/hmac.key", dir);
  unlink(key);
  c = NULL;
  tpu_status_free(tpu_dcache_open(dir, 0, &c));
  CHECK(c && tpu_dcache_get(c, "key-B", 5, &p, &n, why, sizeof why) == TPU_DC_REFUSED, "new key");
done:
  tpu_dcache_free(c);
  tpu_dcache_free(o);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/torchtpu-test-cache-XXXXXX");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  test_round_trip();
  test_damaged();
  test_eviction();
  test_eviction_of_other_writers();
  test_unusable_folder();
  test_sha256_vectors();
  test_modes_under_umask_000();
  test_untrusted_folders();
  test_untrusted_entries();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
