#!/usr/bin/env bash
# Applies the nvshmem-efa-gda splice to an NVSHMEM source tree (a plain directory or a git checkout).
#
#   patches/apply.sh [--check | --revert] <nvshmem-source-dir>
#
#   (default)  apply the patch set that matches the tree's NVSHMEM version; a tree that already
#              carries it is reported as "already applied" (exit 0)
#   --check    only report whether the patch set applies (or is already applied); change nothing
#   --revert   take an applied patch set out again
#
# The version comes from the tree itself: project(NVSHMEM ... VERSION x.y.z) in the top-level
# CMakeLists.txt (or NVSHMEM_MAJOR/MINOR/PATCH in version.txt) and set(TRANSPORT_VERSION_MAJOR N)
# in src/CMakeLists.txt:
#   3.4.x with transport ABI 3  ->  patches/nvshmem-3.4.5/
#   3.5.x with transport ABI 4  ->  patches/nvshmem-3.5.x/
#   3.6.x with transport ABI 5, 3.7.x with ABI 6, 3.8.x with ABI 7  ->  patches/nvshmem-3.6-3.8/
#   (the multi-NIC transport: the splice wraps its host ops; see patches/README.md for what each
#   version's patch was checked against)
# Exit codes: 0 done (or already applied), 2 bad usage, unknown version or a tree the patches do
# not match, 1 anything else.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
marker='nvshmem-efa-gda splice'

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" >&2
  exit 2
}
die2() { echo "apply.sh: $*" >&2; exit 2; }

mode=apply
src=
while [ $# -gt 0 ]; do
  case "$1" in
    --check) mode=check ;;
    --revert) mode=revert ;;
    -h|--help) usage ;;
    -*) echo "apply.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$src" ] || { echo "apply.sh: more than one source dir given" >&2; usage; }
       src=$1 ;;
  esac
  shift
done
[ -n "$src" ] || usage
[ -d "$src" ] || die2 "$src: not a directory"
src=$(cd "$src" && pwd -P)
command -v git >/dev/null || { echo "apply.sh: git is required (git apply works outside repositories)" >&2; exit 1; }

lf_cpp=src/modules/transport/libfabric/libfabric.cpp
for f in CMakeLists.txt src/CMakeLists.txt "$lf_cpp"; do
  [ -f "$src/$f" ] || die2 "$src does not look like an NVSHMEM source tree (missing $f)"
done

# NVSHMEM version: project(NVSHMEM ... VERSION a.b.c[.d]) spans several lines in CMakeLists.txt.
version=$(awk '
  /^[[:space:]]*project[[:space:]]*\(/ { inproj = 1 }
  inproj {
    for (i = 1; i <= NF; i++) if ($i == "VERSION" && i < NF) { print $(i + 1); exit }
    if ($0 ~ /\)/) inproj = 0
  }' "$src/CMakeLists.txt" | tr -d ')' | grep -oE '^[0-9]+\.[0-9]+\.[0-9]+' || true)
if [ -z "$version" ] && [ -f "$src/version.txt" ]; then
  v() { sed -n "s/^NVSHMEM_$1[[:space:]]*:=[[:space:]]*\([0-9]*\).*/\1/p" "$src/version.txt" | head -1; }
  maj=$(v MAJOR); min=$(v MINOR); pat=$(v PATCH)
  [ -n "$maj" ] && [ -n "$min" ] && [ -n "$pat" ] && version="$maj.$min.$pat"
fi
[ -n "$version" ] || die2 "cannot find the NVSHMEM version in $src/CMakeLists.txt (project VERSION) or version.txt"

abi=$(sed -n 's/^[[:space:]]*set(TRANSPORT_VERSION_MAJOR[[:space:]]\{1,\}\([0-9]\{1,\}\)[[:space:]]*).*/\1/p' \
      "$src/src/CMakeLists.txt" | head -1)
[ -n "$abi" ] || die2 "cannot find set(TRANSPORT_VERSION_MAJOR N) in $src/src/CMakeLists.txt"

