#!/usr/bin/env bash
# Stages a private iproute2 for GPU nodes that have no `ip` (tests/twohost/netns.sh needs it to make
# the veth pair): Debian's iproute2 package and the libraries its `ip` links beyond glibc, unpacked
# into .gpu/iproute2 (bin/ip, lib/), plus util-linux's nsenter as a fallback for nodes without one,
# packed as .gpu/iproute2.tgz (about 1.5 MiB). On the node: tar -C .gpu -xzf .gpu/iproute2.tgz, then
# TWOHOST_IP=.gpu/iproute2/bin/ip TWOHOST_IP_LIBS=.gpu/iproute2/lib (tests/gpu/stream_run.sh does
# this). Run on a Debian 12 (or similar) machine with apt; downloads with `apt-get download` only.
# Checks that the unpacked ip starts with only the unpacked libraries and glibc.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dest=.gpu/iproute2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkgs=(iproute2 libbpf1 libelf1 libmnl0 libbsd0 libcap2 libmd0 zlib1g util-linux)
(cd "$work" && apt-get download "${pkgs[@]}" >/dev/null) ||
    { echo "stage_iproute2.sh: apt-get download ${pkgs[*]} failed (apt-get update first?)" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$work/x"
for d in "$work"/*.deb; do dpkg-deb -x "$d" "$work/x"; done
cp "$work/x/bin/ip" "$dest/bin/ip" 2>/dev/null || cp "$work/x/sbin/ip" "$dest/bin/ip" 2>/dev/null ||
    cp "$work/x/usr/sbin/ip" "$dest/bin/ip" 2>/dev/null || cp "$work/x/usr/bin/ip" "$dest/bin/ip"
cp "$work/x/usr/bin/nsenter" "$dest/bin/nsenter"
for l in libbpf.so.1 libelf.so.1 libmnl.so.0 libbsd.so.0 libcap.so.2 libmd.so.0 libz.so.1; do
    f=$(find "$work/x" -name "$l*" \( -type f -o -type l \) | head -n 1)
    [ -n "$f" ] || { echo "stage_iproute2.sh: $l not in the downloaded packages" >&2; exit 1; }
    cp -L "$f" "$dest/lib/$l"
done
(for d in "$work"/*.deb; do dpkg-deb -f "$d" Package Version | paste -sd' '; done) >"$dest/VERSIONS"
# Only the carried libraries and glibc may resolve.
LD_LIBRARY_PATH="$dest/lib" ldd "$dest/bin/ip" | awk '/=>/ { print $3 }' | while read -r f; do
    case "$f" in "$dest"/lib/* | /lib*/libc.so.* | /lib/*/libc.so.* | /usr/lib/*/libc.so.*) ;;
    *) echo "stage_iproute2.sh: ip resolves $f outside $dest/lib" >&2; exit 1 ;;
    esac
done
LD_LIBRARY_PATH="$dest/lib" "$dest/bin/ip" -V
tar -C .gpu -czf .gpu/iproute2.tgz iproute2
ls -l .gpu/iproute2.tgz
