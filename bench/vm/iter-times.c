/*
 * iter-times: an LD_PRELOAD shim that timestamps, with the time-stamp counter, what a ping-pong
 * process does once per iteration, the same way for ucx_perftest and rucx-perftest, so their
 * iterations can be compared at sub-microsecond resolution inside the soft-RoCE VM (where
 * both tools' own per-iteration clock is a system call, and UCX's only has microseconds).
 * A diagnostic tool, not part of the test suite (bench/README.md).
 *
 * Recorded, in the order they happen (one 16-byte record each: u64 tsc, u32 kind, u32 arg):
 *   kind 0  a clock read returned: clock_gettime(CLOCK_MONOTONIC or CLOCK_REALTIME) or
 *           gettimeofday (the perftests' per-iteration clocks); its value also goes to a
 *           second file, so tsc ticks can be converted to nanoseconds
 *   kind 1  write() entered (arg = fd): the verbs doorbell of soft-RoCE's post_send
 *   kind 2  write() returned (arg = fd)
 *   kind 3  pthread_spin_lock() entered (arg = a small id per lock): librxe takes its CQ and
 *           QP locks in poll_cq and post_send, so these mark CQ polls and the start of a post
 *   kind 4  pthread_spin_unlock() returned (arg = the lock's id)
 *   kind 5  rucx_mark(id) was called (for temporarily instrumented builds)
 * At exit the records go to $ITER_TIMES_DIR/$ITER_TIMES_TAG.PID.ev and the clock values (one
 * i64 nanosecond value per kind-0 record) to $ITER_TIMES_DIR/$ITER_TIMES_TAG.PID.clk.
 * bench/vm/iter-times.py reads them.
 *
 * Build: gcc -O2 -shared -fPIC -o iter-times.so bench/vm/iter-times.c -ldl
 * Run:   ITER_TIMES_DIR=/tmp/out ITER_TIMES_TAG=rucx.1.cli LD_PRELOAD=./iter-times.so rucx-perftest ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define N (1u << 22) /* records per process; later ones are dropped */
struct rec { unsigned long long tsc; unsigned kind, arg; };
static struct rec recs[N];
static unsigned nrec;
static long long clk[N / 4];
static unsigned nclk;
static void *locks[64];
static unsigned nlocks;

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static int (*real_gettimeofday)(struct timeval *, void *);
static ssize_t (*real_write)(int, const void *, size_t);
static int (*real_lock)(pthread_spinlock_t *);
static int (*real_unlock)(pthread_spinlock_t *);

static inline void put(unsigned kind, unsigned arg) {
  if (nrec < N) recs[nrec++] = (struct rec){__rdtsc(), kind, arg};
}
static inline void put_clock(long long ns) {
  put(0, 0);
  if (nclk < N / 4) clk[nclk++] = ns;
}
/* single-threaded use (the perftests' measuring thread); a lock's id is its first-seen order */
static unsigned lock_id(void *p) {
  for (unsigned i = 0; i < nlocks; i++)
    if (locks[i] == p) return i;
  if (nlocks < 64) { locks[nlocks] = p; return nlocks++; }
  return 63;
}

int clock_gettime(clockid_t c, struct timespec *t) {
  if (!real_clock_gettime) real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
  int r = real_clock_gettime(c, t);
  if (c == CLOCK_MONOTONIC || c == CLOCK_REALTIME) put_clock(t->tv_sec * 1000000000LL + t->tv_nsec);
  return r;
}
int gettimeofday(struct timeval *tv, void *tz) {
  if (!real_gettimeofday) real_gettimeofday = dlsym(RTLD_NEXT, "gettimeofday");
  int r = real_gettimeofday(tv, tz);
  put_clock((tv->tv_sec * 1000000LL + tv->tv_usec) * 1000LL);
  return r;
}
ssize_t write(int fd, const void *b, size_t l) {
  if (!real_write) real_write = dlsym(RTLD_NEXT, "write");
  put(1, (unsigned)fd);
  ssize_t r = real_write(fd, b, l);
  put(2, (unsigned)fd);
  return r;
}
int pthread_spin_lock(pthread_spinlock_t *l) {
  if (!real_lock) real_lock = dlsym(RTLD_NEXT, "pthread_spin_lock");
  put(3, lock_id((void *)l));
  return real_lock(l);
}
int pthread_spin_unlock(pthread_spinlock_t *l) {
  if (!real_unlock) real_unlock = dlsym(RTLD_NEXT, "pthread_spin_unlock");
  int r = real_unlock(l);
  put(4, lock_id((void *)l));
  return r;
}
void rucx_mark(unsigned id) { put(5, id); }

static void dump(const char *suffix, const void *p, size_t size, size_t n) {
  const char *d = getenv("ITER_TIMES_DIR"), *tag = getenv("ITER_TIMES_TAG");
  char path[512];
  snprintf(path, sizeof path, "%s/%s.%d.%s", d, tag ? tag : "x", (int)getpid(), suffix);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fwrite(p, size, n, f);
  fclose(f);
}
static void __attribute__((destructor)) fin(void) {
  if (!getenv("ITER_TIMES_DIR") || !nrec) return;
  dump("ev", recs, sizeof recs[0], nrec);
  dump("clk", clk, sizeof clk[0], nclk);
}
