/*
 * tcg-count: a QEMU TCG plugin (plugin API version 1, QEMU 7.2) that counts what the emulator
 * executes for the guest, to compare two programs in the soft-RoCE VM by counts rather than by
 * noisy times (bench/README.md).
 *
 * Counting is off until the guest creates a file named on.LABEL in DIR (a directory shared with
 * the VM, e.g. by rxe-vm.sh --rw), and stops at off.LABEL; then one summary line per mode
 * (user, kernel) is appended to OUT, and every user-mode translation block executed in the
 * window is written to PROF.LABEL, one per line (hex):
 *   start end-of-last-insn, then decimal: insns kind executions entered-by-lookup
 *   kernel-entries kernel-blocks kernel-insns io-accesses jump-cache-misses
 * kind: 0 plain, 1 direct jump, 2 indirect (iret, call/jmp through a register or memory),
 * 3 system call or interrupt, 4 direct call, 5 return. "Entered by lookup": the previous block
 * on that vCPU ended in an indirect jump or return or started on another page, so TCG could
 * not chain the two blocks and went through its jump-cache lookup; "jump-cache misses": such
 * lookups (or returns from the kernel) that a model of TCG's per-vCPU jump cache says went on
 * to the global hash table. Kernel work (and I/O) is charged to the user block that entered
 * the kernel. Map the block addresses to libraries with /proc/PID/maps read in the guest
 * during the run. Start the processes with address-space randomization off (setarch -R): blocks
 * are keyed by address, and two processes' different libraries at one address would merge. For
 * per-iteration counts, subtract two windows of different iteration counts and divide by an
 * event counted once per iteration (e.g. the doorbell write's block): perftest warm-ups are
 * time-based, so the windows' iteration counts differ from the nominal ones.
 *
 * Two more files per window: PROF.LABEL.kernel, the kernel blocks (hex start, then decimal:
 * insns kind executions jump-cache-misses pause-insns lock-insns), to be mapped to functions
 * with the guest's /proc/kallsyms read in the same boot; and PROF.LABEL.calls, "caller callee
 * count" for every direct call between kernel blocks (caller = the calling block's start,
 * callee = the called function's first block) plus, when the guest has created a file named
 * watch.HEXADDR in DIR, one record per block executed in the 256 bytes from HEXADDR (e.g. the
 * kernel's __memset and memset_erms, whose `rep stosb` TCG runs one block per byte): the
 * calling blocks two and three levels down a shadow call stack, the first with bit 63
 * cleared. For memset reached from the slab allocator that is (allocator, allocation site).
 *
 * Build: gcc -O2 -shared -fPIC -fvisibility=hidden -o tcg-count.so bench/vm/tcg-count.c -lpthread
 * Run:   testbed/rxe-vm.sh --accel tcg --plugin ./tcg-count.so,dir=DIR,out=OUT,prof=PROF ...
 * A diagnostic tool: not part of the test suite. Counts from concurrently running vCPUs are
 * added without locks, so they may be off by a few.
 */
#include "tcg-plugin.h"

#define NV 16
enum { K_NONE, K_DIRECT, K_INDIRECT, K_SYS, K_CALL, K_RET };
struct tbinfo { struct tbinfo *next; uint64_t cnt, ncin, kentry, ktbs, kinsns, io, jcmiss; uint64_t vaddr, endv; uint32_t n; uint8_t kind; uint16_t lock, fence, pause, rdtsc, xchg, cpuid; };
enum { C_TB, C_INSN, C_NONCHAIN, C_XPAGE, C_IND, C_MODESW, C_LD, C_ST, C_IO, C_M256, C_M1024, C_LOCK, C_FENCE,
       C_PAUSE, C_RDTSC, C_XCHG, C_CPUID, C_DPG, C_CPG, C_JCMISS, C_N };
static const char *cname[C_N] = {"tbs","insns","nonchain","xpage","indirect","modesw","loads","stores","io",
  "tlbmiss256","tlbmiss1024","lock","fence","pause","rdtsc","xchgmem","cpuid","datapages","codepages","jcmiss"};
