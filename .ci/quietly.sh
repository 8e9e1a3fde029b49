# Sourced by the set-up scripts. `quietly LOG CMD...` runs CMD with its stdout and stderr in the file
# LOG (the directory is created); on failure it prints the last 40 lines of LOG and its path, and
# returns CMD's status. A green set-up thus prints its progress lines only.
quietly() {
  local log=$1 rc=0
  shift
  mkdir -p "$(dirname "$log")"
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -40 "$log" >&2
    echo "FAILED (exit $rc): $*; full output: $log" >&2
  fi
  return "$rc"
}