case "$version/$abi" in
  3.4.*/3) pdir=nvshmem-3.4.5 ;;
  3.5.*/4) pdir=nvshmem-3.5.x ;;
  3.6.*/5 | 3.7.*/6 | 3.8.*/7) pdir=nvshmem-3.6-3.8 ;;
  *) die2 "unsupported NVSHMEM $version (transport ABI $abi); supported: 3.4.x (ABI 3, patch made on 3.4.5), 3.5.x (ABI 4, patch made on 3.5.1), 3.6.x (ABI 5), 3.7.x (ABI 6) and 3.8.x (ABI 7) (one patch for the multi-NIC transport)" ;;
esac
shopt -s nullglob
patches=("$here/$pdir"/*.patch)
shopt -u nullglob
[ ${#patches[@]} -gt 0 ] || { echo "apply.sh: no patches in $here/$pdir" >&2; exit 1; }
echo "apply.sh: NVSHMEM $version, transport ABI $abi: using patches/$pdir"

# git apply inside a directory that lies within another git work tree would take the patch paths
# relative to that outer tree and silently skip them; stop the search for a repository at the
# source tree itself (its own .git, if any, is still used).
export GIT_CEILING_DIRECTORIES
GIT_CEILING_DIRECTORIES=$(dirname "$src")
unset GIT_DIR GIT_WORK_TREE

# Runs git apply in the tree; fails when git reports that it skipped a file.
gapply() {
  local out rc=0
  out=$(cd "$src" && git apply -v "$@" 2>&1) || rc=$?
  if [ $rc -eq 0 ] && grep -q '^Skipped patch' <<<"$out"; then
    echo "$out" >&2
    echo "apply.sh: git skipped files of the patch (paths outside $src?)" >&2
    return 1
  fi
  [ $rc -eq 0 ] || { [ -n "${QUIET_FAIL:-}" ] || echo "$out" >&2; }
  return $rc
}

status_of() {  # prints applied / clean / mismatch for one patch
  # Reverse first: on a patched tree the forward check of an additions-only patch still matches.
  if QUIET_FAIL=1 gapply --check --reverse "$1" >/dev/null 2>&1; then echo applied
  elif QUIET_FAIL=1 gapply --check "$1" >/dev/null 2>&1; then echo clean
  else echo mismatch
  fi
}

mismatch() {
  echo "apply.sh: $(basename "$1") does not apply to $src (NVSHMEM $version) and is not applied either;" >&2
  echo "apply.sh: the tree differs from the one the patch was made on. git apply says:" >&2
  gapply --check "$1" || true
  exit 2
}

rc=0
if [ "$mode" = revert ]; then
  for ((i = ${#patches[@]} - 1; i >= 0; i--)); do
    p=${patches[$i]}
    case $(status_of "$p") in
      applied) gapply --reverse "$p" >/dev/null; echo "reverted $(basename "$p")" ;;
      clean) echo "not applied: $(basename "$p")" ;;
      *) mismatch "$p" ;;
    esac
  done
  exit 0
fi

for p in "${patches[@]}"; do
  case $(status_of "$p") in
    applied) echo "already applied: $(basename "$p")" ;;
    clean)
      if [ "$mode" = check ]; then
        echo "applies cleanly: $(basename "$p")"
      else
        gapply "$p" >/dev/null
        echo "applied: $(basename "$p")"
      fi ;;
    *) mismatch "$p" ;;
  esac
done

if [ "$mode" = apply ]; then
  grep -q "$marker" "$src/$lf_cpp" || { echo "apply.sh: $lf_cpp lacks the splice after applying" >&2; exit 1; }
  cat <<EOF
Next: build NVSHMEM with the libfabric transport and point it at nvshmem-efa-gda, e.g.
  cmake -S $src -B <build> -DNVSHMEM_LIBFABRIC_SUPPORT=ON -DLIBFABRIC_HOME=<libfabric prefix> \\
        -DNVSHMEM_EFA_GDA_ROOT=<prefix from cmake/install.sh>
EOF
fi
exit $rc
