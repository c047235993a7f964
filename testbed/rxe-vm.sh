#!/usr/bin/env bash
# rxe-vm.sh - run a command inside a throw-away QEMU VM with Soft-RoCE (rdma_rxe), so that
# real verbs work on a host without RDMA hardware or an InfiniBand-enabled kernel.
#
# Usage: testbed/rxe-vm.sh [options] [--] CMD [ARGS...]
#   --timeout S    kill the VM after S seconds (default 1800); exit status 124
#   --prepare      only install/download/build what is needed (CI warm-up), then exit 0
#   --rw DIR       also share DIR read-write at the same path (repeatable)
#   --no-rxe       do not create rxe0 (the modules are still available)
#   --mem MB       guest memory (default 2048)
#   --smp N        guest CPUs (default: host CPUs, at most 4)
#   --accel MODE   auto (default) | kvm | tcg
#   --timing       print one line with boot, command and total times to stderr at the end
#   --plugin SPEC  load a QEMU TCG plugin (qemu's -plugin SPEC, e.g. file.so,arg=...; tcg
#                  only), such as bench/vm/tcg-count.c (diagnostics; bench/README.md)
#   --verbose      kernel messages, timing marks and the qemu command line
#   -h, --help
#
# The VM boots Debian's stock kernel (downloaded with apt, never installed) and uses the
# host's own root filesystem read-only over virtio-9p with a tmpfs overlay, so host
# binaries and libraries (libibverbs, the rxe provider, cargo's test binaries) run
# unchanged. The project root and the current directory are shared read-write at their
# own paths; CMD runs in the current directory with the caller's environment, stdin is
# /dev/null, stdout+stderr come back on stdout. Exit status: CMD's; 124 on timeout; 125
# when the VM failed (no status reported); 2 for bad usage.
#
# In the guest: rxe0 on netdev rxevm0 (one end of a veth pair) with address
# $RXE_VM_IP (default 192.0.2.1/24, RFC 5737 documentation range; the VM has no NIC, so
# nothing leaves it). GID index 0 = IPv6 link-local, 1 = ::ffff:192.0.2.1, both RoCE v2.
# RXE_VM=1 and RXE_VM_ADDR=<ip> are exported.
#
# Environment: RXE_VM_CACHE (default <project>/.testbed-cache/rxe-vm), RXE_VM_KERNEL_PKG
# (e.g. linux-image-6.1.0-56-amd64; default: what linux-image-amd64 depends on),
# RXE_VM_IP, RXE_VM_NO_APT=1 (never call apt-get). Must run as root.
set -euo pipefail

SELF=rxe-vm.sh
TB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$TB_DIR/.." && pwd -P)
CACHE=${RXE_VM_CACHE:-$ROOT/.testbed-cache/rxe-vm}
RXE_IP=${RXE_VM_IP:-192.0.2.1/24}
ACCEL=auto
MEM=2048
SMP=$(nproc 2>/dev/null || echo 2)
[ "$SMP" -gt 4 ] && SMP=4
TIMEOUT=1800
RXE=1
VERBOSE=0
TIMING=0
PREPARE_ONLY=0
RW_DIRS=()
PLUGINS=()

die() {
  echo "$SELF: $*" >&2
  exit 125
}
usage() {
  echo "$SELF: $* (see --help)" >&2
  exit 2
}
log() { if [ "$VERBOSE" = 1 ]; then echo "$SELF: $*" >&2; fi; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) [ $# -ge 2 ] || usage "--timeout needs seconds"; TIMEOUT=$2; shift 2 ;;
    --prepare) PREPARE_ONLY=1; shift ;;
    --rw) [ $# -ge 2 ] || usage "--rw needs a directory"; RW_DIRS+=("$(cd "$2" && pwd -P)"); shift 2 ;;
    --no-rxe) RXE=0; shift ;;
    --mem) [ $# -ge 2 ] || usage "--mem needs MB"; MEM=$2; shift 2 ;;
    --smp) [ $# -ge 2 ] || usage "--smp needs a count"; SMP=$2; shift 2 ;;
    --accel) [ $# -ge 2 ] || usage "--accel needs auto|kvm|tcg"; ACCEL=$2; shift 2 ;;
    --timing) TIMING=1; shift ;;
    --plugin) [ $# -ge 2 ] || usage "--plugin needs file.so[,args]"; PLUGINS+=(-plugin "$2"); shift 2 ;;
    --verbose | -v) VERBOSE=1; TIMING=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) usage "unknown option $1" ;;
    *) break ;;
  esac
