#!/bin/sh
# Exports the headers tests/efa_ext_header.rs compiles against (include/, prov/efa/src/fi_ext_efa.h
# and, where the revision has it, prov/efa/src/efa_io_defs.h) from a libfabric git repository into
# target/libfabric-headers/<revision>/ (git-ignored), with a SOURCE file naming the revision, its
# commit and its version (configure.ac). The test then checks each export against the mirrors and
# against its block in tests/golden/libfabric_layouts.txt.
#
#   tests/golden/libfabric_headers.sh /path/to/libfabric v2.6.0 main
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 LIBFABRIC_GIT_DIR REVISION..." >&2
    exit 2
fi
repo=$1
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
for rev in "$@"; do
    commit=$(git -C "$repo" rev-parse --verify "$rev^{commit}")
    version=$(git -C "$repo" show "$commit:configure.ac" |
        sed -n 's/^AC_INIT(\[libfabric\], \[\([^]]*\)\].*/\1/p')
    dir=$root/target/libfabric-headers/$rev
    rm -rf "$dir"
    mkdir -p "$dir"
    paths="include prov/efa/src/fi_ext_efa.h"
    if git -C "$repo" cat-file -e "$commit:prov/efa/src/efa_io_defs.h" 2>/dev/null; then
        paths="$paths prov/efa/src/efa_io_defs.h"
    fi
    # shellcheck disable=SC2086
    git -C "$repo" archive "$commit" $paths | tar -x -C "$dir"
    echo "$rev $commit $version" >"$dir/SOURCE"
    echo "$dir: libfabric $version ($commit)"
done
