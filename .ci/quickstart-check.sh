#!/usr/bin/env bash
# Keeps the README's quick starts and their GPU runner (tests/gpu/quickstart.sh, which reads the
# blocks out of README.md) in step, without a GPU: every block the runner needs is there, the shell
# blocks parse (bash -n), the Python script compiles, the runner parses, and every wheel file name
# the README gives carries the crate's version (Cargo.toml). (The wheel stage checks that name against
# the wheel it builds.)
set -uo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
bad() { echo "quickstart-check: $*"; fail=1; }
bash -n tests/gpu/quickstart.sh || bad "tests/gpu/quickstart.sh does not parse"
bash tests/gpu/quickstart.sh --extract-only "$work" || bad "README.md lacks quick-start blocks"
for b in torch-install torch-run cxx; do
  [ -s "$work/$b.txt" ] && { bash -n "$work/$b.txt" || bad "README block $b does not parse as shell"; }
done
script=$(sed -n 's/^<!-- quickstart:torch-script \([^ ]*\) -->$/\1/p' README.md)
if [ -n "$script" ] && [ -s "$work/$script" ]; then
  python3 -m py_compile "$work/$script" || bad "README's $script does not compile"
  grep -q "$script" "$work/torch-run.txt" || bad "the torch-run block does not run $script"
fi
# The wheel's version is the crate's (python/build_backend reads Cargo.toml's [package] version).
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)
names=$(grep -o 'nvshmem_efa_gda-[^ `]*\.whl' README.md | sort -u)
[ -n "$names" ] || bad "README.md names no wheel file"
for n in $names; do
  case "$n" in "nvshmem_efa_gda-$version-py3-none-manylinux_2_"*) ;; *) bad "README names $n; the crate's version is $version" ;; esac
done
[ "$fail" = 0 ] && echo "quickstart-check: $(echo $names), $(ls "$work"/*.txt | wc -l) blocks in step with tests/gpu/quickstart.sh"
exit "$fail"
