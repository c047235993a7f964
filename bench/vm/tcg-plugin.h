/*
 * tcg-plugin.h: what the QEMU TCG plugins in bench/vm (tcg-count.c, tcg-syscall-times.c)
 * share: the plugin API as far as they use it (QEMU 7.2, plugin API version 1, declared from
 * its documentation, so no QEMU headers are needed) and the counting window: a thread that
 * watches a directory shared with the guest and calls the plugin's hooks when the guest
 * creates on.LABEL (open), off.LABEL (close; each name once) or any other file (every pass).
 */
#ifndef TCG_PLUGIN_H
#define TCG_PLUGIN_H
#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>
typedef uint64_t qemu_plugin_id_t;
typedef struct { const char *target_name; struct { int min, cur; } version; bool system_emulation;
  union { struct { int smp_vcpus, max_vcpus; } system; }; } qemu_info_t;
struct qemu_plugin_tb; struct qemu_plugin_insn; struct qemu_plugin_hwaddr;
typedef uint32_t qemu_plugin_meminfo_t;
enum qemu_plugin_cb_flags { CB_NO_REGS, CB_R_REGS, CB_RW_REGS };
enum qemu_plugin_mem_rw { MEM_R = 1, MEM_W, MEM_RW };
enum qemu_plugin_op { INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*vcpu_udata_cb)(unsigned int, void *);
typedef void (*vcpu_mem_cb)(unsigned int, qemu_plugin_meminfo_t, uint64_t, void *);
typedef void (*udata_cb)(qemu_plugin_id_t, void *);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *, vcpu_udata_cb, enum qemu_plugin_cb_flags, void *);
void qemu_plugin_register_vcpu_mem_cb(struct qemu_plugin_insn *, vcpu_mem_cb, enum qemu_plugin_cb_flags, enum qemu_plugin_mem_rw, void *);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, udata_cb, void *);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *);
bool qemu_plugin_mem_is_store(qemu_plugin_meminfo_t);
struct qemu_plugin_hwaddr *qemu_plugin_get_hwaddr(qemu_plugin_meminfo_t, uint64_t);
bool qemu_plugin_hwaddr_is_io(const struct qemu_plugin_hwaddr *);
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <dirent.h>
#include <unistd.h>


__attribute__((visibility("default"))) int qemu_plugin_version = 1;

struct window_hooks {
  const char *dir;
  void (*open)(void);
  void (*close)(const char *label);
  void (*other)(const char *name); /* may be NULL */
};
/* Polls hooks->dir every 2 ms; runs for the life of the VM (start it detached). */
static void *window_poller(void *arg) {
  const struct window_hooks *h = arg; char seen[256][128]; int ns = 0;
  for (;;) {
    DIR *d = opendir(h->dir);
    if (d) { struct dirent *e;
      while ((e = readdir(d))) {
        if (strncmp(e->d_name, "on.", 3) && strncmp(e->d_name, "off.", 4)) {
          if (h->other && e->d_name[0] != '.') h->other(e->d_name);
          continue;
        }
        int old = 0; for (int i = 0; i < ns; i++) if (!strcmp(seen[i], e->d_name)) old = 1;
        if (old || ns >= 256) continue;
        snprintf(seen[ns++], sizeof seen[0], "%.127s", e->d_name);
        if (e->d_name[1] == 'n') h->open(); else h->close(e->d_name + 4);
      }
      closedir(d); }
    usleep(2000);
  }
  return NULL;
}
static void window_start(const struct window_hooks *h) {
  pthread_t th; pthread_create(&th, NULL, window_poller, (void *)h); pthread_detach(th);
}
#endif