#define HS (1u << 16)
struct tlb { uint64_t m[1024]; uint64_t v[8]; unsigned vi; };
struct vst { uint64_t c[2][C_N]; struct tbinfo *prev, *lastuser; int mode; uint64_t stk[64]; int depth;
  struct tlb t256[2], t1024[2]; uint64_t set[HS]; uint64_t jc[4096]; } __attribute__((aligned(64)));
static struct vst *V;
static volatile int enabled;
static uint64_t translations;
static struct tbinfo *all; static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const char *prof = "/tmp/tcg-count.prof";
static const char *out = "/tmp/tcg-count.out";

static int sim(struct tlb *t, unsigned bits, uint64_t pg) {
  unsigned i = pg & ((1u << bits) - 1);
  if (t->m[i] == pg + 1) return 0;
  for (int k = 0; k < 8; k++) if (t->v[k] == pg + 1) { t->v[k] = t->m[i]; t->m[i] = pg + 1; return 0; }
  t->v[t->vi++ & 7] = t->m[i]; t->m[i] = pg + 1; return 1;
}
/* TCG's per-vCPU jump cache (QEMU 7.2, system mode): 4096 entries, 64 groups of 64 chosen by
 * address bits 12-23, the slot in a group by bits 0-11; a block entered by a lookup that misses
 * here goes to the global hash table. Returns 1 on a miss. */
static int jc_lookup(struct vst *s, uint64_t pc) {
  uint64_t t = pc ^ (pc >> 6);
  unsigned i = (unsigned)(((t >> 6) & 0xFC0) | (t & 0x3F));
  if (s->jc[i] == pc + 1) return 0;
  s->jc[i] = pc + 1;
  return 1;
}
/* Call edges: a lock-free open-addressing table; a racing insert may split one edge over two
 * slots, so readers add up equal pairs. */
