#!/usr/bin/env bash
# Several hosts on one machine, for running DataHelix across a network without a cluster:
# network namespaces joined by a bridge, each host with its own host name, and `mpirun`
# starting its daemons on them through an rsh agent, as it would over ssh. Ranks on one host
# talk over shared memory, ranks on two hosts over TCP on veth links (held to a rate if asked).
# Needs root, iproute2 (ip, tc) and util-linux (unshare).
#
#   scripts/hosts.sh up NAME N [MBIT]      # N hosts (addresses 10.77.0.2 …), links of MBIT Mbit/s
#   scripts/hosts.sh mpirun NAME PER_HOST PROGRAM ARGS…   # mpirun placing PER_HOST ranks a host
#   scripts/hosts.sh cut NAME I            # host I (1-based) drops off the network
#   scripts/hosts.sh pids NAME             # how many processes still run on the hosts
#   scripts/hosts.sh down NAME             # ends what runs there, removes the hosts
#
# Traffic stays inside the namespaces made here: `mpirun` runs in a launcher namespace of its
# own (NAME-l, 10.77.0.1, on the bridge), not in the machine's. Each host (NAME-h1 …) mounts the
# machine's cgroup v1 `cpu` hierarchy where it has one, so that per-rank CPU budgets hold there
# too (`ip netns exec` gives a namespace a /sys of its own, without cgroups). `down` kills every
# process left in the namespaces first (a daemon cut off from its launcher outlives it).
set -euo pipefail

state_dir() { echo "${TMPDIR:-/tmp}/datahelix-hosts/$1"; }
address() { echo "10.77.0.$(($1 + 1))"; }

# Open MPI 4.1.4's daemons share the host's topology with their ranks at an address picked from
# their own memory map, which sometimes lies where the stack grows: 2 of ~35 launches segfaulted
# in hwloc_shmem_topology_write here, none of ~70 since `rtc_hwloc_vmhole none` turned that
# sharing off.
MPIRUN_MCA=(--mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24
  --mca rtc_hwloc_vmhole none)

up() {
  local name=$1 n=$2 mbit=${3:-} dir l i ns port
  dir=$(state_dir "$name")
  l="$name-l"
  mkdir -p "$dir"
  echo "$n" > "$dir/hosts"
  ip netns add "$l"
  ip -n "$l" link set lo up
  ip -n "$l" link add br0 type bridge
  ip -n "$l" addr add "$(address 0)/24" dev br0
  ip -n "$l" link set br0 up
  local cgroups=:
  if awk '$2 == "/sys/fs/cgroup/cpu" && $3 == "cgroup" { found = 1 } END { exit !found }' /proc/mounts; then
    cgroups='mount -t tmpfs none /sys/fs/cgroup && mkdir /sys/fs/cgroup/cpu && mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu'
  fi
  for ((i = 1; i <= n; i++)); do
    ns="$name-h$i"
    port="h$i"
    ip netns add "$ns"
    ip link add "$port" netns "$l" type veth peer name eth0 netns "$ns"
    ip -n "$l" link set "$port" master br0
    ip -n "$l" link set "$port" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(address "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$mbit" ]; then
      ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "${mbit}mbit" burst 64kb latency 100ms
      ip netns exec "$l" tc qdisc replace dev "$port" root tbf rate "${mbit}mbit" burst 64kb latency 100ms
    fi
  done
  # The agent. Each host gets its own Open MPI session folder, as each machine of a cluster has
  # its own /tmp: given one (`orte_top_session_dir`, which mpirun passes on to its daemons), two
  # daemons making theirs in it raced ("mkdir ... File exists", once in CI).
  {
    cat <<'AGENT'
#!/bin/sh
# rsh agent: "agent HOST COMMAND..." runs COMMAND on the host, as ssh would.
host="$1"; shift
case "$host" in
AGENT
    for ((i = 1; i <= n; i++)); do echo "  $(address "$i")) i=$i;;"; done
    cat <<AGENT
  *) echo "agent: no host \$host" >&2; exit 1;;
esac
ns="$name-h\$i"
command=\$(printf '%s' "\$*" | sed "s|orte_top_session_dir \"\\{0,1\\}\\([^\" ]*\\)\"\\{0,1\\}|orte_top_session_dir \"\\1/\$ns\"|")
exec ip netns exec "\$ns" unshare --uts sh -c "$cgroups; hostname dhhost\$i && \$command"
AGENT
  } > "$dir/agent"
  chmod +x "$dir/agent"
}

run_mpirun() {
  local name=$1 per_host=$2 dir n i hosts=()
  shift 2
  dir=$(state_dir "$name")
  n=$(cat "$dir/hosts")
  for ((i = 1; i <= n; i++)); do hosts+=("$(address "$i"):$per_host"); done
  local placement
  placement=$(IFS=,; echo "${hosts[*]}")
  exec ip netns exec "$name-l" mpirun --mca plm_rsh_agent "$dir/agent" "${MPIRUN_MCA[@]}" \
    -H "$placement" -np $((per_host * n)) "$@"
}

namespaces() {
  local name=$1 n i
  n=$(cat "$(state_dir "$name")/hosts" 2>/dev/null || echo 0)
  echo "$name-l"
  for ((i = 1; i <= n; i++)); do echo "$name-h$i"; done
}

pids() {
  local ns count=0
  for ns in $(namespaces "$1"); do
    count=$((count + $(ip netns pids "$ns" 2>/dev/null | wc -l)))
  done
  echo "$count"
}

down() {
  local name=$1 ns p
  for ns in $(namespaces "$name"); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  done
  for ns in $(namespaces "$name"); do
    [ -e "/var/run/netns/$ns" ] && ip netns del "$ns" || true
  done
  rm -rf "$(state_dir "$name")"
}

cmd=${1:-}
[ $# -ge 2 ] || { sed -n '2,17p' "$0" >&2; exit 2; }
shift
case "$cmd" in
  up) [ $# -ge 2 ] || { echo "usage: hosts.sh up NAME N [MBIT]" >&2; exit 2; }; up "$@" ;;
  mpirun) [ $# -ge 3 ] || { echo "usage: hosts.sh mpirun NAME PER_HOST PROGRAM ARGS..." >&2; exit 2; }; run_mpirun "$@" ;;
  cut) ip -n "$1-h$2" link set eth0 down ;;
  pids) pids "$1" ;;
  down) down "$1" ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
