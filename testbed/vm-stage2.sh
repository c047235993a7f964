# Stage 2 of the rxe VM (bash, PID 1, inside the host's overlaid root filesystem).
# Copied into the per-run control dir by testbed/rxe-vm.sh; reads its settings from there.
# Loads rdma_rxe, creates rxe0 on one end of a veth pair, runs the command, writes its
# exit status to the control dir and reboots (qemu runs with -no-reboot, so it exits).
C=/run/rxevm
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
V=$(cat $C/verbose)
say() { if [ "$V" = 1 ]; then echo "rxe-vm: $*"; fi; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
finish() {
  echo "$1" >$C/rc
  sync
  echo 0 >/proc/sys/kernel/printk # keep "reboot: Restarting system" off the console
  /run/rxevm-bin/busybox reboot -f
  echo b >/proc/sysrq-trigger
  sleep 10
}
stty -F /dev/console -onlcr 2>/dev/null || true # plain \n on the serial console
hostname rxevm 2>/dev/null || true
ip link set lo up

if [ "$(cat $C/rxe)" = 1 ]; then
  # crc32_generic: rdma_rxe needs a "crc32" shash for the ICRC; without it
  # "rdma link add" fails with ENOENT ("rdma_rxe: failed to add <dev>")
  modprobe -a crc32_generic rdma_rxe rdma_ucm ib_umad veth || {
    echo "rxe-vm: modprobe failed"
    finish 125
  }
  # veth rather than dummy: dummy has no link speed, so every port query logs
  # "speed is unknown, defaulting to 1000". The peer end only has to be up.
  ip link add rxevm0 type veth peer name rxevm0p &&
    ip link set rxevm0p up && ip link set rxevm0 up &&
    ip addr add "$(cat $C/ip)" dev rxevm0 || {
    echo "rxe-vm: veth setup failed"
    finish 125
  }
  export RXE_VM_ADDR=$(cut -d/ -f1 $C/ip)
  rdma link add rxe0 type rxe netdev rxevm0 || {
    echo "rxe-vm: rdma link add failed"
    dmesg | tail -5
    finish 125
  }
  # wait until the port is ACTIVE and the IPv4-mapped RoCE v2 GID exists
  for _ in $(seq 200); do
    read -r st </sys/class/infiniband/rxe0/ports/1/state 2>/dev/null || st=
    case $st in
      *ACTIVE*) grep -qs 0000:0000:0000:0000:0000:ffff: /sys/class/infiniband/rxe0/ports/1/gids/[0-3] && break ;;
    esac
    sleep 0.1
  done
  say "rxe0 up on rxevm0 ($RXE_VM_ADDR) at $(uptime_s)s"
fi
ulimit -l unlimited 2>/dev/null || true

# the caller's environment, minus what describes the host session
while IFS= read -r -d '' kv; do
  case ${kv%%=*} in
    PWD | OLDPWD | SHLVL | _ | HOSTNAME | DISPLAY | TMUX* | STY | WINDOW | SSH_* | XDG_* | DBUS_* | BASH_FUNC_* | INVOCATION_ID | JOURNAL_STREAM | NOTIFY_SOCKET) ;;
    *) export "$kv" 2>/dev/null || true ;;
  esac
done <$C/env0
export RXE_VM=1
say "running command at $(uptime_s)s"
echo "$(uptime_s)" >$C/t_cmd_start
if [ "$(cat $C/tty)" = 1 ]; then
  /bin/bash $C/cmd.sh </dev/null
  rc=$?
else
  # host output is not a terminal: the command must not see a tty either (CI logs)
  /bin/bash $C/cmd.sh </dev/null 2>&1 | cat
  rc=${PIPESTATUS[0]}
fi
echo "$(uptime_s)" >$C/t_cmd_end
say "command exited $rc at $(uptime_s)s"
finish $rc
