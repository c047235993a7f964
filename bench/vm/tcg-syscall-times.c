/*
 * tcg-syscall-times: a QEMU TCG plugin (plugin API version 1, QEMU 7.2) that timestamps, in the
 * host's CLOCK_MONOTONIC, every user-mode `syscall` instruction the guest executes and the
 * user block it returns to, so the time a round trip spends inside each system call (e.g. a
 * verbs doorbell `write`, in which rxe does all of its work) and between them can be read per
 * vCPU, with far less overhead than tcg-count's per-access callbacks (bench/README.md).
 *
 * As tcg-count: recording runs between the files on.LABEL and off.LABEL that the guest creates
 * in DIR; at off.LABEL the window is written to PROF.LABEL.ts, one event per line:
 *   vcpu host-ns pc
 * pc (hex) is the address after the `syscall` instruction; bit 63 set marks the entry (the
 * block ending in `syscall` ran), clear marks the return (the block at that address ran).
 * Map pcs to libraries with /proc/PID/maps read in the guest during the window. A return is
 * seen only when its block is translated after the `syscall` block, which is the normal case.
 *
 * trace=N also stamps the first N user blocks each vCPU runs after every system call return
 * (bit 62 set on their pc): the user path from one system call to the next, block by block
 * (e.g. from the clock read to the doorbell `write` of a ping-pong). Every user block then
 * carries a callback, which slows user code about twofold: read block lists and counts from
 * such a run, and durations only relative to each other.
 *
 * Build: gcc -O2 -shared -fPIC -fvisibility=hidden -o tcg-syscall-times.so bench/vm/tcg-syscall-times.c -lpthread
 * Run:   testbed/rxe-vm.sh --accel tcg --plugin ./tcg-syscall-times.so,dir=DIR,prof=PROF ...
 * A diagnostic tool, not part of the test suite.
 */
#include "tcg-plugin.h"
#include <time.h>

#define NV 16
#define RING (1u << 21) /* events per vCPU and window; later ones are dropped */
#define ENTRY (1ull << 63)
#define TRACED (1ull << 62)
struct event { uint64_t ns, pc; };
static struct event *ring[NV];
static unsigned ring_len[NV];
static volatile int enabled;
static const char *prof = "/tmp/tcg-syscall-times";
static unsigned trace_n;        /* trace=N */
static unsigned trace_left[NV]; /* blocks still to stamp after the last return, per vCPU */

/* Addresses right after a `syscall` instruction (return points): a lock-free read, locked insert. */
#define RS (1u << 16)
static uint64_t ret_pc[RS];
static pthread_mutex_t ret_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned slot(uint64_t a) { return (unsigned)((a * 0x9E3779B97F4A7C15ull) >> 48); }
static int is_return_point(uint64_t a) {
  for (unsigned n = 0, h = slot(a); n < 64; n++, h++) {
    uint64_t e = __atomic_load_n(&ret_pc[h & (RS - 1)], __ATOMIC_ACQUIRE);
    if (e == a) return 1;
    if (!e) return 0;
  }
  return 0;
}
static void add_return_point(uint64_t a) {
  pthread_mutex_lock(&ret_mu);
  for (unsigned n = 0, h = slot(a); n < 64; n++, h++) {
    uint64_t *e = &ret_pc[h & (RS - 1)];
    if (*e == a) break;
    if (!*e) { __atomic_store_n(e, a, __ATOMIC_RELEASE); break; }
  }
  pthread_mutex_unlock(&ret_mu);
}

static void on_exec(unsigned vcpu, void *udata) {
  if (!enabled || vcpu >= NV) return;
  unsigned i = ring_len[vcpu];
  if (i >= RING) return;
  struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
  ring[vcpu][i].ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  ring[vcpu][i].pc = (uint64_t)(uintptr_t)udata;
  ring_len[vcpu] = i + 1;
  if (!((uint64_t)(uintptr_t)udata & (ENTRY | TRACED))) trace_left[vcpu] = trace_n;
}
static void on_user_block(unsigned vcpu, void *udata) {
  if (!enabled || vcpu >= NV || !trace_left[vcpu]) return;
  trace_left[vcpu]--;
  on_exec(vcpu, (void *)((uintptr_t)udata | TRACED));
}
static void on_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  (void)id;
  uint64_t va = qemu_plugin_tb_vaddr(tb);
  if (va >= 0xffff800000000000ull) return; /* kernel */
  struct qemu_plugin_insn *last = qemu_plugin_tb_get_insn(tb, qemu_plugin_tb_n_insns(tb) - 1);
  const uint8_t *b = qemu_plugin_insn_data(last); size_t n = qemu_plugin_insn_size(last);
  if (n >= 2 && b[n - 2] == 0x0F && b[n - 1] == 0x05) {
    uint64_t after = qemu_plugin_insn_vaddr(last) + n;
    add_return_point(after);
    qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, CB_NO_REGS, (void *)(uintptr_t)(after | ENTRY));
  }
  if (is_return_point(va)) qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, CB_NO_REGS, (void *)(uintptr_t)va);
  else if (trace_n) qemu_plugin_register_vcpu_tb_exec_cb(tb, on_user_block, CB_NO_REGS, (void *)(uintptr_t)va);
}
static void window_open(void) {
  enabled = 0; usleep(2000);
  for (int v = 0; v < NV; v++) ring_len[v] = trace_left[v] = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST); enabled = 1;
}
static void window_close(const char *label) {
  enabled = 0; usleep(2000);
  char pn[512]; snprintf(pn, sizeof pn, "%s.%s.ts", prof, label);
  FILE *f = fopen(pn, "w"); if (!f) return;
  for (int v = 0; v < NV; v++)
    for (unsigned i = 0; i < ring_len[v]; i++)
      fprintf(f, "%d %lu %lx\n", v, (unsigned long)ring[v][i].ns, (unsigned long)ring[v][i].pc);
  fclose(f);
}
static struct window_hooks hooks = { .dir = "/tmp/tcg-syscall-times", .open = window_open, .close = window_close };

__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
  (void)info;
  for (int i = 0; i < argc; i++) {
    if (!strncmp(argv[i], "dir=", 4)) hooks.dir = argv[i] + 4;
    else if (!strncmp(argv[i], "prof=", 5)) prof = argv[i] + 5;
    else if (!strncmp(argv[i], "trace=", 6)) trace_n = (unsigned)strtoul(argv[i] + 6, NULL, 10);
  }
  for (int v = 0; v < NV; v++)
    if (!(ring[v] = malloc(sizeof(struct event) * RING))) return -1;
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_trans);
  window_start(&hooks);
  return 0;
}
