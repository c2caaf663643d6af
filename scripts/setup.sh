#!/usr/bin/env bash
# Installs, only where missing, what DataHelix needs to build and test on Debian 12, and sets the
# Open MPI variables a root run on a small machine needs. Idempotent; safe to source or to run.
#
#   scripts/setup.sh            # install what is missing
#   source scripts/setup.sh     # ... and keep the MPI variables in this shell
#
# It needs ~13 GB of disk (the Python environment 8.2 GB, 12 GB while pip installs it; the build
# folder 4.7 GB after scripts/test.sh). On a disk short of that, what does not fit is kept in
# memory (dh_in_memory_if_short below).
set -euo pipefail

DH_PACKAGES=(
  libopenmpi-dev openmpi-bin
  clang libclang-dev pkg-config
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev ffmpeg
  valgrind g++ python3-numpy python3-venv
  iproute2 util-linux
  zip
)

dh_missing_packages() {
  local p
  for p in "${DH_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}

missing=$(dh_missing_packages)
if [ -n "$missing" ]; then
  echo "setup: installing: $(echo $missing | tr '\n' ' ')" >&2
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  # shellcheck disable=SC2086
  $sudo apt-get install -y -qq --no-install-recommends $missing >&2
fi

# Open MPI as root, more ranks than cores, and no pinning of each rank to one core.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
# Loopback-only machines: keep Open MPI off the (absent) fabrics and quiet about it.
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}

dh_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# MB free on the file system holding $1 (empty when df cannot tell).
dh_free_mb() { df -Pm "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }

# A machine whose disk is short of room (CI machines have been seen with 2 GB free) keeps a
# folder of the repository that is made here in memory instead: `dh_in_memory_if_short PATH
# NEED_MB` links PATH to a folder in /dev/shm (a tmpfs) when PATH's disk has less than NEED_MB
# free and memory has room for it and for the tests besides. A reboot empties it; the next
# setup makes it again. A PATH that exists already stays where it is.
DH_MEMORY_RESERVE_MB=8000
dh_in_memory_if_short() {
  local path=$1 need=$2 free avail shm kept
  if [ -L "$path" ]; then
    mkdir -p "$(readlink "$path")"
    return 0
  fi
  [ -e "$path" ] && return 0
  free=$(dh_free_mb "$(dirname "$path")")
  { [ -n "$free" ] && [ "$free" -lt "$need" ]; } || return 0
  avail=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo 2>/dev/null)
  shm=$(dh_free_mb /dev/shm)
  if [ -n "$avail" ] && [ -n "$shm" ] && [ "$avail" -ge $((need + DH_MEMORY_RESERVE_MB)) ] &&
    [ "$shm" -ge "$need" ]; then
    kept=/dev/shm/datahelix-$(printf '%s' "$path" | md5sum | cut -c1-8)-$(basename "$path" | tr -d .)
    mkdir -p "$kept"
    ln -s "$kept" "$path"
    echo "setup: $(dirname "$path") has ${free} MB free, short of the ~${need} MB $(basename "$path") takes;" \
      "it is kept in memory, $kept, linked from $path (a reboot empties it; setup makes it again)" >&2
  fi
}

# The build folder: 4.7 GB after scripts/test.sh (measured 2026-12-05).
if [ -z "${CARGO_TARGET_DIR:-}" ]; then dh_in_memory_if_short "$dh_repo/target" 6000; fi

# The project's own Python environment: torch, numpy and maturin for the Python package's tests
# (python/requirements-dev.txt), never in the system Python. DATAHELIX_VENV moves it.
DH_VENV=${DATAHELIX_VENV:-$dh_repo/.venv}
export DH_VENV
dh_requirements=$(dirname "${BASH_SOURCE[0]}")/../python/requirements-dev.txt
if ! "$DH_VENV/bin/python" - "$dh_requirements" >/dev/null 2>&1 <<'PYEOF'
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        assert version(name) == want, (name, version(name), want)
PYEOF
then
  # Measured on a fresh machine: the environment takes 8.2 GB, the install ~12 GB at its peak
  # (the wheels wait beside it). A full disk otherwise shows up as pip's "[Errno 28] No space
  # left on device" halfway through.
  dh_need_mb=12000
  if [ -z "${DATAHELIX_VENV:-}" ]; then dh_in_memory_if_short "$DH_VENV" "$dh_need_mb"; fi
  # venv refuses to make an environment at a symbolic link: make it where the link leads.
  if [ -L "$DH_VENV" ]; then DH_VENV=$(readlink -f "$DH_VENV"); fi
  mkdir -p "$DH_VENV"
  dh_free_mb=$(dh_free_mb "$DH_VENV/.")
  if [ -n "$dh_free_mb" ] && [ "$dh_free_mb" -lt "$dh_need_mb" ]; then
    echo "setup: the Python environment $DH_VENV needs ~${dh_need_mb} MB free (torch with its NVIDIA" \
      "libraries and MindSpore) and its disk has ${dh_free_mb} MB: free space there, or set" \
      "DATAHELIX_VENV to a folder on a disk with room" >&2
    exit 2
  fi
  echo "setup: making or updating the Python environment $DH_VENV (torch and MindSpore, ~8 GB on first install)" >&2
  python3 -m venv "$DH_VENV" >&2
  # pip's downloads (~4 GB of wheels) wait beside the environment, on the file system checked
  # for room above, not in /tmp; nothing of them is kept.
  mkdir -p "$DH_VENV/.pip-tmp"
  TMPDIR=$DH_VENV/.pip-tmp "$DH_VENV/bin/pip" install -q --no-cache-dir -r "$dh_requirements" >&2
  rm -rf "$DH_VENV/.pip-tmp"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (rustup) first: https://rustup.rs" >&2
  exit 2
fi
