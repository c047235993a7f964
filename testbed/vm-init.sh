#!/bin/busybox sh
# Stage 1 of the rxe VM: the /init of the initramfs built by testbed/rxe-vm.sh.
# Runs under the static busybox. Loads virtio-pci + 9p + overlayfs, mounts the host's
# root read-only (9p) under a tmpfs overlay, mounts the control dir and the rw shares,
# bind-mounts the extracted module tree, then switch_root's into the host userland and
# runs stage 2 (/run/rxevm/stage2.sh) as PID 1.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
fail() { echo "rxe-vm stage1: $*"; sleep 1; reboot -f; }
grep -q rxevm.verbose /proc/cmdline && V=1 || V=
[ -n "$V" ] && echo "rxe-vm: stage1 start at $(cut -d' ' -f1 /proc/uptime)s"

for m in $(cat /mods/order); do insmod /mods/$m || fail "insmod $m"; done

P9="trans=virtio,version=9p2000.L,msize=262144"
mount -t 9p -o $P9,ro,cache=loose hostroot /host || fail "9p hostroot"
mount -t tmpfs -o mode=755 tmpfs /rw && mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot || fail overlay
N=/newroot
for d in proc sys dev run tmp; do mkdir -p $N/$d; done
mount --move /proc $N/proc
mount --move /sys $N/sys
mount --move /dev $N/dev
mkdir -p $N/dev/pts $N/dev/shm
mount -t devpts devpts $N/dev/pts
mount -t tmpfs tmpfs $N/dev/shm
# /run is fresh; /tmp stays the overlay (host /tmp readable, writes go to guest RAM)
mount -t tmpfs -o mode=755 tmpfs $N/run
mkdir -p $N/run/rxevm $N/run/rxevm-bin
# a copy of busybox for a quiet "reboot -f" at the end of stage 2
cp /bin/busybox $N/run/rxevm-bin/busybox
mount -t 9p -o $P9 rxevmctl $N/run/rxevm || fail "9p control dir"

# rw shares: cache=mmap so that writable mmap (linkers, cargo) works
i=0
while IFS= read -r p; do
  [ -n "$p" ] || continue
  mkdir -p "$N$p"
  mount -t 9p -o $P9,cache=mmap rw$i "$N$p" || fail "9p rw$i $p"
  i=$((i + 1))
done <$N/run/rxevm/rwdirs

KV=$(uname -r)
mkdir -p $N/lib/modules/$KV
# from the read-only host mount (cache=loose), even when the cache dir is inside an rw share
mount --bind "/host$(cat $N/run/rxevm/moddir)" $N/lib/modules/$KV || fail "bind modules"
[ -n "$V" ] && echo "rxe-vm: stage1 done at $(cut -d' ' -f1 $N/proc/uptime)s"
# switch_root, not chroot: kernel-initiated modprobe (request_module, e.g. crypto-crc32)
# resolves /sbin/modprobe through PID 1's root
exec switch_root $N /bin/bash /run/rxevm/stage2.sh
