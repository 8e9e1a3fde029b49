#!/usr/bin/env bash
# shellcheck disable=SC2016 # the single-quoted bash -c scripts expand their own arguments
# Splice-kit test: patches/apply.sh and the NVSHMEM patches, on real NVSHMEM sources.
#
#   tests/splice/run.sh
#
# Sources, per version (a temporary copy is patched; the originals are never touched):
#   3.4.5  $NVSHMEM_SRC_3_4_5, else tag v3.4.5-0 of the mirror
#   3.5    $NVSHMEM_SRC_3_5,   else branch devel (3.5.1) of the mirror
#   3.5.0  $NVSHMEM_SRC_3_5_0, else branch main of the mirror (the 3.5.x patch on 3.5.0)
#   3.6, 3.7, 3.8  $NVSHMEM_SRC_3_6, $NVSHMEM_SRC_3_7, $NVSHMEM_SRC_3_8 only (no public tree of
#          these releases can be fetched; the multi-NIC patch is checked by (d) without one)
# The mirror is $NVSHMEM_MIRROR (default /work/.mirror/NVIDIA+nvshmem/repo), a git repository.
#
# (a) apply.sh: --check, apply, "already applied" on a second run, --revert restores the tree byte
#     for byte; refuses (exit 2) an unknown version, a wrong transport ABI, a tree the patch does not
#     match, a directory that is not NVSHMEM; works in a tree nested inside another git work tree;
#     the patched libfabric.cpp has the include at top level, GDA on the proxy endpoint after the
#     AV is filled, GDA stopped before the first fi_close of finalize, the new host op set.
# (b) compile: the patched libfabric.cpp (C++11, as NVSHMEM builds its transports) with CUDA,
#     libfabric, NVSHMEM and our include/ headers; the version and build-option headers NVSHMEM's
#     configure would make are generated into a temporary directory; no new compiler warnings;
#     every nvshmem(t)_efa_gda_* reference is defined by target/release/libnvshmem_efa_gda.so, and
#     the object links with NVSHMEM's transport_common.cpp into a complete plugin with
#     -Wl,--no-undefined against the library, libfabric and the static CUDA runtime.
# (c) NVSHMEM's own CMake: configures the patched tree (libfabric transport only) against a
#     prefix made by cmake/install.sh and builds nvshmem_transport_libfabric, in the main build
#     and in the transport-plugin build NVSHMEM ships; the plugin depends on libnvshmem_efa_gda,
#     exports only nvshmemt_init and keeps its own nvshmemt_init for dlsym. Set
#     NEGDA_SPLICE_NVSHMEM_BUILD=0 to leave it out.
#
# (d) the 3.6-3.8 (multi-NIC) patch without an NVSHMEM tree: it parses, keeps at most two lines of
#     context on either side of each hunk, adds the same CMake as the 3.5.x patch; its additions
#     to libfabric.cpp compile (C++11, -Werror) against tests/splice/multinic_harness.cpp's
#     stand-ins for the transport and libfabric and run there (GDA on an endpoint of its own, with
#     its own CQs and AV, on the first proxy endpoint's domain; its transmit CQ to set_cq; fi_addrs
#     from every PE's endpoint name inserted into the GDA AV; the heap and keys of the proxy domain;
#     agreement of every PE; GDA stopped and its endpoint closed before the stock release and
#     finalize; failures to open the endpoint or to take its CQ), with the ABI 5 host-op signatures and with an extra
#     parameter on each; every GDA call it makes is defined by libnvshmem_efa_gda.so; apply.sh
#     routes 3.6/3.7/3.8 trees with ABIs 5/6/7 to it and refuses other ABIs for them.
#
# Inputs: CUDA headers from $CUDA_HOME or the project's PyPI CUDA (.deps/cuda-venv); libfabric from
# $LIBFABRIC_HOME or .deps/libfabric (waits up to $NEGDA_WAIT_LIBFABRIC_S seconds, default 900, for
# its build to finish). Parts whose inputs are missing print SKIP. The last line is
# "N passed, M failed"; the exit status is non-zero when something failed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
apply=$root/patches/apply.sh
mirror=${NVSHMEM_MIRROR:-/work/.mirror/NVIDIA+nvshmem/repo}
lib=${NVSHMEM_EFA_GDA_BUILD_DIR:-$root/target/release}/libnvshmem_efa_gda.so
include_dir=${NVSHMEM_EFA_GDA_INCLUDE_DIR:-$root/include}
cxx=${CXX:-g++}
gda_funcs="nvshmemt_efa_gda_init_on_ep nvshmemt_efa_gda_fini nvshmemt_efa_gda_set_cq
nvshmemt_efa_gda_connect nvshmemt_efa_gda_set_local_heap nvshmemt_efa_gda_set_remote_heap
nvshmemt_efa_gda_mode"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/negda-splice.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
skip() { echo "SKIP: $*"; }
show() { sed 's/^/    /' "$1" | tail -n "${2:-40}"; }
# check <description> <command...>: command output goes to $tmp/last.log, shown on failure.
check() {
  local what=$1
  shift
  if "$@" >"$tmp/last.log" 2>&1; then pass "$what"; else fail "$what"; show "$tmp/last.log"; fi
}
# expect_rc <rc> <grep pattern> <description> <command...>: exit status and a line of output.
expect_rc() {
  local want=$1 pattern=$2 what=$3 rc=0
  shift 3
  "$@" >"$tmp/last.log" 2>&1 || rc=$?
  if [ "$rc" -eq "$want" ] && grep -q -- "$pattern" "$tmp/last.log"; then
    pass "$what"
  else
    fail "$what (exit $rc, wanted $want and /$pattern/)"
    show "$tmp/last.log"
  fi
}

