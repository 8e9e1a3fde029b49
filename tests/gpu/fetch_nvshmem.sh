#!/usr/bin/env bash
# Downloads one NVSHMEM release from PyPI (nvidia-nvshmem-cu13==VERSION, no dependencies) and
# extracts what the GPU suites need into .gpu/nvshmem-VERSION/ (git-ignored):
#   include/                         headers (compile time)
#   lib/libnvshmem_host.so.3         the host library (run time)
#   lib/libnvshmem_device.a          the device library (compile time only; not in a carry bundle)
#   lib/nvshmem_bootstrap_mpi.so.3   the MPI bootstrap plugin (run time)
#   lib/nvshmem_bootstrap_uid.so.3   the unique-id bootstrap (programs built without MPI)
# Every NVSHMEM from 3.4 to 3.8 names these files the same way (the bootstrap ABI major is 3 in all
# of them). The wheel itself stays in .whl/ (git-ignored) for reuse.
#
#   bash tests/gpu/fetch_nvshmem.sh VERSION        e.g. 3.6.5
#   NVSHMEM_WHEEL=nvidia-nvshmem-cu12 bash tests/gpu/fetch_nvshmem.sh 3.6.5
#
# Prints the directory (for NVSHMEM_HOME) on its last line. Exit status 0 on success, 1 on a
# download or extraction failure, 2 on a usage error.
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# = 1 ] || { usage >&2; exit 2; }
ver=$1
case "$ver" in -h | --help) usage; exit 0 ;; esac
[[ "$ver" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "fetch_nvshmem.sh: '$ver' is not a version like 3.6.5" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
pkg=${NVSHMEM_WHEEL:-nvidia-nvshmem-cu13}
whl_dir=$repo/.whl/nvshmem-$ver
dest=$repo/.gpu/nvshmem-$ver
say() { echo "[fetch_nvshmem] $*" >&2; }

mkdir -p "$whl_dir"
whl=$(find "$whl_dir" -maxdepth 1 -name "${pkg//-/_}-$ver-*.whl" | head -n 1)
if [ -z "$whl" ]; then
    py=${PYTHON:-python3}
    say "downloading $pkg==$ver into $whl_dir"
    "$py" -m pip download --no-deps --only-binary=:all: --dest "$whl_dir" "$pkg==$ver" >&2 ||
        { say "pip download $pkg==$ver failed"; exit 1; }
    whl=$(find "$whl_dir" -maxdepth 1 -name "${pkg//-/_}-$ver-*.whl" | head -n 1)
    [ -n "$whl" ] || { say "no wheel of $pkg $ver in $whl_dir after the download"; exit 1; }
fi
say "wheel: $whl ($(du -h "$whl" | cut -f1))"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fetch-nvshmem.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# A wheel is a zip file; python's zipfile is always there (unzip may not be).
python3 - "$whl" "$tmp" <<'PY' || { say "extracting $whl failed"; exit 1; }
import sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
want_lib = {"libnvshmem_host.so.3", "libnvshmem_device.a",
            "nvshmem_bootstrap_mpi.so.3", "nvshmem_bootstrap_uid.so.3"}
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist()
             if n.startswith("nvidia/nvshmem/include/")
             or (n.startswith("nvidia/nvshmem/lib/") and n.rsplit("/", 1)[-1] in want_lib)]
    for n in names:
        z.extract(n, out)
    got = {n.rsplit("/", 1)[-1] for n in names if n.startswith("nvidia/nvshmem/lib/")}
    missing = want_lib - got
    if missing:
        sys.exit("missing in the wheel: " + ", ".join(sorted(missing)))
PY
src=$tmp/nvidia/nvshmem
[ -f "$src/include/nvshmem.h" ] && [ -f "$src/include/non_abi/nvshmem_version.h" ] ||
    { say "the wheel has no include/nvshmem.h or include/non_abi/nvshmem_version.h"; exit 1; }
chmod 0755 "$src"/lib/*.so*
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$src" "$dest"
got_ver=$(sed -n 's/^#define NVSHMEM_VENDOR_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\).*/\2/p' \
    "$dest/include/non_abi/nvshmem_version.h" | paste -sd. -)
abi=$(sed -n 's/^#define NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION \([0-9]*\).*/\1/p' \
    "$dest/include/non_abi/nvshmem_version.h")
[ "$got_ver" = "$ver" ] || { say "the headers say NVSHMEM $got_ver, not $ver"; exit 1; }
say "NVSHMEM $got_ver (transport ABI $abi) in $dest ($(du -sh "$dest" | cut -f1))"
echo "$dest"
