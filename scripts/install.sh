#!/usr/bin/env bash
# Installs DataHelix's C library the usual way, so that a training binary can depend on it with
# pkg-config:
#
#   scripts/install.sh --prefix /opt/datahelix      # builds (release) and installs
#   cc app.c $(PKG_CONFIG_PATH=/opt/datahelix/lib/pkgconfig pkg-config --cflags --libs datahelix)
#
# Installs, under the prefix:
#   lib/libdatahelix.so.X.Y.Z, lib/libdatahelix.so.X -> it (the soname), lib/libdatahelix.so -> .so.X
#   lib/libdatahelix.a                 the static library (`pkg-config --static` lists what it needs)
#   include/datahelix.h                the header (DH_VERSION_MAJOR/MINOR/PATCH inside)
#   lib/pkgconfig/datahelix.pc
#   share/doc/datahelix/               LICENSE, docs/c-abi.md
# Options: --prefix P (default /usr/local), --libdir D (default P/lib), --from DIR (install the
# libraries a build left in DIR, e.g. target/debug, without building), DESTDIR=… staged installs
# as packagers expect. Run scripts/setup.sh first on a fresh machine (FFmpeg and MPI development
# files).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
libdir=
build=1
from=target/release
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --libdir) libdir=${2:?--libdir needs a directory}; shift 2 ;;
    --libdir=*) libdir=${1#--libdir=}; shift ;;
    --from) from=${2:?--from needs a directory}; build=0; shift 2 ;;
    --from=*) from=${1#--from=}; build=0; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in
  /*) ;;
  *) echo "install.sh: --prefix must be an absolute path, not '$prefix'" >&2; exit 2 ;;
esac
libdir=${libdir:-$prefix/lib}
includedir=$prefix/include
destdir=${DESTDIR:-}

# The version is the crate's: one number for the library file, the soname and the header macros.
version=$(sed -n '/^\[package\]/,/^\[/{s/^version *= *"\([^"]*\)".*/\1/p}' Cargo.toml | head -1)
major=${version%%.*}
if [ -z "$version" ]; then
  echo "install.sh: no [package] version in Cargo.toml" >&2
  exit 1
fi

if [ "$build" = 1 ]; then
  echo "== building libdatahelix $version (release)" >&2
  cargo build --release --quiet --lib
fi
for f in "$from/libdatahelix.so" "$from/libdatahelix.a"; do
  if [ ! -f "$f" ]; then
    echo "install.sh: $f is missing; build it (cargo build --lib) or run without --from" >&2
    exit 1
  fi
done
soname=$(readelf -d "$from/libdatahelix.so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ "$soname" != "libdatahelix.so.$major" ]; then
  echo "install.sh: $from/libdatahelix.so has soname '$soname', expected libdatahelix.so.$major (a build from before the soname? rebuild it)" >&2
  exit 1
fi

lib=$destdir$libdir
install -d "$lib" "$lib/pkgconfig" "$destdir$includedir" "$destdir$prefix/share/doc/datahelix"
install -m 0755 "$from/libdatahelix.so" "$lib/libdatahelix.so.$version"
ln -sfn "libdatahelix.so.$version" "$lib/libdatahelix.so.$major"
ln -sfn "libdatahelix.so.$major" "$lib/libdatahelix.so"
install -m 0644 "$from/libdatahelix.a" "$lib/libdatahelix.a"
install -m 0644 csrc/include/datahelix.h "$destdir$includedir/datahelix.h"
install -m 0644 LICENSE docs/c-abi.md "$destdir$prefix/share/doc/datahelix/"

# What a static link of libdatahelix.a needs beyond it: FFmpeg's and MPI's shared libraries (the
# archive holds DataHelix and its Rust dependencies only; FFmpeg's own static closure is not
# wanted), and the Rust standard library's system libraries.
ffmpeg_libs=$(pkg-config --libs libavformat libavcodec libswscale libavutil 2>/dev/null \
  || echo "-lavformat -lavcodec -lswscale -lavutil")
mpi_libs=$(mpicc --showme:link 2>/dev/null || echo "-lmpi")
cat >"$lib/pkgconfig/datahelix.pc" <<EOF
prefix=$prefix
libdir=$libdir
includedir=$includedir

Name: datahelix
Description: Deadline-aware, rank-symmetric input data plane for synchronous multimodal training
URL: https://github.com/datahelix/datahelix
Version: $version
Libs: -L\${libdir} -ldatahelix
Libs.private: $ffmpeg_libs $mpi_libs -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
Cflags: -I\${includedir}
EOF
echo "installed libdatahelix $version under $destdir$prefix (pkg-config: $libdir/pkgconfig/datahelix.pc)" >&2
