#!/usr/bin/env bash
# Removes libfabric shm regions (/dev/shm/<pid>:<domain>:<ep>) left by processes that no longer
# exist (a killed test rank cannot unlink its regions). A later process that gets the same pid would
# otherwise find its endpoint name taken and fail fi_enable with -FI_EBUSY (-16).
for f in /dev/shm/[0-9]*:*; do
    [ -e "$f" ] || continue
    pid=${f#/dev/shm/}
    pid=${pid%%:*}
    case "$pid" in *[!0-9]*) continue ;; esac
    [ -d "/proc/$pid" ] || rm -f -- "$f"
done