# ---------------------------------------------------------------- inputs
cuda=
for c in "${CUDA_HOME:-}" "$root/.deps/cuda-venv/lib/python3.11/site-packages/nvidia/cu13" /usr/local/cuda; do
  if [ -n "$c" ] && [ -f "$c/include/cuda.h" ] && [ -f "$c/include/cuda_runtime.h" ]; then cuda=$c; break; fi
done
libfabric=${LIBFABRIC_HOME:-}
if [ -z "$libfabric" ] && [ -d "$root/.deps/libfabric" ]; then
  stamp=$root/.deps/libfabric/.complete-2.1.0-v1
  waited=0
  while [ ! -f "$stamp" ] && [ "$waited" -lt "${NEGDA_WAIT_LIBFABRIC_S:-900}" ]; do
    [ "$waited" -eq 0 ] && echo "waiting for the libfabric build ($stamp)"
    sleep 10
    waited=$((waited + 10))
  done
  [ -f "$stamp" ] && libfabric=$root/.deps/libfabric
fi
[ -n "$libfabric" ] && [ ! -f "$libfabric/include/rdma/fabric.h" ] && libfabric=
have_header=0
[ -f "$include_dir/nvshmem_efa_gda.h" ] && have_header=1
have_lib=0
[ -f "$lib" ] && have_lib=1
if [ -f "$root/.deps/libfabric.env" ] && [ -z "${LIBFABRIC_HOME:-}" ]; then
  # shellcheck disable=SC1091 # runtime search path for the library's libfabric
  . "$root/.deps/libfabric.env"
fi

# ---------------------------------------------------------------- helpers
# materialise <label> <mirror ref> <env var>: prints the directory of a pristine copy, or nothing.
materialise() {
  local ref=$2 var=$3 dir=$tmp/pristine-$1 given=${!3:-}
  if [ -n "$given" ]; then
    [ -d "$given" ] || { echo "run.sh: $var=$given is not a directory" >&2; return 1; }
    cp -a "$given" "$dir"
    # A tree that already carries the splice is taken back to the pristine state first.
    if "$apply" --check "$dir" 2>/dev/null | grep -q 'already applied'; then
      "$apply" --revert "$dir" >/dev/null
    fi
  elif git -C "$mirror" rev-parse --verify -q "$ref^{commit}" >/dev/null 2>&1; then
    mkdir -p "$dir"
    git -C "$mirror" archive "$ref" | tar -x -C "$dir"
  else
    return 0
  fi
  echo "$dir"
}

