#!/usr/bin/env bash
# Removes libfabric shm regions (/dev/shm/<pid>:..., and fabtests' /dev/shm/<pid>) left by processes
# that no longer exist (a killed test rank cannot unlink its regions; the library's survivors remove
# a dead peer's regions themselves, but a job whose every rank was killed leaves them). A later
# process that gets the same pid would otherwise find a default-named endpoint taken and fail
# fi_enable with -FI_EBUSY (-16). Prints one line when it removed something.
n=0
bytes=0
for f in /dev/shm/[0-9]*; do
    [ -f "$f" ] || continue
    pid=${f#/dev/shm/}
    pid=${pid%%:*}
    case "$pid" in *[!0-9]*) continue ;; esac
    [ -d "/proc/$pid" ] && continue
    size=$(stat -c %s -- "$f" 2>/dev/null || echo 0)
    rm -f -- "$f" && { n=$((n + 1)); bytes=$((bytes + size)); }
done
[ "$n" -eq 0 ] || echo "clean-shm: removed $n shm regions of exited processes ($((bytes / 1048576)) MiB)"
