#!/usr/bin/env bash
# Packs what tests/python_gpu/run.sh needs on a GPU node that has no package index and no network:
# this library's wheel plus every Python wheel that the node's torch venv lacks for nvshmem4py,
# in .gpu/py/ (git-ignored), and the same folder as one tarball .gpu/py.tgz.
#
#   bash tests/python_gpu/pack.sh            (then carry .gpu/py.tgz; on the node: tar xzf .gpu/py.tgz)
#
# What is downloaded (Python 3.12, manylinux x86-64, binary wheels only, as the node's torch venv
# is): nvshmem4py-cu13 0.4.1 without its dependencies, then its requirements other than NVSHMEM
# itself, with theirs: cuda-python < 14, cuda-core, cuda-pathfinder, numpy, Cython; and pip (the
# runner bootstraps pip from it when the node's python has no ensurepip). nvidia-nvshmem-cu13 is
# NOT carried: the node's torch venv has 3.4.5, which nvshmem4py-cu13 0.4.1 accepts (its metadata
# requires nvidia-nvshmem-cu13 with no version bound; see README.md beside this file).
# Environment: CARGO_TARGET_DIR as cargo; PYTHON (default python3) for the build front end;
# NVSHMEM4PY_VERSION (default 0.4.1).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
# shellcheck disable=SC1091
source .ci/env.sh
PYTHON=${PYTHON:-python3}
n4p=${NVSHMEM4PY_VERSION:-0.4.1}
dest=.gpu/py
tgz=.gpu/py.tgz
limit=$((60 * 1024 * 1024))

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "--- build this library's wheel (the in-tree PEP 517 backend: cargo build --release + cmake/install.sh)"
rm -rf "$dest" "$tgz"
mkdir -p "$dest"
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 ||
    echo "(pip not upgraded: using $("$work/venv/bin/python" -m pip --version))"
"$work/venv/bin/python" -m pip wheel -q --no-deps --disable-pip-version-check -w "$dest" .
ls "$dest"/nvshmem_efa_gda-*.whl >/dev/null

echo "--- download the Python wheels (cp312, manylinux x86-64 up to glibc 2.39)"
plat=()
for v in 39 35 34 31 28 27 24 17; do plat+=(--platform "manylinux_2_${v}_x86_64"); done
plat+=(--platform manylinux2014_x86_64)
dl() {
    "$work/venv/bin/python" -m pip download -q --disable-pip-version-check --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 "${plat[@]}" -d "$dest" "$@"
}
dl --no-deps "nvshmem4py-cu13==$n4p"
# Its requirements except nvidia-nvshmem-cu13 (read from the wheel's own metadata).
meta=$("$work/venv/bin/python" - "$dest" <<'EOF'
import glob, sys, zipfile
w = glob.glob(sys.argv[1] + "/nvshmem4py_cu13-*.whl")[0]
with zipfile.ZipFile(w) as z:
    name = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")][0]
    text = z.read(name).decode()
for line in text.splitlines():
    if line.startswith("Requires-Dist:") and "extra ==" not in line:
        req = line.split(":", 1)[1].strip()
        if not req.lower().replace("_", "-").startswith("nvidia-nvshmem"):
            print(req)
EOF
)
echo "nvshmem4py-cu13 $n4p requires (besides nvidia-nvshmem-cu13):"
echo "$meta" | sed 's/^/  /'
mapfile -t reqs <<<"$meta"
dl "${reqs[@]}" pip
# Nothing of NVIDIA's CUDA libraries or NVSHMEM may come along: the node's venv has them.
if ls "$dest" | grep -E '^nvidia_' ; then
    echo "pack.sh: a dependency pulled in an nvidia-* wheel (above); the node's venv has these" >&2
    exit 1
fi

echo "--- manifest"
(cd "$dest" && sha256sum ./*.whl | sed 's| \./| |' >SHA256SUMS)
(cd "$dest" && for w in *.whl; do printf '%10d  %s\n' "$(stat -c %s "$w")" "$w"; done)

echo "--- tarball"
tar -C .gpu -czf "$tgz" py
size=$(stat -c %s "$tgz")
echo "$tgz: $size bytes ($((size / 1024 / 1024)) MiB)"
[ "$size" -lt "$limit" ] || { echo "pack.sh: $tgz is over 60 MiB" >&2; exit 1; }
echo "pack.sh: ok"
