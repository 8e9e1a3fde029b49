#!/usr/bin/env bash
# The NIC section of `nvshmem-efa-gda info` on a real machine, with what to check it against:
# writes to $OUT (default ./nics-out)
#   info.txt, info.json   `nvshmem-efa-gda info` and `info --json`
#   pci.txt               every NVIDIA and network-class PCI function: address, vendor, class,
#                         NUMA node and sysfs path (the PCIe ancestry the chooser compares)
#   net.txt               /sys/class/{infiniband,net}/* and the PCI function each one sits on
#   topo.txt              `nvidia-smi topo -m` (its PIX/PXB/PHB/NODE/SYS column for each NIC is
#                         the class info.txt should show for that GPU and NIC)
#
#   INFO_BIN=<path to nvshmem-efa-gda> OUT=<dir> bash tests/gpu/nics_info.sh
#
# INFO_BIN defaults to target/release/nvshmem-efa-gda of this tree. Exit status: 0 when info ran
# (whatever it found), 1 when it could not run, 2 on a usage error.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${INFO_BIN:-$repo/target/release/nvshmem-efa-gda}
OUT=${OUT:-$PWD/nics-out}

[ $# -eq 0 ] || { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ -x "$bin" ] || { echo "nics_info.sh: $bin is not an executable (set INFO_BIN)" >&2; exit 2; }
mkdir -p "$OUT" || { echo "nics_info.sh: cannot create $OUT" >&2; exit 2; }

rc=0
"$bin" info >"$OUT/info.txt" 2>&1 || [ $? -le 4 ] || rc=1
"$bin" info --json >"$OUT/info.json" 2>"$OUT/info-json.err" || [ $? -le 4 ] || rc=1

{
    printf '%-14s %-8s %-10s %-5s %s\n' address vendor class numa path
    for d in /sys/bus/pci/devices/*; do
        [ -e "$d" ] || continue
        vendor=$(cat "$d/vendor" 2>/dev/null) class=$(cat "$d/class" 2>/dev/null)
        # NVIDIA devices, network controllers (0x02xxxx) and InfiniBand-class ones (0x0207xx).
        case "$vendor/$class" in 0x10de/* | */0x02*) ;; *) continue ;; esac
        printf '%-14s %-8s %-10s %-5s %s\n' "$(basename "$d")" "$vendor" "$class" \
            "$(cat "$d/numa_node" 2>/dev/null)" "$(realpath "$d")"
    done
} >"$OUT/pci.txt"

{
    for c in /sys/class/infiniband/* /sys/class/net/*; do
        [ -e "$c" ] || continue
        printf '%-40s %s\n' "$c" "$(realpath -e "$c/device" 2>/dev/null || echo '(no device: virtual)')"
    done
} >"$OUT/net.txt"

if command -v nvidia-smi >/dev/null; then
    nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
else
    echo "nvidia-smi not found" >"$OUT/topo.txt"
fi

sed -n '/^NICs by GPU/,/^CUDA/p' "$OUT/info.txt"
echo "nics_info.sh: wrote info.txt, info.json, pci.txt, net.txt, topo.txt to $OUT"
exit $rc
