#!/usr/bin/env bash
# Installs nvshmem-efa-gda into a prefix.
#
#   PREFIX=/some/prefix cmake/install.sh [--build-dir DIR] [--include-dir DIR]
#
#   --build-dir DIR    where libnvshmem_efa_gda.so is (default target/release; relative paths are
#                      taken from the current directory, then from the repository root)
#   --include-dir DIR  where nvshmem_efa_gda.h is (default include/ of the repository)
#   CC                 C compiler for the plugin shims (default cc)
#   NVSHMEM_EFA_GDA_VERSION  version recorded in the packages (default: Cargo.toml's)
#
# Result:
#   lib/libnvshmem_efa_gda.so                 the library (the only copy)
#   lib/nvshmem_transport_libfabric.so.3      NVSHMEM 3.4.x plugin name (SONAME = file name)
#   lib/nvshmem_transport_libfabric.so.4      NVSHMEM 3.5.x plugin name
#   lib/nvshmem_transport_libfabric.so.5/.6/.7  NVSHMEM 3.6.x / 3.7.x / 3.8.x plugin names
#       tiny objects built from cmake/plugin_shim.c: DT_NEEDED libnvshmem_efa_gda.so, RUNPATH $ORIGIN;
#       NVSHMEM's dlsym(handle, "nvshmemt_init") finds the library's entry through them, so
#       LD_PRELOAD=<prefix>/lib/nvshmem_transport_libfabric.so.3 loads one copy of the library
#   include/nvshmem_efa_gda.h                 C API
#   include/nvshmem_efa_gda/cuda/             device API headers (from cuda/)
#   lib/cmake/NvshmemEfaGda/                  find_package(NvshmemEfaGda) -> NvshmemEfaGda::nvshmem_efa_gda,
#                                             and nvshmem_efa_gda.cmake for NVSHMEM's patched build
#   lib/pkgconfig/nvshmem-efa-gda.pc          pkg-config
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "install.sh: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" >&2; exit 2; }

build_dir=target/release
include_dir=$root/include
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) [ $# -ge 2 ] || usage; build_dir=$2; shift ;;
    --build-dir=*) build_dir=${1#*=} ;;
    --include-dir) [ $# -ge 2 ] || usage; include_dir=$2; shift ;;
    --include-dir=*) include_dir=${1#*=} ;;
    -h|--help) usage ;;
    *) echo "install.sh: unknown argument: $1" >&2; usage ;;
  esac
  shift
done

[ -n "${PREFIX:-}" ] || { echo "install.sh: set PREFIX, e.g. PREFIX=\$HOME/.local cmake/install.sh" >&2; exit 2; }
cc=${CC:-cc}
for tool in "$cc" readelf nm sed install; do
  command -v "$tool" >/dev/null || die "$tool not found"
done

# Build dir: as given if it exists from here, else relative to the repository root.
if [ -d "$build_dir" ]; then
  build_dir=$(cd "$build_dir" && pwd)
elif [ -d "$root/$build_dir" ]; then
  build_dir=$(cd "$root/$build_dir" && pwd)
else
  die "build directory $build_dir not found: run cargo build --release first (or pass --build-dir)"
fi
lib=$build_dir/libnvshmem_efa_gda.so
[ -f "$lib" ] || die "$lib not found: run cargo build --release first (or pass --build-dir)"
header=$include_dir/nvshmem_efa_gda.h
[ -f "$header" ] || die "$header not found (pass --include-dir, or refresh it with NVSHMEM_EFA_GDA_WRITE_HEADER=1 cargo build)"

# The library must export NVSHMEM's entry point and the C API the splice and the packages use.
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}')
missing=()
for sym in nvshmemt_init nvshmem_efa_gda_version nvshmemt_efa_gda_init_on_ep nvshmemt_efa_gda_fini \
           nvshmemt_efa_gda_get_address nvshmemt_efa_gda_connect nvshmemt_efa_gda_set_local_heap \
           nvshmemt_efa_gda_set_remote_heap nvshmemt_efa_gda_mode; do
  grep -qx "$sym" <<<"$exported" || missing+=("$sym")
done
[ ${#missing[@]} -eq 0 ] || die "$lib does not export: ${missing[*]}"

version=${NVSHMEM_EFA_GDA_VERSION:-}
if [ -z "$version" ]; then
  [ -f "$root/Cargo.toml" ] || die "no Cargo.toml in $root: set NVSHMEM_EFA_GDA_VERSION"
  version=$(awk '/^\[/ { in_pkg = ($0 == "[package]") } in_pkg && /^version[[:space:]]*=/ {
                   gsub(/^version[[:space:]]*=[[:space:]]*"|".*$/, ""); print; exit }' "$root/Cargo.toml")
fi
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]*)?$ ]] || die "bad version '$version'"