# first_line/last_line <file> <regex> <from> <to>: line number of the first/last match of <regex>
# between lines <from> and <to>, or 0.
# (The regex travels through the environment: awk -v would eat its backslashes.)
first_line() { RE=$2 awk -v a="$3" -v b="$4" 'NR >= a && NR <= b && $0 ~ ENVIRON["RE"] { print NR; f = 1; exit }
                                               END { if (!f) print 0 }' "$1"; }
last_line() { RE=$2 awk -v a="$3" -v b="$4" 'NR >= a && NR <= b && $0 ~ ENVIRON["RE"] { n = NR }
                                              END { print n + 0 }' "$1"; }
# Line range of a top-level function definition: "<start> <end>" (end = its closing brace).
func_range() {
  awk -v name="$2" '
    !s && $0 ~ ("^(static )?int " name "\\(") { s = NR }
    s && !e && /^}/ { e = NR }
    END { print s + 0, e + 0 }' "$1"
}

# include_at_top_level <file>: nvshmem_efa_gda.h is included at preprocessor depth 0.
include_at_top_level() {
  awk '
    /^[[:space:]]*#[[:space:]]*if/ { d++ }
    /^[[:space:]]*#[[:space:]]*endif/ { d-- }
    /^[[:space:]]*#[[:space:]]*include[[:space:]]*"nvshmem_efa_gda\.h"/ { found = 1; if (d != 0) bad = 1 }
    END { exit !(found && !bad) }' "$1"
}

structure_checks() {  # <label> <patched libfabric.cpp>
  local v=$1 f=$2 s e l1 l2
  # The include sits at preprocessor depth 0 (not under NVSHMEM_USE_GDRCOPY or anything else).
  check "$v: nvshmem_efa_gda.h included outside any #if" include_at_top_level "$f"
  check "$v: GDA on an endpoint of its own (own CQs and AV), its transmit CQ to set_cq, never NVSHMEM's endpoints" bash -c '
    grep -q "ret = nvshmemt_libfabric_gda_open_ep(state->domain, state->prov_info);" "$1" &&
    grep -q "nvshmemt_efa_gda_init_on_ep(state->domain, nvshmemt_libfabric_gda_ep)" "$1" &&
    grep -q "nvshmemt_efa_gda_set_cq(nvshmemt_libfabric_gda_tx_cq)" "$1" &&
    ! grep -q "nvshmemt_efa_gda_init_on_ep([^)]*eps\[" "$1" &&
    grep -q "fi_av_insert(nvshmemt_libfabric_gda_av, addrs" "$1" &&
    grep -q "t->boot_handle->allgather(&self, peers" "$1"' _ "$f"
  read -r s e < <(func_range "$f" nvshmemt_libfabric_connect_endpoints)
  l1=$(last_line "$f" 'fi_av_insert\(' "$s" "$e")
  l2=$(first_line "$f" 'nvshmemt_libfabric_gda_connect\(t, state\)' "$s" "$e")
  check "$v: GDA connect in connect_endpoints after the AV is filled (lines $l1 < $l2)" \
    test "$s" -gt 0 -a "$l1" -gt 0 -a "$l2" -gt "$l1"
  l1=$(last_line "$f" 'fi_enable\(' "$s" "$e")
  check "$v: ... and after the endpoints are enabled (lines $l1 < $l2)" test "$l1" -gt 0 -a "$l2" -gt "$l1"
  read -r s e < <(func_range "$f" nvshmemt_libfabric_finalize)
  l1=$(first_line "$f" 'nvshmemt_libfabric_gda_stop\(\)' "$s" "$e")
  l2=$(first_line "$f" 'fi_close\(' "$s" "$e")
  check "$v: GDA stopped at the start of finalize, before any fi_close (lines $l1 < $l2)" \
    test "$s" -gt 0 -a "$l1" -gt 0 -a "$l2" -gt "$l1"
  read -r s e < <(func_range "$f" nvshmemt_libfabric_get_mem_handle)
  l1=$(first_line "$f" 'nvshmemt_libfabric_gda_local_heap\(' "$s" "$e")
  check "$v: local heap set in get_mem_handle" test "$l1" -gt 0
  check "$v: add_device_remote_mem_handles host op installed" \
    grep -q "host_ops.add_device_remote_mem_handles =" "$f"
}

structure_checks_multinic() {  # <label> <patched libfabric.cpp>
  local v=$1 f=$2 s e l1 l2 l3 last_def
  check "$v: nvshmem_efa_gda.h included outside any #if" include_at_top_level "$f"
  check "$v: GDA on an endpoint of its own on the first proxy endpoint's domain (index num_host_domains)" bash -c '
    grep -q "const int proxy = state->num_host_domains;" "$1" &&
    grep -q "ret = nvshmemt_libfabric_gda_open_ep(state->domains\[d\], state->prov_infos\[d\]);" "$1" &&
    grep -q "nvshmemt_efa_gda_init_on_ep(state->domains\[d\], nvshmemt_libfabric_gda_ep)" "$1" &&
    grep -q "nvshmemt_efa_gda_set_cq(nvshmemt_libfabric_gda_tx_cq)" "$1" &&
    ! grep -q "nvshmemt_efa_gda_init_on_ep([^)]*eps\[" "$1"' _ "$f"
  # The wrappers call the stock functions, so they must come after their definitions.
  last_def=$(awk '/^static int nvshmemt_libfabric_(connect_endpoints|get_mem_handle|release_mem_handle|finalize)\(/ { n = NR } END { print n + 0 }' "$f")
  l1=$(first_line "$f" '^static void nvshmemt_libfabric_gda_hook_host_ops\(' 1 999999)
  l2=$(first_line "$f" '^/\* Public Functions \*/' 1 999999)
  check "$v: GDA wrappers after the stock host ops' definitions (lines $last_def < $l1 < $l2)" \
    test "$last_def" -gt 0 -a "$l1" -gt "$last_def" -a "$l2" -gt "$l1"
  read -r s e < <(func_range "$f" nvshmemt_init)
  l1=$(last_line "$f" 'host_ops\.(connect_endpoints|get_mem_handle|release_mem_handle|finalize|add_device_remote_mem_handles) =' "$s" "$e")
  l2=$(first_line "$f" 'nvshmemt_libfabric_gda_hook_host_ops\(transport\);' "$s" "$e")
  l3=$(first_line "$f" 'transport->attr = ' "$s" "$e")
  check "$v: hooks installed after the stock host ops are set, before attr (lines $l1 < $l2 < $l3)" \
    test "$s" -gt 0 -a "$l1" -gt 0 -a "$l2" -gt "$l1" -a "$l3" -gt "$l2"
}

# gen_headers <tree> <out dir>: the two headers NVSHMEM's configure writes into src/include/non_abi.
gen_headers() {
  local t=$1 out=$2/non_abi ver maj min pat twk tmaj bmaj
  mkdir -p "$out"
  ver=$(awk '/^[[:space:]]*project[[:space:]]*\(/ { p = 1 }
             p { for (i = 1; i <= NF; i++) if ($i == "VERSION") { print $(i + 1); exit } }' "$t/CMakeLists.txt" | tr -d ')')
  IFS=. read -r maj min pat twk <<<"$ver"
  tmaj=$(sed -n 's/^set(TRANSPORT_VERSION_MAJOR \([0-9]*\))/\1/p' "$t/src/CMakeLists.txt")
  bmaj=$(sed -n 's/^set(BOOTSTRAP_VERSION_MAJOR \([0-9]*\))/\1/p' "$t/src/CMakeLists.txt")
  sed -e "s/@PROJECT_VERSION_MAJOR@/$maj/; s/@PROJECT_VERSION_MINOR@/$min/" \
      -e "s/@PROJECT_VERSION_PATCH@/$pat/; s/@PROJECT_VERSION_TWEAK@/${twk:-0}/" \
      -e "s/@TRANSPORT_VERSION_MAJOR@/$tmaj/; s/@TRANSPORT_VERSION_MINOR@/0/; s/@TRANSPORT_VERSION_PATCH@/0/" \
      -e "s/@BOOTSTRAP_VERSION_MAJOR@/$bmaj/; s/@BOOTSTRAP_VERSION_MINOR@/0/; s/@BOOTSTRAP_VERSION_PATCH@/0/" \
      -e 's/@INFO_BUILD_VARS@/""/' \
      "$t/src/include/non_abi/nvshmem_version.h.in" >"$out/nvshmem_version.h"
  sed -e 's|^#cmakedefine NVSHMEM_LIBFABRIC_SUPPORT$|#define NVSHMEM_LIBFABRIC_SUPPORT|' \
      -e 's|^#cmakedefine \(.*\)$|/* #undef \1 */|' \
      "$t/src/include/non_abi/nvshmem_build_options.h.in" >"$out/nvshmem_build_options.h"
  ! grep -q '@[A-Z_]*@' "$out/nvshmem_version.h"
}

first_file() {  # first existing path among the arguments (globs already expanded), or nothing
  local f
  for f in "$@"; do [ -e "$f" ] && { echo "$f"; return; }; done
  return 0
}

cuda_static_rt() {  # path of libcudart_static.a, or nothing
  local d
  for d in "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib"; do
    [ -f "$d/libcudart_static.a" ] && { echo "$d/libcudart_static.a"; return; }
  done
}

compile_checks() {  # <label> <pristine tree> <patched tree> [C++ standard]
  local v=$1 p=$2 t=$3 std=${4:-c++11} w=$tmp/cc-$1 inc rt missing=() undef sym
  mkdir -p "$w"
  if [ "$have_header" -eq 0 ]; then skip "$v: compile: $include_dir/nvshmem_efa_gda.h not present"; return; fi
  if [ -z "$cuda" ]; then skip "$v: compile: no CUDA headers (set CUDA_HOME)"; return; fi
  if [ -z "$libfabric" ]; then skip "$v: compile: no libfabric (set LIBFABRIC_HOME)"; return; fi
  for sym in $gda_funcs; do grep -q "\b$sym *(" "$include_dir/nvshmem_efa_gda.h" || missing+=("$sym"); done
  if [ ${#missing[@]} -gt 0 ]; then
    fail "$v: $include_dir/nvshmem_efa_gda.h declares the GDA API (missing: ${missing[*]}); compile not tried"
    return
  fi
  check "$v: generate nvshmem_version.h and nvshmem_build_options.h" gen_headers "$t" "$w/gen"
  inc=(-DNVSHMEM_X86_64 -I"$w/gen" -I"$t/src/include" -I"$t/src/modules/transport/common"
       -I"$libfabric/include" -I"$cuda/include" -I"$include_dir")
  "$cxx" -std="$std" -Wall -Wextra -fPIC -c -o "$w/pristine.o" "${inc[@]/$t/$p}" \
    "$p/src/modules/transport/libfabric/libfabric.cpp" 2>"$w/pristine.warn" || true
  if "$cxx" -std="$std" -Wall -Wextra -fPIC -c -o "$w/libfabric.o" "${inc[@]}" \
       "$t/src/modules/transport/libfabric/libfabric.cpp" 2>"$w/patched.warn"; then
    pass "$v: patched libfabric.cpp compiles (g++ -std=$std)"
  else
    fail "$v: patched libfabric.cpp compiles (g++ -std=$std)"
    grep -E 'error' "$w/patched.warn" | head -20 | sed 's/^/    /'
    return
  fi
  check "$v: no new compiler warnings ($(grep -c 'warning:' "$w/pristine.warn" || true) before)" \
    test "$(grep -c 'warning:' "$w/patched.warn" || true)" -le "$(grep -c 'warning:' "$w/pristine.warn" || true)"

  undef=$(nm -u "$w/libfabric.o" | awk '{print $NF}' | grep -E 'nvshmemt?_efa_gda' || true)
  check "$v: no C++-mangled references to the C API" bash -c '! grep -q "^_Z" <<<"$1"' _ "$undef"
  for sym in $gda_funcs; do grep -qx "$sym" <<<"$undef" || missing+=("$sym"); done
  check "$v: the object calls the whole GDA API (missing: ${missing[*]:-none})" test ${#missing[@]} -eq 0
  if [ "$have_lib" -eq 0 ]; then
    skip "$v: symbol and link checks: $lib not built (cargo build --release)"
    return
  fi
  missing=()
  local defined
  defined=$(nm -D --defined-only "$lib" | awk '{print $NF}')
  for sym in $undef; do grep -qx "$sym" <<<"$defined" || missing+=("$sym"); done
  check "$v: every GDA symbol the patch calls is defined by $(basename "$lib") (missing: ${missing[*]:-none})" \
    test ${#missing[@]} -eq 0
  rt=$(cuda_static_rt)
  if [ -z "$rt" ]; then skip "$v: full link: no libcudart_static.a under $cuda"; return; fi
  check "$v: compile NVSHMEM's transport_common.cpp" "$cxx" -std="$std" -fPIC -c -o "$w/common.o" "${inc[@]}" \
    "$t/src/modules/transport/common/transport_common.cpp"
  check "$v: link a complete plugin with -Wl,--no-undefined against libnvshmem_efa_gda" \
    "$cxx" -shared -o "$w/nvshmem_transport_libfabric.so" "$w/libfabric.o" "$w/common.o" \
    -Wl,--no-undefined -Wl,--version-script="$t/nvshmem_transport.sym" \
    -L"$(dirname "$lib")" -lnvshmem_efa_gda -L"$libfabric/lib" -lfabric "$rt" -ldl -lpthread -lrt
  check "$v: ... and without the library the link fails on exactly the GDA symbols" bash -c '
    out=$("${@:2}" 2>&1) && exit 1
    n=$(grep -oE "undefined reference to .nvshmemt?_efa_gda[a-z_]*" <<<"$out" | sort -u | wc -l)
    other=$(grep "undefined reference" <<<"$out" | grep -vc "nvshmemt\?_efa_gda" || true)
    [ "$n" -eq "$1" ] && [ "$other" -eq 0 ]' _ "$(wc -w <<<"$gda_funcs")" \
    "$cxx" -shared -o "$w/unlinked.so" "$w/libfabric.o" "$w/common.o" -Wl,--no-undefined \
    -L"$libfabric/lib" -lfabric "$rt" -ldl -lpthread -lrt
}

nvshmem_cmake_checks() {  # <label> <patched tree>
  local v=$1 t=$2 w=$tmp/nv-$1 args so dyn
  if [ "${NEGDA_SPLICE_NVSHMEM_BUILD:-1}" = 0 ]; then skip "$v: NVSHMEM CMake build (NEGDA_SPLICE_NVSHMEM_BUILD=0)"; return; fi
  if [ "$have_lib" -eq 0 ] || [ "$have_header" -eq 0 ]; then
    skip "$v: NVSHMEM CMake build: needs $lib and $include_dir/nvshmem_efa_gda.h"; return
  fi
  if [ -z "$cuda" ] || [ ! -x "$cuda/bin/nvcc" ] || [ -z "$libfabric" ] || ! command -v cmake >/dev/null; then
    skip "$v: NVSHMEM CMake build: needs cmake, nvcc under CUDA_HOME and libfabric"; return
  fi
  mkdir -p "$w"
  if [ ! -d "$tmp/prefix" ]; then
    check "install into a temporary prefix (cmake/install.sh)" env PREFIX="$tmp/prefix" \
      "$root/cmake/install.sh" --build-dir "$(dirname "$lib")" --include-dir "$include_dir"
  fi
  args=(-DCUDA_HOME="$cuda" -DCMAKE_CUDA_ARCHITECTURES=90 -DLIBFABRIC_HOME="$libfabric"
        -DNVSHMEM_EFA_GDA_ROOT="$tmp/prefix" -DNVSHMEM_USE_GDRCOPY=OFF -DNVSHMEM_USE_MLX5DV=OFF)
  # A CUDA tree laid out like the PyPI wheels (lib/, libcudart.so.N only, no driver stub) needs
  # these hints; a regular toolkit does not.
  if [ ! -d "$cuda/lib64" ] && [ -d "$cuda/lib" ]; then args+=(-DCMAKE_CUDA_FLAGS="-L$cuda/lib"); fi
  local rt_so drv
  rt_so=$(first_file "$cuda"/lib*/libcudart.so "$cuda"/lib*/libcudart.so.*)
  [ -n "$rt_so" ] && args+=(-DCUDA_CUDART="$rt_so")
  drv=$(first_file "$cuda"/lib*/stubs/libcuda.so "$cuda"/lib*/libcuda.so)
  # CUDA::cuda_driver is linked only by nvshmem-info, which is not built here; any existing file
  # lets the build system generate.
  [ -n "$drv" ] || args+=(-DCUDA_cuda_driver_LIBRARY="${rt_so:-/dev/null}")

  check "$v: NVSHMEM configure (libfabric transport only, NVSHMEM_EFA_GDA_ROOT=prefix)" \
    cmake -S "$t" -B "$w/build" "${args[@]}" -DNVSHMEM_LIBFABRIC_SUPPORT=ON \
    -DNVSHMEM_MPI_SUPPORT=OFF -DNVSHMEM_IBRC_SUPPORT=OFF -DNVSHMEM_NVTX=OFF \
    -DNVSHMEM_BUILD_TESTS=OFF -DNVSHMEM_BUILD_EXAMPLES=OFF -DNVSHMEM_BUILD_PYTHON_LIB=OFF \
    -DNVSHMEM_BUILD_HYDRA_LAUNCHER=OFF -DNVSHMEM_BUILD_TXZ_PACKAGE=OFF -DNVSHMEM_BUILD_BITCODE_LIBRARY=OFF
  [ -f "$w/build/Makefile" ] || return 0
  check "$v: NVSHMEM builds nvshmem_transport_libfabric" \
    cmake --build "$w/build" --target nvshmem_transport_libfabric -j "$(nproc)"
  so=$(first_file "$w"/build/src/lib/nvshmem_transport_libfabric.so.[0-9])
  [ -n "$so" ] || return 0
  plugin_checks "$v (NVSHMEM build)" "$so"

  # The transport-plugin build takes the library from this source tree (NVSHMEM_EFA_GDA_ROOT=<repo>)
  # when the headers are the tree's own, else from the prefix again.
  local tp=$w/build/src/share/src/transport-plugins tp_root=$tmp/prefix
  if [ "$include_dir" = "$root/include" ]; then tp_root=$root; fi
  check "$v: transport-plugin build configures (NVSHMEM_EFA_GDA_ROOT=$tp_root)" \
    cmake -S "$tp" -B "$w/tp" "${args[@]/-DNVSHMEM_EFA_GDA_ROOT=*/-DNVSHMEM_EFA_GDA_ROOT=$tp_root}" \
    -DNVSHMEM_EFA_GDA_LIBRARY="$lib" -DNVSHMEM_BUILD_LIBFABRIC_TRANSPORT=ON
  [ -f "$w/tp/Makefile" ] || return 0
  check "$v: transport-plugin build makes nvshmem_transport_libfabric" \
    cmake --build "$w/tp" --target nvshmem_transport_libfabric -j "$(nproc)"
  so=$(first_file "$w"/tp/libfabric/nvshmem_transport_libfabric.so.[0-9])
  [ -n "$so" ] && plugin_checks "$v (transport-plugin build)" "$so"
}

plugin_checks() {  # <label> <built plugin>
  local v=$1 so=$2 dyn
  dyn=$(readelf -d "$so")
  check "$v: $(basename "$so") depends on libnvshmem_efa_gda" grep -q '(NEEDED).*\[libnvshmem_efa_gda\.so' <<<"$dyn"
  check "$v: exports only nvshmemt_init" bash -c \
    '[ "$(nm -D --defined-only "$1" | awk "{print \$NF}" | sort -u | tr "\n" " ")" = "nvshmemt_init " ]' _ "$so"
  check "$v: dlsym(plugin, nvshmemt_init) is the plugin's own" "$tmp/dlsym_owner" "$so" nvshmemt_init "$so"
}

# ---------------------------------------------------------------- (a) + (b) + (c) per version
if command -v cc >/dev/null; then
  cc -O2 -o "$tmp/dlsym_owner" "$root/tests/splice/dlsym_owner.c" -ldl
fi

cases=("3.4.5|v3.4.5-0|NVSHMEM_SRC_3_4_5" "3.5|devel|NVSHMEM_SRC_3_5" "3.5.0|main|NVSHMEM_SRC_3_5_0"
       "3.6|-|NVSHMEM_SRC_3_6" "3.7|-|NVSHMEM_SRC_3_7" "3.8|-|NVSHMEM_SRC_3_8")
n_sources=0
for c in "${cases[@]}"; do
  IFS='|' read -r v ref var <<<"$c"
  src=$(materialise "$v" "$ref" "$var") || { fail "$v: $var"; continue; }
  if [ -z "$src" ]; then
    if [ "$ref" = - ]; then
      skip "NVSHMEM $v: no public source tree to fetch; set $var to check the patch on one"
    else
      skip "NVSHMEM source not available (set $var, or provide the mirror $mirror with $ref)"
    fi
    continue
  fi
  multinic=0
  case $v in 3.6* | 3.7* | 3.8*) multinic=1 ;; esac
  n_sources=$((n_sources + 1))
  t=$tmp/tree-$v
  cp -a "$src" "$t"
  echo "== NVSHMEM $v ($([ -n "${!var:-}" ] && echo "${!var}" || echo "$ref"))"
  expect_rc 0 'applies cleanly' "$v: apply.sh --check" "$apply" --check "$t"
  expect_rc 0 '^applied:' "$v: apply.sh applies" "$apply" "$t"
  expect_rc 0 'already applied' "$v: apply.sh again: already applied" "$apply" "$t"
  cp -a "$t" "$tmp/rev-$v"
  expect_rc 0 'reverted' "$v: apply.sh --revert" "$apply" --revert "$tmp/rev-$v"
  check "$v: revert restores the pristine tree" diff -r "$src" "$tmp/rev-$v"
  if [ "$multinic" = 1 ]; then
    structure_checks_multinic "$v" "$t/src/modules/transport/libfabric/libfabric.cpp"
  else
    structure_checks "$v" "$t/src/modules/transport/libfabric/libfabric.cpp"
  fi

  bad=$tmp/bad-$v
  cp -a "$src" "$bad"
  sed -i -E '/^[[:space:]]*project[[:space:]]*\(/,/\)/ s/VERSION[[:space:]]+[0-9.]+/VERSION 9.9.9.0/' "$bad/CMakeLists.txt"
  expect_rc 2 'unsupported NVSHMEM 9.9.9' "$v: unknown version refused (exit 2)" "$apply" "$bad"
  rm -rf "$bad" && cp -a "$src" "$bad"
  sed -i -E 's/^set\(TRANSPORT_VERSION_MAJOR [0-9]+\)/set(TRANSPORT_VERSION_MAJOR 99)/' "$bad/src/CMakeLists.txt"
  expect_rc 2 'transport ABI 99' "$v: wrong transport ABI refused (exit 2)" "$apply" "$bad"
  rm -rf "$bad" && cp -a "$src" "$bad"
  if [ "$multinic" = 1 ]; then  # a line the multi-NIC patch's last hunk needs
    sed -i '/transport->host_ops.enforce_cst = nvshmemt_libfabric_enforce_cst;/d' "$bad/src/modules/transport/libfabric/libfabric.cpp"
  else
    sed -i '/libfabric_state->local_mem_ptr = buf;/d' "$bad/src/modules/transport/libfabric/libfabric.cpp"
  fi
  expect_rc 2 'does not apply' "$v: non-matching tree refused (exit 2)" "$apply" "$bad"
  rm -rf "$bad"
  nested=$tmp/outer-$v
  mkdir -p "$nested" && git -C "$nested" init -q && cp -a "$src" "$nested/nvshmem"
  expect_rc 0 '^applied:' "$v: tree nested in another git work tree" "$apply" "$nested/nvshmem"
  check "$v: ... and the nested tree is really patched" \
    grep -q 'nvshmem-efa-gda splice' "$nested/nvshmem/src/modules/transport/libfabric/libfabric.cpp"

  if [ "$multinic" = 1 ]; then
    compile_checks "$v" "$src" "$t" c++17  # NVSHMEM 3.6+ builds with CMAKE_CXX_STANDARD 17
  else
    compile_checks "$v" "$src" "$t"
  fi
  nvshmem_cmake_checks "$v" "$t"
done

# ---------------------------------------------------------------- (d) the multi-NIC patch alone
mn_patch=$root/patches/nvshmem-3.6-3.8/0001-libfabric-efa-gda-splice.patch
mn=$tmp/multinic
mkdir -p "$mn"
check "3.6-3.8: the patch parses (git apply --stat)" git apply --stat "$mn_patch"
check "3.6-3.8: at most two context lines either side of every hunk" awk '
  function end_hunk() { if (inh && (lead > 2 || trail > 2)) bad = 1; inh = 0 }
  /^diff --git / { end_hunk(); next }
  /^@@ / { end_hunk(); inh = 1; lead = 0; trail = 0; seen_plus = 0; next }
  inh && /^\+/ { seen_plus = 1; trail = 0; next }
  inh && /^ / { if (seen_plus) trail++; else lead++; next }
  END { end_hunk(); exit bad }' "$mn_patch"
# shellcheck disable=SC2016 # the CMake text itself holds ${...}
check "3.6-3.8: the same CMake additions as the 3.5.x patch" bash -c '
  adds() { awk "/^diff --git/ { c = (\$0 ~ /CMakeLists/) } c && /^\+[^+]/" "$1"; }
  [ -n "$(adds "$1")" ] && [ "$(adds "$1")" = "$(adds "$2")" ]' _ "$mn_patch" \
  "$root/patches/nvshmem-3.5.x/0001-libfabric-efa-gda-splice.patch"
awk -v out="$mn" '
  /^diff --git / { inlf = ($0 ~ /libfabric\.cpp$/); next }
  inlf && /^@@ / { n++; next }
  inlf && /^\+/ && n >= 1 && n <= 3 {
    f = (n == 1) ? "splice_include.inc" : (n == 2) ? "splice_block.inc" : "splice_hook.inc"
    print substr($0, 2) > (out "/" f)
  }' "$mn_patch"
if [ "$have_header" -eq 0 ]; then
  skip "3.6-3.8 harness: $include_dir/nvshmem_efa_gda.h not present"
elif [ ! -s "$mn/splice_block.inc" ] || [ ! -s "$mn/splice_hook.inc" ]; then
  fail "3.6-3.8: the patch's libfabric.cpp additions could not be extracted"
else
  for variant in "" -DHARNESS_EXTRA_PARAM; do
    name="ABI 5 host ops"
    [ -n "$variant" ] && name="an extra parameter on each wrapped host op"
    if "$cxx" -std=c++11 -Wall -Wextra -Wno-unused-parameter -Werror $variant -I"$mn" \
         -I"$include_dir" -o "$mn/harness" "$root/tests/splice/multinic_harness.cpp" \
         >"$tmp/last.log" 2>&1; then
      pass "3.6-3.8: the splice compiles in the harness ($name, C++11, -Werror)"
      check "3.6-3.8: the splice behaves in the harness ($name)" "$mn/harness"
    else
      fail "3.6-3.8: the splice compiles in the harness ($name, C++11, -Werror)"
      show "$tmp/last.log"
    fi
  done
  if [ "$have_lib" -eq 1 ]; then
    missing=()
    defined=$(nm -D --defined-only "$lib" | awk '{print $NF}')
    for sym in $(grep -oE 'nvshmemt_efa_gda_[a-z_]+\(' "$mn/splice_block.inc" | tr -d '(' | sort -u); do
      grep -qx "$sym" <<<"$defined" || missing+=("$sym")
    done
    check "3.6-3.8: every GDA call of the splice is defined by $(basename "$lib") (missing: ${missing[*]:-none})" \
      test ${#missing[@]} -eq 0
  else
    skip "3.6-3.8: symbol check: $lib not built (cargo build --release)"
  fi
fi
# apply.sh routes by version and ABI (a minimal tree: it gets as far as choosing the patch).
for va in "3.6.5 5" "3.7.2 6" "3.8.0 7"; do
  read -r ver abi <<<"$va"
  d=$tmp/route-$ver
  mkdir -p "$d/src/modules/transport/libfabric"
  printf 'project(\n  NVSHMEM\n  LANGUAGES CXX C\n  VERSION %s.0\n)\n' "$ver" >"$d/CMakeLists.txt"
  printf 'set(TRANSPORT_VERSION_MAJOR %s)\n' "$abi" >"$d/src/CMakeLists.txt"
  : >"$d/src/modules/transport/libfabric/libfabric.cpp"
  expect_rc 2 'using patches/nvshmem-3.6-3.8' "$ver (ABI $abi): apply.sh picks the 3.6-3.8 patch" \
    "$apply" --check "$d"
  printf 'set(TRANSPORT_VERSION_MAJOR %s)\n' "$((abi == 5 ? 6 : 5))" >"$d/src/CMakeLists.txt"
  expect_rc 2 "unsupported NVSHMEM $ver" "$ver with another ABI: refused" "$apply" --check "$d"
done

# Offsets: the 3.4.5 patch on a 3.5 tree labelled 3.4.5 must land its hunks (offsets of up to
# ~400 lines) exactly where the 3.5.x patch puts them, or be refused; never elsewhere.
if [ -d "$tmp/pristine-3.5" ] && [ -d "$tmp/tree-3.5" ]; then
  x=$tmp/cross
  cp -a "$tmp/pristine-3.5" "$x"
  sed -i -E '/^[[:space:]]*project[[:space:]]*\(/,/\)/ s/VERSION[[:space:]]+[0-9.]+/VERSION 3.4.5.0/' "$x/CMakeLists.txt"
  sed -i -E 's/^set\(TRANSPORT_VERSION_MAJOR [0-9]+\)/set(TRANSPORT_VERSION_MAJOR 3)/' "$x/src/CMakeLists.txt"
  rc=0
  "$apply" "$x" >"$tmp/last.log" 2>&1 || rc=$?
  if [ "$rc" -eq 2 ]; then
    pass "3.4.5 patch on a 3.5 tree: refused"
  else
    check "3.4.5 patch on a 3.5 tree: same result as the 3.5.x patch" \
      diff "$tmp/tree-3.5/src/modules/transport/libfabric/libfabric.cpp" \
      "$x/src/modules/transport/libfabric/libfabric.cpp"
  fi
fi
mkdir -p "$tmp/empty"
expect_rc 2 'does not look like an NVSHMEM source tree' "a directory that is not NVSHMEM refused (exit 2)" \
  "$apply" "$tmp/empty"
expect_rc 2 'not a directory' "a missing directory refused (exit 2)" "$apply" "$tmp/does-not-exist"
expect_rc 2 'nvshmem-source-dir' "no argument: usage (exit 2)" "$apply"

[ "$n_sources" -gt 0 ] || skip "NVSHMEM source not available (set NVSHMEM_SRC_3_4_5 / NVSHMEM_SRC_3_5)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