#define ES (1u << 20)
static uint64_t ekey[ES][2]; static uint64_t ecnt[ES];
static volatile uint64_t watch_lo, watch_hi;
static void edge(uint64_t from, uint64_t to) {
  uint64_t h = ((from * 0x9E3779B97F4A7C15ull) ^ (to * 0xC2B2AE3D27D4EB4Full)) >> 44;
  for (unsigned n = 0; n < 64; n++, h++) {
    unsigned i = h & (ES - 1);
    uint64_t f = __atomic_load_n(&ekey[i][0], __ATOMIC_ACQUIRE);
    if (f == 0) {
      uint64_t z = 0;
      if (__atomic_compare_exchange_n(&ekey[i][0], &z, from, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&ekey[i][1], to, __ATOMIC_RELEASE); __atomic_fetch_add(&ecnt[i], 1, __ATOMIC_RELAXED); return; }
      f = z;
    }
    if (f == from && __atomic_load_n(&ekey[i][1], __ATOMIC_ACQUIRE) == to) { __atomic_fetch_add(&ecnt[i], 1, __ATOMIC_RELAXED); return; }
  }
}
/* Distinct pages per window; a full set stops counting new ones rather than probe forever. */
static int touch(struct vst *s, uint64_t key) {
  uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 48;
  for (unsigned n = 0; n < HS; n++, h++) {
    uint64_t *e = &s->set[h & (HS - 1)];
    if (*e == key + 1) return 0;
    if (!*e) { *e = key + 1; return 1; }
  }
  return 0;
}
static void on_mem(unsigned vcpu, qemu_plugin_meminfo_t info, uint64_t va, void *u) {
  (void)u; if (!enabled || vcpu >= NV) return;
  struct vst *s = &V[vcpu]; int m = s->mode; uint64_t pg = va >> 12;
  s->c[m][qemu_plugin_mem_is_store(info) ? C_ST : C_LD]++;
  struct qemu_plugin_hwaddr *h = qemu_plugin_get_hwaddr(info, va);
  if (h && qemu_plugin_hwaddr_is_io(h)) { s->c[m][C_IO]++; struct tbinfo *o = m ? s->lastuser : s->prev; if (o) __atomic_fetch_add(&o->io, 1, __ATOMIC_RELAXED); }
  s->c[m][C_M256] += sim(&s->t256[m], 8, pg);
  s->c[m][C_M1024] += sim(&s->t1024[m], 10, pg);
  s->c[m][C_DPG] += touch(s, (pg << 2) | (uint64_t)m);
}
static void on_tb(unsigned vcpu, void *u) {
  if (!enabled || vcpu >= NV) return;
  struct tbinfo *t = u; struct vst *s = &V[vcpu];
  int m = t->vaddr >= 0xffff800000000000ull; uint64_t *c = s->c[m];
  __atomic_fetch_add((uint64_t *)&t->cnt, 1, __ATOMIC_RELAXED);
  c[C_TB]++; c[C_INSN] += t->n; c[C_LOCK] += t->lock; c[C_FENCE] += t->fence; c[C_PAUSE] += t->pause;
  c[C_RDTSC] += t->rdtsc; c[C_XCHG] += t->xchg; c[C_CPUID] += t->cpuid;
  struct tbinfo *p = s->prev;
  if (p) {
    int pm = p->vaddr >= 0xffff800000000000ull;
    int lookup = pm != m || p->kind == K_INDIRECT || p->kind == K_SYS || p->kind == K_RET || ((p->vaddr ^ t->vaddr) >> 12);
    if (lookup && jc_lookup(s, t->vaddr)) { c[C_JCMISS]++; __atomic_fetch_add(&t->jcmiss, 1, __ATOMIC_RELAXED); }
    if (pm != m) { c[C_MODESW]++; if (!pm) { s->lastuser = p; __atomic_fetch_add(&p->kentry, 1, __ATOMIC_RELAXED); } else s->lastuser = NULL; }
    else if (p->kind == K_INDIRECT || p->kind == K_SYS || p->kind == K_RET) { c[C_NONCHAIN]++; c[C_IND]++; __atomic_fetch_add((uint64_t *)&t->ncin, 1, __ATOMIC_RELAXED); }
    else if ((p->vaddr ^ t->vaddr) >> 12) { c[C_NONCHAIN]++; c[C_XPAGE]++; __atomic_fetch_add((uint64_t *)&t->ncin, 1, __ATOMIC_RELAXED); }
  }
  if (m && s->lastuser) { __atomic_fetch_add(&s->lastuser->ktbs, 1, __ATOMIC_RELAXED); __atomic_fetch_add(&s->lastuser->kinsns, t->n, __ATOMIC_RELAXED); }
  /* A shadow call stack of kernel calls (reset at each kernel entry), for the watch records. */
  if (m && (!p || p->vaddr < 0xffff800000000000ull)) s->depth = 0;
  if (m && p && p->kind == K_CALL && p->vaddr >= 0xffff800000000000ull) {
    edge(p->vaddr, t->vaddr);
    if (s->depth < 64) s->stk[s->depth] = p->vaddr;
    s->depth++;
  } else if (m && p && p->kind == K_RET && s->depth > 0) s->depth--;
  if (m && t->vaddr >= watch_lo && t->vaddr < watch_hi) {
    /* A block of the watched range: charged to the two calls below the innermost one (for
     * memset, reached by a tail jump from the allocator's helper: the allocator's caller and
     * its caller), marked by bit 63 cleared. */
    int d = s->depth < 64 ? s->depth : 64;
    uint64_t c2 = d >= 2 ? s->stk[d - 2] : 0, c3 = d >= 3 ? s->stk[d - 3] : 0;
    edge(c2 & ~(1ull << 63), c3);
  }
  s->prev = t; s->mode = m;
  c[C_CPG] += touch(s, ((t->vaddr >> 12) << 2) | 2 | (uint64_t)m);
  if ((t->endv ^ t->vaddr) >> 12) c[C_CPG] += touch(s, ((t->endv >> 12) << 2) | 2 | (uint64_t)m);
}
static void classify(const uint8_t *b, size_t n, struct tbinfo *t, uint8_t *kind) {
  size_t i = 0; int lock = 0, rep = 0;
  while (i < n && (b[i] == 0xF0 || b[i] == 0xF2 || b[i] == 0xF3 || b[i] == 0x2E || b[i] == 0x36 || b[i] == 0x3E ||
                   b[i] == 0x26 || b[i] == 0x64 || b[i] == 0x65 || b[i] == 0x66 || b[i] == 0x67)) {
    lock |= b[i] == 0xF0; rep |= b[i] == 0xF3; i++; }
  if (i < n && (b[i] & 0xF0) == 0x40) i++;
  *kind = K_NONE; if (i >= n) return;
  uint8_t op = b[i]; uint8_t nx = i + 1 < n ? b[i + 1] : 0; uint8_t nx2 = i + 2 < n ? b[i + 2] : 0;
  t->lock += lock;
  if (op == 0xC3 || op == 0xC2) *kind = K_RET;
  else if (op == 0xCF) *kind = K_INDIRECT;
  else if (op == 0xFF && ((nx >> 3) & 7) >= 2 && ((nx >> 3) & 7) <= 5) *kind = K_INDIRECT;
  else if (op == 0xE8) *kind = K_CALL;
  else if (op == 0xE9 || op == 0xEB || (op >= 0x70 && op <= 0x7F) || (op >= 0xE0 && op <= 0xE3)) *kind = K_DIRECT;
  else if (op == 0xCD || op == 0xCC) *kind = K_SYS;
  else if (op == 0x90 && rep) t->pause++;
  else if ((op == 0x86 || op == 0x87) && (nx >> 6) != 3) t->xchg++;
  else if (op == 0x0F) {
    if (nx >= 0x80 && nx <= 0x8F) *kind = K_DIRECT;
    else if (nx == 0x05 || nx == 0x07 || nx == 0x34 || nx == 0x35) *kind = K_SYS;
    else if (nx == 0x31) t->rdtsc++;
    else if (nx == 0x01 && nx2 == 0xF9) t->rdtsc++;
    else if (nx == 0xA2) t->cpuid++;
    else if (nx == 0xAE && (nx2 == 0xF0 || nx2 == 0xE8 || nx2 == 0xF8)) t->fence++;
  }
}
static void on_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  (void)id; size_t n = qemu_plugin_tb_n_insns(tb);
  struct tbinfo *t = calloc(1, sizeof *t);
  t->vaddr = qemu_plugin_tb_vaddr(tb); t->n = n;
  if (enabled) __atomic_fetch_add(&translations, 1, __ATOMIC_RELAXED);
  for (size_t i = 0; i < n; i++) {
    struct qemu_plugin_insn *in = qemu_plugin_tb_get_insn(tb, i);
    uint8_t k; classify(qemu_plugin_insn_data(in), qemu_plugin_insn_size(in), t, &k);
    if (i == n - 1) { t->kind = k; t->endv = qemu_plugin_insn_vaddr(in) + qemu_plugin_insn_size(in) - 1; }
    qemu_plugin_register_vcpu_mem_cb(in, on_mem, CB_NO_REGS, MEM_RW, NULL);
  }
  pthread_mutex_lock(&mu); t->next = all; all = t; pthread_mutex_unlock(&mu);
  qemu_plugin_register_vcpu_tb_exec_cb(tb, on_tb, CB_NO_REGS, t);
}
static void report(const char *label) {
  FILE *f = fopen(out, "a"); if (!f) return;
  for (int m = 0; m < 2; m++) {
    fprintf(f, "%s %s", label, m ? "kernel" : "user");
    for (int k = 0; k < C_N; k++) { uint64_t s = 0; for (int v = 0; v < NV; v++) s += V[v].c[m][k]; fprintf(f, " %s=%lu", cname[k], (unsigned long)s); }
    fprintf(f, "\n");
  }
  fprintf(f, "%s translations=%lu\n", label, (unsigned long)translations);
  fclose(f);
  char pn[512]; snprintf(pn, sizeof pn, "%s.%s", prof, label);
  FILE *p = fopen(pn, "w"); if (!p) return;
  pthread_mutex_lock(&mu);
  for (struct tbinfo *t = all; t; t = t->next) if (t->cnt && t->vaddr < 0xffff800000000000ull)
    fprintf(p, "%lx %lx %u %u %lu %lu %lu %lu %lu %lu %lu\n", (unsigned long)t->vaddr, (unsigned long)t->endv, t->n, t->kind, (unsigned long)t->cnt, (unsigned long)t->ncin, (unsigned long)t->kentry, (unsigned long)t->ktbs, (unsigned long)t->kinsns, (unsigned long)t->io, (unsigned long)t->jcmiss);
  pthread_mutex_unlock(&mu); fclose(p);
  snprintf(pn, sizeof pn, "%s.%s.calls", prof, label);
  p = fopen(pn, "w");
  if (p) { for (unsigned i = 0; i < ES; i++) if (ecnt[i]) fprintf(p, "%lx %lx %lu\n", (unsigned long)ekey[i][0], (unsigned long)ekey[i][1], (unsigned long)ecnt[i]); fclose(p); }
  /* Kernel blocks, with the pause instructions each holds (spin-wait loops), to a second file. */
  snprintf(pn, sizeof pn, "%s.%s.kernel", prof, label);
  p = fopen(pn, "w"); if (!p) return;
  pthread_mutex_lock(&mu);
  for (struct tbinfo *t = all; t; t = t->next) if (t->cnt && t->vaddr >= 0xffff800000000000ull)
    fprintf(p, "%lx %u %u %lu %lu %u %u\n", (unsigned long)t->vaddr, t->n, t->kind, (unsigned long)t->cnt,
            (unsigned long)t->jcmiss, t->pause, t->lock);
  pthread_mutex_unlock(&mu); fclose(p);
}
static void watch_file(const char *name) {
  if (!strncmp(name, "watch.", 6)) { uint64_t a = strtoull(name + 6, NULL, 16); watch_hi = a + 0x100; watch_lo = a; }
}
static void window_open(void) {
  enabled = 0; usleep(2000);
  for (int v = 0; v < NV; v++) {
    memset(V[v].c, 0, sizeof V[v].c);
    memset(V[v].set, 0, sizeof V[v].set);
    memset(V[v].jc, 0, sizeof V[v].jc);
    V[v].prev = V[v].lastuser = NULL;
  }
  pthread_mutex_lock(&mu);
  for (struct tbinfo *t = all; t; t = t->next) t->cnt = t->ncin = t->kentry = t->ktbs = t->kinsns = t->io = t->jcmiss = 0;
  pthread_mutex_unlock(&mu);
  memset(ekey, 0, sizeof ekey); memset(ecnt, 0, sizeof ecnt);
  translations = 0; __atomic_thread_fence(__ATOMIC_SEQ_CST); enabled = 1;
}
static void window_close(const char *label) { enabled = 0; usleep(2000); report(label); }
static struct window_hooks hooks = { .open = window_open, .close = window_close, .other = watch_file };
__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
  (void)info;
  for (int i = 0; i < argc; i++) {
    if (!strncmp(argv[i], "dir=", 4)) hooks.dir = argv[i] + 4;
    else if (!strncmp(argv[i], "out=", 4)) out = argv[i] + 4;
    else if (!strncmp(argv[i], "prof=", 5)) prof = argv[i] + 5;
  }
  V = aligned_alloc(64, sizeof(struct vst) * NV); memset(V, 0, sizeof(struct vst) * NV);
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_trans);
  if (!hooks.dir) hooks.dir = "/tmp/tcg-count";
  window_start(&hooks);
  return 0;
}
