# Sourced by the scripts: CUDA wheels and libfabric locations (written by the setup scripts).
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091
source "$_root/.deps/cuda.env"
# shellcheck disable=SC1091
source "$_root/.deps/libfabric.env"
export CARGO_TERM_COLOR=never
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo}
