#!/usr/bin/env bash
# Builds libfabric 2.1.0 (and fabtests from the same tarball) into the git-ignored prefix .deps/libfabric.
#  - the tarball is Debian's upstream source (libfabric_2.1.0.orig.tar.xz from trixie's source pool),
#    checked against its md5 and size before use;
#  - CUDA HMEM support is built against the headers of the PyPI CUDA wheels (.ci/setup-cuda.sh) with
#    --enable-cuda-dlopen, so the result loads and runs on hosts without CUDA;
#  - efa and verbs are built as dlopen'ed provider modules when rdma-core headers exist, so the library
#    still loads on hosts without libibverbs;
#  - a finished prefix is reused (stamp file). Set LIBFABRIC_HOME to use another libfabric instead
#    (e.g. /opt/amazon/efa on EFA hosts); then this script only writes .deps/libfabric.env.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
mkdir -p "$deps"
logs="$deps/logs"
# shellcheck disable=SC1091
source "$root/.ci/quietly.sh"
ver=2.1.0
md5=bc33d8524fd8717c627b3cfe045a4ad5
size=3167432
prefix="$deps/libfabric"
stamp="$prefix/.complete-$ver-v1"

write_env() {
  local p=$1
  local pc="$p/lib/pkgconfig"
  [ -d "$p/lib64/pkgconfig" ] && pc="$p/lib64/pkgconfig:$pc"
  cat > "$deps/libfabric.env" <<ENV
export LIBFABRIC_HOME="$p"
export PKG_CONFIG_PATH="$pc\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$p/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$p/bin:\$PATH"
ENV
}

if [ -n "${LIBFABRIC_HOME:-}" ] && [ "$LIBFABRIC_HOME" != "$prefix" ]; then
  echo "[setup-libfabric] using LIBFABRIC_HOME=$LIBFABRIC_HOME"
  write_env "$LIBFABRIC_HOME"
  exit 0
fi
if [ -f "$stamp" ]; then
  echo "[setup-libfabric] reusing $prefix"
  write_env "$prefix"
  exit 0
fi

tarball="$deps/libfabric_$ver.orig.tar.xz"
if [ ! -f "$tarball" ] || [ "$(md5sum < "$tarball" | cut -d' ' -f1)" != "$md5" ]; then
  echo "[setup-libfabric] downloading libfabric $ver upstream tarball from Debian's source archive"
  tmp=$(mktemp -d)
  mkdir -p "$tmp/lists/partial"
  cat > "$tmp/trixie.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  o=(-oDir::Etc::SourceList="$tmp/trixie.sources" -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists="$tmp/lists")
  quietly "$logs/libfabric-apt-update.log" apt-get "${o[@]}" update
  # The archive serves the upstream tarball but not always the .dsc; the tarball is all we need.
  (cd "$tmp" && apt-get "${o[@]}" source --download-only libfabric >"$logs/libfabric-apt-source.log" 2>&1 || true)
  [ -f "$tmp/libfabric_$ver.orig.tar.xz" ] || { echo "[setup-libfabric] tarball not served" >&2; exit 1; }
  mv "$tmp/libfabric_$ver.orig.tar.xz" "$tarball"
  rm -rf "$tmp"
fi
got_md5=$(md5sum < "$tarball" | cut -d' ' -f1)
got_size=$(stat -c %s "$tarball")
if [ "$got_md5" != "$md5" ] || [ "$got_size" != "$size" ]; then
  echo "[setup-libfabric] checksum mismatch: md5 $got_md5 size $got_size (want $md5 $size)" >&2
  exit 1
fi
echo "[setup-libfabric] tarball verified (md5 $md5, $size bytes)"

# shellcheck disable=SC1091
source "$deps/cuda.env"
src="$deps/libfabric-src"
rm -rf "$src" "$prefix"
mkdir -p "$src"
tar -xf "$tarball" -C "$src" --strip-components=1
cd "$src"
echo "[setup-libfabric] building libfabric $ver (output: $logs/libfabric-*.log)"
[ -x ./configure ] || quietly "$logs/libfabric-autogen.log" ./autogen.sh
extra=()
if [ -f /usr/include/infiniband/efadv.h ]; then
  extra+=(--enable-efa=dl --enable-verbs=dl)
else
  extra+=(--disable-efa --disable-verbs)
fi
jobs=$(nproc)
echo "[setup-libfabric] configure (${extra[*]})"
quietly "$logs/libfabric-configure.log" ./configure --prefix="$prefix" --with-cuda="$CUDA_HOME" \
  --enable-cuda-dlopen --enable-tcp --enable-rxm --enable-shm --enable-sockets --disable-psm3 \
  --disable-opx --disable-usnic --disable-ucx --disable-lpp "${extra[@]}"
echo "[setup-libfabric] make"
quietly "$logs/libfabric-make.log" make -j"$jobs"
quietly "$logs/libfabric-install.log" make install
echo "[setup-libfabric] fabtests"
cd fabtests
[ -x ./configure ] || quietly "$logs/fabtests-autogen.log" ./autogen.sh
quietly "$logs/fabtests-configure.log" ./configure --prefix="$prefix" --with-libfabric="$prefix" \
  --with-cuda="$CUDA_HOME"
quietly "$logs/fabtests-make.log" make -j"$jobs"
quietly "$logs/fabtests-install.log" make install
rm -rf "$src"
touch "$stamp"
write_env "$prefix"
"$prefix/bin/fi_info" --version | head -2
