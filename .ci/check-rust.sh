#!/usr/bin/env bash
# Stops with one line unless cargo, rustc >= Cargo.toml's rust-version, rustfmt and clippy are on PATH.
# Rust is the one prerequisite .ci/run cannot install (Debian 12's rustc is 1.63); rustup provides it:
#   curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
set -uo pipefail
cd "$(dirname "$0")/.."
want=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml)
fix="install it with rustup (https://rustup.rs; then: rustup component add rustfmt clippy) and open a new shell"
fail() { echo "[ci] needs a Rust toolchain >= $want with rustfmt and clippy: $1; $fix" >&2; exit 1; }
command -v cargo >/dev/null 2>&1 || fail "cargo is not on PATH"
have=$(rustc --version 2>/dev/null | sed -n 's/^rustc \([0-9]*\.[0-9]*\)\..*/\1/p')
[ -n "$have" ] || fail "rustc does not run"
older=$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)
[ "$older" = "$want" ] || fail "rustc is $have"
cargo fmt --version >/dev/null 2>&1 || fail "rustfmt is missing"
cargo clippy --version >/dev/null 2>&1 || fail "clippy is missing"
