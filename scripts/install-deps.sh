#!/usr/bin/env bash
# install-deps.sh - install the Debian packages the whole rucx project needs (idempotent).
#
# Usage (as root): scripts/install-deps.sh [--dry-run]
#   --dry-run   only print the missing packages (exit 0 if none, 1 if some are missing)
#
# Runs `apt-get update` at most once, and only when something is missing.  Waits up to
# 10 minutes for the dpkg lock (other jobs on a shared machine may hold it).
#
# Deliberately NOT installed: qemu-utils.  Images of this kind ship a bookworm-backports
# qemu-utils (10.x) that Breaks qemu-system-common 7.2, and the testbed needs no disk
# images.  busybox-static is not installed either (it conflicts with busybox);
# testbed/rxe-vm.sh downloads and unpacks it into its cache instead.
set -euo pipefail

PKGS=(
  # building uct-ib: rdma-sys links libibverbs + librdmacm (pkg-config) and runs bindgen,
  # which needs libclang and clang's builtin headers (libclang-dev pulls both)
  libibverbs-dev librdmacm-dev libclang-dev pkg-config
  # building uct-ofi (libuct_ofi.so): libfabric's headers for bindgen, and the library
  libfabric-dev
  # the soft-RoCE testbed (testbed/rxe-vm.sh): QEMU, module tools, initramfs tools, the
  # rxe userspace provider (librxe) and verbs/RDMA-CM diagnostics
  qemu-system-x86 kmod iproute2 cpio gzip ibverbs-providers ibverbs-utils rdmacm-utils perftest
  # peers to test and benchmark against: UCX (ucx_perftest, ucx_info, headers) and libfabric
  ucx-utils libucx-dev libfabric-bin
)
# iproute2 (above) also provides `ip netns` and `rdma`, used by the network-namespace tests.

DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "install-deps.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps.sh: all ${#PKGS[@]} packages already installed"
  exit 0
fi
echo "install-deps.sh: missing: ${missing[*]}"
[ "$DRY" = 1 ] && exit 1
[ "$(id -u)" = 0 ] || { echo "install-deps.sh: must run as root to install packages" >&2; exit 1; }

# Say so when apt is about to remove the image's backports qemu-utils (it Breaks the
# qemu-system-common 7.2 that qemu-system-x86 needs; nothing here uses qemu-img/qemu-nbd).
if printf '%s\n' "${missing[@]}" | grep -qx qemu-system-x86; then
  qv=$(dpkg-query -W -f='${Status} ${Version}' qemu-utils 2>/dev/null | awk '/install ok installed/{print $4}')
  if [ -n "$qv" ] && dpkg --compare-versions "$qv" ge 1:8.0; then
    echo "install-deps.sh: note: apt will remove qemu-utils $qv (it Breaks qemu-system-common 7.2)"
  fi
fi

export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -o DPkg::Lock::Timeout=600)
echo "install-deps.sh: apt-get update"
"${APT[@]}" update -qq
echo "install-deps.sh: installing ${missing[*]}"
"${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps.sh: installed ${missing[*]}"
