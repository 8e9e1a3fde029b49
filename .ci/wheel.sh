#!/usr/bin/env bash
# The wheel stage: builds the nvshmem-efa-gda wheel from this tree, installs it into a fresh venv
# together with NVSHMEM 3.4.5 (the nvidia-nvshmem-cu13 package of .deps/cuda-venv, copied: no
# network), checks the wheel's platform tag against the GLIBC versions its ELF files need, runs the
# Python checks of the installed package (tests/python/test_wheel.py: enable(), refusals, env, info)
# and the host harness through the INSTALLED shims (by path, and by bare name under the LD_PRELOAD
# that `nvshmem-efa-gda env` prints, which is how NVSHMEM opens its plugin).
#
#   bash .ci/wheel.sh [--keep DIR]     (DIR: keep the wheel and the venv there)
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
repo=$PWD
keep=
[ "${1:-}" = --keep ] && keep=${2:?--keep needs a directory}
# Harness output (each run starts with the deliberate bad-version probe, which the library rightly
# logs as an error) goes to log files here; the console gets the summary line, the log on failure.
logs=${CI_LOGS:-${CARGO_TARGET_DIR:-$repo/target}/ci-logs}
mkdir -p "$logs"
# harness_run LOG ARGS...: one harness run, its output in $logs/LOG; prints its closing line.
harness_run() {
  local log=$logs/$1 rc=0
  shift
  timeout 300 "$work/harness" "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    cat "$log"
    echo "  harness FAILED (exit $rc); log: $log"
    return 1
  fi
  echo "    $(tail -1 "$log") ($log)"
}
work=$(mktemp -d)
trap '[ -n "$keep" ] || rm -rf "$work"' EXIT
[ -z "$keep" ] || { mkdir -p "$keep"; work=$(cd "$keep" && pwd); }

echo "--- build the wheel (pip wheel: the in-tree PEP 517 backend runs cargo and cmake/install.sh)"
# A venv of its own for the build frontend: Debian's python3 has no pip outside a venv.
python3 -m venv "$work/build-venv"
"$work/build-venv/bin/python" -m pip wheel -q --no-deps --disable-pip-version-check -w "$work/dist" .
wheel=$(ls "$work"/dist/nvshmem_efa_gda-*.whl)
echo "$(basename "$wheel") ($(stat -c %s "$wheel") bytes)"
# The README's quick starts install the wheel by its file name.
grep -q "$(basename "$wheel")" README.md || { echo "README.md's quick starts do not name $(basename "$wheel")"; exit 1; }

echo "--- platform tag vs the GLIBC symbol versions the ELF files need"
mkdir -p "$work/unpacked"
python3 -m zipfile -e "$wheel" "$work/unpacked"
need=0
while IFS= read -r f; do
  v=$(objdump -T "$f" | grep -o 'GLIBC_2\.[0-9]*' | sed 's/GLIBC_2\.//' | sort -n | tail -1)
  [ -n "$v" ] && [ "$v" -gt "$need" ] && need=$v
  if readelf -d "$f" | grep -q 'NEEDED.*libfabric'; then
    echo "  $(basename "$f") links libfabric.so.1 (the system's; not in the wheel)"
  fi
done < <(find "$work/unpacked" -type f -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
tag=$(basename "$wheel" .whl | sed 's/.*-py3-none-//')
echo "  newest GLIBC needed: 2.$need; tag: $tag"
[ "$tag" = "manylinux_2_${need}_$(uname -m)" ] || { echo "tag $tag does not match GLIBC 2.$need"; exit 1; }
if find "$work/unpacked" -name 'libfabric.so*' | grep -q .; then echo "the wheel bundles libfabric"; exit 1; fi

echo "--- fresh venv: install the wheel (no index) and NVSHMEM 3.4.5"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --no-index --disable-pip-version-check "$wheel"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
src=$(.deps/cuda-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
dist=$(cd "$src" && ls -d nvidia_nvshmem_cu13-3.4.5.dist-info)
cp -a "$src/$dist" "$site/"
mkdir -p "$site/nvidia"
cp -a "$src/nvidia/nvshmem" "$site/nvidia/"
"$work/venv/bin/pip" list --disable-pip-version-check 2>/dev/null | grep -Ei 'nvshmem'

echo "--- nvshmem-efa-gda info (installed console script)"
(cd /tmp && env -u NVSHMEM_HOME "$work/venv/bin/nvshmem-efa-gda" info) | tee "$work/info.txt"
grep -q 'found via      python package nvidia-nvshmem-cu13 3.4.5' "$work/info.txt"
grep -q 'served         yes' "$work/info.txt"

echo "--- Python checks of the installed package"
(cd /tmp && "$work/venv/bin/python" "$repo/tests/python/test_wheel.py")

echo "--- host harness through the installed library"
cc -O1 -Wall -o "$work/harness" tests/harness/harness.c -ldl
lib=$site/nvshmem_efa_gda/lib
cases=(--case put --case get --case amo --case proxy_put_get)
ran=0
for shim in "$lib"/nvshmem_transport_libfabric.so.*; do
  abi=${shim##*.}
  if ! "$work/harness" --lib "$shim" --abi "$abi" --np 2 --list >/dev/null 2>&1; then
    echo "  (the harness does not drive ABI $abi: skipped)"
    continue
  fi
  echo "  ABI $abi, tcp, 2 processes, $shim"
  NVSHMEM_LIBFABRIC_PROVIDER=tcp NVSHMEM_EFA_GDA=off \
    harness_run "wheel-harness-abi$abi-tcp.log" --lib "$shim" --abi "$abi" --np 2 "${cases[@]}"
  ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || { echo "no served ABI could be driven by the harness"; exit 1; }
echo "  ABI 3, shm, 2 processes, bare plugin name under the exports of 'nvshmem-efa-gda env'"
exports=$(cd /tmp && env -u NVSHMEM_HOME -u NVSHMEM_REMOTE_TRANSPORT -u CUDA_MODULE_LOADING -u CUDA_DEVICE_MAX_CONNECTIONS \
          "$work/venv/bin/nvshmem-efa-gda" env)
echo "$exports" | sed 's/^/    /'
(
  eval "$exports"
  NVSHMEM_LIBFABRIC_PROVIDER=shm NVSHMEM_EFA_GDA=off \
    harness_run wheel-harness-abi3-shm-env.log --lib nvshmem_transport_libfabric.so.3 --abi 3 --np 2 "${cases[@]}"
)
echo "wheel stage: ok ($(basename "$wheel"))"
