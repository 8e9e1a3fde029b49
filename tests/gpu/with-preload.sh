#!/bin/sh
# with-preload.sh PROGRAM ARGS...: runs PROGRAM with $NVSHMEM_EFA_PRELOAD put in front of
# LD_PRELOAD. Tools that start the program themselves (compute-sanitizer) set LD_PRELOAD to their own
# injection library and drop the caller's: placed between the tool and the program, this script
# brings the transport back while keeping the tool's library.
if [ -z "${NVSHMEM_EFA_PRELOAD:-}" ]; then
    echo "with-preload.sh: NVSHMEM_EFA_PRELOAD is not set" >&2
    exit 2
fi
LD_PRELOAD="$NVSHMEM_EFA_PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}"
export LD_PRELOAD
exec "$@"
