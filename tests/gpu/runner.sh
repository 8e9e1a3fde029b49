# Sourced by the budgeted multi-step GPU runners (copy_kernel_run.sh, fence_run.sh, ab_run.sh):
#   runner_init TAG DEFAULT_OUT
# makes OUT (default DEFAULT_OUT) and turns it absolute, empties SUM=$OUT/summary.txt, starts the
# clock (T0), and these read the runner's `budget` (seconds) and `steps` (a comma list):
#   left            seconds of the budget left
#   want STEP       STEP is in steps
#   say TEXT...     prints "[TAG] TEXT" and appends it to SUM
#   fits WHAT SECS  whether SECS are left; if not, says that WHAT is skipped and fails
runner_init() {
    RUNNER_TAG=$1
    OUT=${OUT:-$2}
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    SUM=$OUT/summary.txt
    : >"$SUM"
    T0=$SECONDS
}
left() { echo $((budget - (SECONDS - T0))); }
want() { [[ ",$steps," == *",$1,"* ]]; }
say() { echo "[$RUNNER_TAG] $*" | tee -a "$SUM"; }
fits() {
    if [ "$(left)" -lt "$2" ]; then
        say "SKIPPED $1: needs $2 s, $(left) s left"
        return 1
    fi
}