mkdir -p "$PREFIX"
prefix=$(cd "$PREFIX" && pwd)
libdir=$prefix/lib
cmakedir=$libdir/cmake/NvshmemEfaGda
cudadir=$prefix/include/nvshmem_efa_gda/cuda
mkdir -p "$libdir" "$cmakedir" "$libdir/pkgconfig" "$cudadir"

# 1. The library. Replace it through a new file so that a process using the old one keeps it.
install -m 0755 "$lib" "$libdir/.libnvshmem_efa_gda.so.new"
mv -f "$libdir/.libnvshmem_efa_gda.so.new" "$libdir/libnvshmem_efa_gda.so"
soname=$(readelf -d "$libdir/libnvshmem_efa_gda.so" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
if [ -n "$soname" ] && [ "$soname" != libnvshmem_efa_gda.so ]; then
  ln -sfn libnvshmem_efa_gda.so "$libdir/$soname"
fi
needed_name=${soname:-libnvshmem_efa_gda.so}

# 2. The NVSHMEM plugin names: separate tiny objects, never copies of the library (two copies
#    would mean two library states in one process).
for abi in 3 4 5 6 7; do
  name=nvshmem_transport_libfabric.so.$abi
  # shellcheck disable=SC2016 # $ORIGIN is for the dynamic loader
  "$cc" -shared -fPIC -O2 -DNVSHMEM_EFA_GDA_PLUGIN_ABI=$abi -o "$libdir/.$name.new" \
    "$root/cmake/plugin_shim.c" \
    -Wl,-soname,"$name" -Wl,--no-as-needed -L"$libdir" -lnvshmem_efa_gda \
    -Wl,-rpath,'$ORIGIN' -Wl,--enable-new-dtags
  dyn=$(readelf -d "$libdir/.$name.new")
  grep -q "(SONAME).*\[$name\]" <<<"$dyn" || die "$name: wrong SONAME"
  grep -q "(NEEDED).*\[$needed_name\]" <<<"$dyn" || die "$name: does not depend on $needed_name"
  # shellcheck disable=SC2016 # a literal $ORIGIN
  grep -q '(RUNPATH).*\[\$ORIGIN\]' <<<"$dyn" || die "$name: RUNPATH is not \$ORIGIN"
  mv -f "$libdir/.$name.new" "$libdir/$name"
done

# 3. Headers.
install -m 0644 "$header" "$prefix/include/nvshmem_efa_gda.h"
n_cuda=0
if [ -d "$root/cuda" ]; then
  while IFS= read -r -d '' f; do
    rel=${f#"$root/cuda/"}
    install -D -m 0644 "$f" "$cudadir/$rel"
    n_cuda=$((n_cuda + 1))
  done < <(find "$root/cuda" \( -name test -o -name tests \) -prune -o -type f \
             \( -name '*.h' -o -name '*.cuh' -o -name '*.hpp' \) -print0)
fi

# 4. CMake package and pkg-config file.
sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }
configure() {  # template output
  sed -e "s|@NVSHMEM_EFA_GDA_VERSION@|$(sed_escape "$version")|g" \
      -e "s|@NVSHMEM_EFA_GDA_SONAME@|$(sed_escape "$soname")|g" \
      -e "s|@PREFIX@|$(sed_escape "$prefix")|g" "$1" > "$2.new"
  if grep -n '@[A-Z_]*@' "$2.new" >&2; then die "unreplaced placeholders in $2"; fi
  chmod 0644 "$2.new"
  mv -f "$2.new" "$2"
}
configure "$root/cmake/NvshmemEfaGdaConfig.cmake.in" "$cmakedir/NvshmemEfaGdaConfig.cmake"
configure "$root/cmake/NvshmemEfaGdaConfigVersion.cmake.in" "$cmakedir/NvshmemEfaGdaConfigVersion.cmake"
install -m 0644 "$root/cmake/nvshmem_efa_gda.cmake" "$cmakedir/nvshmem_efa_gda.cmake"
configure "$root/cmake/nvshmem-efa-gda.pc.in" "$libdir/pkgconfig/nvshmem-efa-gda.pc"

cat <<EOF
installed nvshmem-efa-gda $version into $prefix
  library   $libdir/libnvshmem_efa_gda.so${soname:+ (SONAME $soname)}
  plugins   $libdir/nvshmem_transport_libfabric.so.3 (NVSHMEM 3.4), .so.4 (3.5), .so.5 (3.6), .so.6 (3.7), .so.7 (3.8)
  headers   $prefix/include/nvshmem_efa_gda.h, $cudadir ($n_cuda device headers)
  cmake     CMAKE_PREFIX_PATH=$prefix  find_package(NvshmemEfaGda) -> NvshmemEfaGda::nvshmem_efa_gda
  pkgconfig PKG_CONFIG_PATH=$libdir/pkgconfig  pkg-config nvshmem-efa-gda
Use with an unmodified NVSHMEM 3.4:
  LD_PRELOAD=$libdir/nvshmem_transport_libfabric.so.3 NVSHMEM_REMOTE_TRANSPORT=libfabric <app>
EOF
