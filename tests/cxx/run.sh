#!/usr/bin/env bash
# shellcheck disable=SC2016 # single-quoted patterns and bash -c scripts are literal on purpose
# Install test: installs nvshmem-efa-gda into a temporary prefix with cmake/install.sh, then
#  - builds and runs the C++ example (tests/cxx) through find_package(NvshmemEfaGda);
#  - checks the package's version file (an impossible version is refused);
#  - checks the NVSHMEM plugin names: SONAME, DT_NEEDED, RUNPATH, no copy of the library, and
#    dlopen + dlsym("nvshmemt_init") by path, by bare name, and through LD_PRELOAD, all landing in
#    the one installed libnvshmem_efa_gda;
#  - builds a C program through pkg-config;
#  - moves the prefix and checks that the CMake package and the plugins still work.
# Uses target/release/libnvshmem_efa_gda.so and include/nvshmem_efa_gda.h of this repository
# (NVSHMEM_EFA_GDA_BUILD_DIR / NVSHMEM_EFA_GDA_INCLUDE_DIR override them); skips when they are absent.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=${NVSHMEM_EFA_GDA_BUILD_DIR:-$root/target/release}
include_dir=${NVSHMEM_EFA_GDA_INCLUDE_DIR:-$root/include}
cc=${CC:-cc}

if [ ! -f "$build_dir/libnvshmem_efa_gda.so" ]; then
  echo "SKIP: $build_dir/libnvshmem_efa_gda.so not built (run cargo build --release)"
  exit 0
fi
if [ ! -f "$include_dir/nvshmem_efa_gda.h" ]; then
  echo "SKIP: $include_dir/nvshmem_efa_gda.h not present"
  exit 0
fi
for tool in cmake "$cc" readelf nm; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done
# The library needs its libfabric at load time; use the project's build when there is one.
if [ -f "$root/.deps/libfabric.env" ]; then
  # shellcheck disable=SC1091
  . "$root/.deps/libfabric.env"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/negda-cxx.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
passed=0
failed=0
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
# check <description> <command...>: runs the command, its output goes to $tmp/last.log
check() {
  local what=$1
  shift
  if "$@" >"$tmp/last.log" 2>&1; then
    pass "$what"
  else
    fail "$what"
    sed 's/^/    /' "$tmp/last.log"
  fi
}

version=$(awk '/^\[/ { in_pkg = ($0 == "[package]") } in_pkg && /^version[[:space:]]*=/ {
                 gsub(/^version[[:space:]]*=[[:space:]]*"|".*$/, ""); print; exit }' "$root/Cargo.toml")

# 1. install
if ! PREFIX=$prefix "$root/cmake/install.sh" --build-dir "$build_dir" --include-dir "$include_dir" \
     >"$tmp/install.log" 2>&1; then
  sed 's/^/    /' "$tmp/install.log"
  fail "cmake/install.sh"
  echo "$passed passed, $failed failed"
  exit 1
fi
pass "cmake/install.sh into $prefix"
lib=$prefix/lib

# 2. C++ example through the CMake package
cmake_example() {  # prefix build-dir [extra cmake args]
  local p=$1 b=$2
  shift 2
  cmake -S "$root/tests/cxx" -B "$b" -DCMAKE_PREFIX_PATH="$p" "$@" &&
    cmake --build "$b" &&
    "$b/efa_gda_cxx_example"
}
check "C++ example: find_package(NvshmemEfaGda), build, run" cmake_example "$prefix" "$tmp/build"
check "find_package(NvshmemEfaGda $version) accepted" \
  cmake_example "$prefix" "$tmp/build-v" -DNEGDA_REQUIRED_VERSION="$version"
check "find_package(NvshmemEfaGda 999.0) refused" \
  bash -c '! cmake -S "$1" -B "$2" -DCMAKE_PREFIX_PATH="$3" -DNEGDA_REQUIRED_VERSION=999.0' _ \
  "$root/tests/cxx" "$tmp/build-bad" "$prefix"

# 3. plugin names
for abi in 3 4; do
  name=nvshmem_transport_libfabric.so.$abi
  dyn=$(readelf -d "$lib/$name" 2>&1 || true)
  check "$name: SONAME is $name" grep -q "(SONAME).*\[$name\]" <<<"$dyn"
  check "$name: DT_NEEDED libnvshmem_efa_gda" grep -q '(NEEDED).*\[libnvshmem_efa_gda\.so' <<<"$dyn"
  check "$name: RUNPATH \$ORIGIN" grep -q '(RUNPATH).*\[\$ORIGIN\]' <<<"$dyn"
  check "$name: a shim, not a copy (does not define nvshmemt_init itself)" \
    bash -c '! nm -D --defined-only "$1" | awk "{print \$NF}" | grep -qx nvshmemt_init' _ "$lib/$name"
done

check "compile dlopen_plugin.c" "$cc" -Wall -Wextra -O2 -o "$tmp/dlopen_plugin" \
  "$root/tests/cxx/dlopen_plugin.c" -ldl
check "dlopen by path: .so.3 and .so.4 resolve nvshmemt_init to one library copy" \
  "$tmp/dlopen_plugin" "$lib" "$lib/nvshmem_transport_libfabric.so.3" "$lib/nvshmem_transport_libfabric.so.4"
check "dlopen by bare name (LD_LIBRARY_PATH), as NVSHMEM does" \
  env LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$tmp/dlopen_plugin" "$lib" nvshmem_transport_libfabric.so.3
check "LD_PRELOAD of .so.3, then dlopen by bare name reuses it (SONAME match)" \
  env LD_PRELOAD="$lib/nvshmem_transport_libfabric.so.3" \
  "$tmp/dlopen_plugin" "$lib" nvshmem_transport_libfabric.so.3
check "LD_PRELOAD of .so.4 for NVSHMEM 3.5" \
  env LD_PRELOAD="$lib/nvshmem_transport_libfabric.so.4" \
  "$tmp/dlopen_plugin" "$lib" nvshmem_transport_libfabric.so.4

# 4. pkg-config
if command -v pkg-config >/dev/null; then
  export PKG_CONFIG_PATH="$lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  check "pkg-config --modversion nvshmem-efa-gda = $version" \
    bash -c '[ "$(pkg-config --modversion nvshmem-efa-gda)" = "$1" ]' _ "$version"
  pc_build() {
    # shellcheck disable=SC2046 # word splitting of pkg-config output is intended
    "$cc" -std=c11 -Wall -Wextra -o "$tmp/pc_check" "$root/tests/cxx/pkgconfig_check.c" \
      $(pkg-config --cflags --libs nvshmem-efa-gda) &&
      LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/pc_check" "$version"
  }
  check "C program through pkg-config: build and run" pc_build
else
  echo "SKIP: pkg-config not found"
fi

# 5. relocated prefix
mv "$prefix" "$tmp/moved"
check "moved prefix: C++ example through the CMake package" cmake_example "$tmp/moved" "$tmp/build-moved"
check "moved prefix: plugin still resolves through \$ORIGIN" \
  "$tmp/dlopen_plugin" "$tmp/moved/lib" "$tmp/moved/lib/nvshmem_transport_libfabric.so.3"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