done
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || usage "--timeout must be a number of seconds"
[ $# -gt 0 ] || [ "$PREPARE_ONLY" = 1 ] || usage "no command given (usage: $SELF [options] -- CMD ARGS...)"
[ "$(id -u)" = 0 ] || die "must run as root (apt-get, 9p export of /)"

# ------------------------------------------------------------------ 1. host packages
# The package list lives in scripts/install-deps.sh; run it only if something the VM
# itself needs is missing (it is idempotent anyway, but dpkg-query is faster).
NEED=(qemu-system-x86 kmod iproute2 cpio gzip ibverbs-providers ibverbs-utils)
for p in "${NEED[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    [ "${RXE_VM_NO_APT:-0}" = 1 ] && die "package $p is missing and RXE_VM_NO_APT=1; run scripts/install-deps.sh"
    bash "$ROOT/scripts/install-deps.sh" >&2 || die "scripts/install-deps.sh failed"
    break
  fi
done

apt_updated=0
apt_update() {
  [ "${RXE_VM_NO_APT:-0}" = 1 ] && die "need apt-get but RXE_VM_NO_APT=1"
  if [ $apt_updated = 0 ]; then
    echo "$SELF: apt-get update" >&2
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    apt_updated=1
  fi
}
# apt_download PKG DIR: fetch PKG's .deb into DIR (refreshing the lists once if needed)
apt_download() {
  (cd "$2" && { apt-get download "$1" >/dev/null 2>&1 || { apt_update && apt-get download "$1" >&2; }; })
}

# ------------------------------------------------------------------ 2. kernel + busybox
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9 # concurrent runs share the cache safely

KPKG=${RXE_VM_KERNEL_PKG:-}
if [ -z "$KPKG" ]; then
  # reuse the kernel already extracted; otherwise ask apt for the current one (the ABI
  # name changes with Debian security updates, and old ones leave the archive)
  KPKG=$(cat "$CACHE/kernel.pkg" 2>/dev/null || true)
  if [ -z "$KPKG" ] || [ ! -f "$CACHE/kernel-${KPKG#linux-image-}/.done" ]; then
    kdep() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
    KPKG=$(kdep)
    if [ -z "$KPKG" ]; then apt_update; KPKG=$(kdep); fi
  fi
fi
[ -n "$KPKG" ] || die "cannot determine the Debian kernel image package (set RXE_VM_KERNEL_PKG)"
KVER=${KPKG#linux-image-}
KROOT="$CACHE/kernel-$KVER"
if [ ! -f "$KROOT/.done" ]; then
  echo "$SELF: downloading and extracting $KPKG into $CACHE" >&2
  rm -rf "$KROOT" "$CACHE/dl"
  mkdir -p "$CACHE/dl"
  apt_download "$KPKG" "$CACHE/dl" || die "apt-get download $KPKG failed"
  dpkg -x "$CACHE"/dl/"$KPKG"_*.deb "$KROOT"
  rm -rf "$CACHE/dl"
  # the .deb carries no modules.dep (its postinst runs depmod)
  depmod -b "$KROOT" "$KVER"
  [ -f "$KROOT/lib/modules/$KVER/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] ||
    die "$KPKG has no rdma_rxe.ko"
  touch "$KROOT/.done"
fi
echo "$KPKG" >"$CACHE/kernel.pkg"
VMLINUZ="$KROOT/boot/vmlinuz-$KVER"
MODDIR="$KROOT/lib/modules/$KVER"

# the initramfs needs a *static* busybox; busybox-static conflicts with busybox, so it is
# downloaded and unpacked into the cache, never installed
BUSYBOX="$CACHE/busybox-static/bin/busybox"
if [ ! -x "$BUSYBOX" ]; then
  rm -rf "$CACHE/bbdl" "$CACHE/busybox-static"
  mkdir -p "$CACHE/bbdl"
  apt_download busybox-static "$CACHE/bbdl" || die "apt-get download busybox-static failed"
  dpkg -x "$CACHE"/bbdl/busybox-static_*.deb "$CACHE/busybox-static"
  rm -rf "$CACHE/bbdl"
fi

# ------------------------------------------------------------------ 3. initramfs
# Stage 1 only needs virtio-pci, 9p and overlayfs; everything else (rdma_rxe, crc32,
# veth) is loaded in stage 2 by the host's kmod from the bind-mounted module tree.
INITRD="$CACHE/initrd-$KVER.gz"
if [ ! -f "$INITRD" ] || [ "$TB_DIR/vm-init.sh" -nt "$INITRD" ]; then
  t0=$(now_ms)
  W=$(mktemp -d /tmp/rxe-vm-initrd.XXXXXX)
  mkdir -p "$W"/{bin,proc,sys,dev,mods,host,newroot,rw}
  cp "$BUSYBOX" "$W/bin/busybox" # argv[0] must be "busybox"
  for m in virtio_pci 9pnet_virtio 9p overlay; do
    modprobe -d "$KROOT" -S "$KVER" --show-depends "$m"
  done | awk '$1=="insmod"{print $2}' | awk '!seen[$0]++' | while read -r f; do
    cp "$f" "$W/mods/"
    basename "$f" >>"$W/mods/order"
  done
  install -m 755 "$TB_DIR/vm-init.sh" "$W/init"
  (cd "$W" && find . | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  rm -rf "$W"
  log "initramfs built in $(($(now_ms) - t0)) ms"
fi
flock -u 9

if [ "$PREPARE_ONLY" = 1 ]; then
  echo "$SELF: ready (kernel $KVER, cache $CACHE)" >&2
  exit 0
fi

# ------------------------------------------------------------------ 4. per-run control dir
CTL=$(mktemp -d /tmp/rxe-vm-run.XXXXXX)
QPID=
cleanup() {
  if [ -n "$QPID" ]; then kill "$QPID" 2>/dev/null || true; fi
  rm -rf "$CTL"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CWD=$(pwd -P)
# share the project root (cargo's target/ dirs live there) and the cwd if outside it
RW_ALL=("$ROOT")
case "$CWD/" in "$ROOT"/*) ;; /) ;; *) RW_ALL+=("$CWD") ;; esac
RW_ALL+=("${RW_DIRS[@]}")
: >"$CTL/rwdirs"
for d in "${RW_ALL[@]}"; do printf '%s\n' "$d" >>"$CTL/rwdirs"; done
printf '%s\n' "$MODDIR" >"$CTL/moddir"
env -0 >"$CTL/env0" # filtered in stage 2
{
  printf 'cd %q || exit 126\n' "$CWD"
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} >"$CTL/cmd.sh"
echo "$RXE" >"$CTL/rxe"
echo "$RXE_IP" >"$CTL/ip"
echo "$VERBOSE" >"$CTL/verbose"
if [ -t 1 ]; then echo 1 >"$CTL/tty"; else echo 0 >"$CTL/tty"; fi
cp "$TB_DIR/vm-stage2.sh" "$CTL/stage2.sh"

# ------------------------------------------------------------------ 5. boot
case "$ACCEL" in
  auto)
    # KVM only with real VT-x/AMD-V. Where /dev/kvm is PVM (kvm_pvm), a stock Debian
    # kernel hangs before printing anything, so use TCG there.
    if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && [ ! -d /sys/module/kvm_pvm ]; then
      ACCEL=kvm
    else
      ACCEL=tcg
    fi
    ;;
  kvm | tcg) ;;
  *) usage "--accel must be auto, kvm or tcg" ;;
esac
if [ "$ACCEL" = kvm ]; then ACC=(-accel kvm -cpu host); else ACC=(-accel tcg,thread=multi -cpu max); fi
[ ${#PLUGINS[@]} -eq 0 ] || [ "$ACCEL" != kvm ] || usage "--plugin needs the tcg accelerator (--accel tcg)"
# no_timer_check: under TCG on a loaded host the kernel's boot-time check that the timer
# interrupt reaches the IO-APIC can miss its ticks and panic ("IO-APIC + timer doesn't work!");
# the emulated timer is fine, so the check is skipped, as is usual for virtual machines.
# tsc=reliable: the guest's TSC is the host's (TCG reads the host's time-stamp counter), the
# same on every vCPU, but the kernel marks it unstable by a rule of thumb (an emulated AMD CPU
# without constant_tsc and more than one CPU) and falls back to the HPET. Every clock read would
# then be a system call and an emulated device access, which charges programs by how often they
# read the clock, where real hardware has an invariant TSC and the vDSO.
KARGS="no_timer_check quiet loglevel=3"
[ "$VERBOSE" = 1 ] && KARGS="no_timer_check loglevel=5 rxevm.verbose"
[ "$ACCEL" = kvm ] || KARGS="$KARGS tsc=reliable"
VIRTFS=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
  -virtfs "local,path=$CTL,mount_tag=rxevmctl,security_model=none")
i=0
for d in "${RW_ALL[@]}"; do # a ',' in a qemu option value must be doubled
  VIRTFS+=(-virtfs "local,path=${d//,/,,},mount_tag=rw$i,security_model=none,multidevs=remap")
  i=$((i + 1))
done
QEMU=(qemu-system-x86_64 "${ACC[@]}" -M q35 -m "$MEM" -smp "$SMP"
  -bios /usr/share/qemu/qboot.rom -nodefaults -no-user-config -no-reboot
  -display none -vga none -monitor none -nic none
  -chardev stdio,id=con,signal=off -serial chardev:con
  -kernel "$VMLINUZ" -initrd "$INITRD"
  -append "console=ttyS0 edd=off panic=-1 rdinit=/init $KARGS"
  "${VIRTFS[@]}" "${PLUGINS[@]}")
log "accel=$ACCEL kernel=$KVER smp=$SMP mem=${MEM}M"
log "${QEMU[*]}"
T0=$(now_ms)
set +e
# stdin /dev/null: with -chardev stdio qemu would otherwise put the terminal in raw mode
timeout -k 5 "$TIMEOUT" "${QEMU[@]}" </dev/null &
QPID=$!
wait $QPID
qrc=$?
QPID=
set -e
WALL=$(($(now_ms) - T0))
if [ "$TIMING" = 1 ]; then
  cmd_ms=$(awk -v a="$(cat "$CTL/t_cmd_start" 2>/dev/null || echo 0)" \
    -v b="$(cat "$CTL/t_cmd_end" 2>/dev/null || echo 0)" 'BEGIN{printf "%d", (b-a)*1000}')
  echo "$SELF: timing: total ${WALL} ms, command ${cmd_ms} ms, boot+setup+shutdown $((WALL - cmd_ms)) ms (accel $ACCEL)" >&2
fi
if [ -s "$CTL/rc" ]; then exit "$(cat "$CTL/rc")"; fi
if [ $qrc = 124 ] || [ $qrc = 137 ]; then
  echo "$SELF: timed out after ${TIMEOUT}s" >&2
  exit 124
fi
echo "$SELF: the VM ended without reporting a status (qemu exit $qrc); rerun with --verbose" >&2
exit 125
