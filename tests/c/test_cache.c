/* test_cache.c: the disk tier of the compilation cache (csrc/cache), on a
 * temporary folder: round trips, keys that share a file name, damaged files
 * (removed and reported), eviction by size and age, and a folder that
 * cannot be created. The last line is "N passed, M failed". */
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
  CHECK(tpu_dcache_size(c) == 32 + 2 + 3, "size %lld", (long long)tpu_dcache_size(c));
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
  tpu_status_free(tpu_dcache_open(dir, 4 * (32 + 4 + 100), &c)); /* room for 4 entries */
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
  CHECK(tpu_dcache_size(c) <= 4 * (32 + 4 + 100), "under the limit: %lld", (long long)tpu_dcache_size(c));
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
  const int64_t entry = 32 + 5 + 100, limit = 300 * entry;
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
    static char big[100 * 137];
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
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
