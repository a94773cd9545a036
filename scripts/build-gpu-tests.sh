#!/usr/bin/env bash
# Builds the Rust test binaries that need a CUDA device (the tests/cuda_*.rs
# targets with #[ignore = "needs a CUDA device: ..."] tests, release
# profile) and copies them, without debug info, to DEST (default
# .devbin/tests/) under their target names, for the `tests` step of
# scripts/gpu-check.sh on the GPU machine, which has no Rust toolchain:
#
#   scripts/build-gpu-tests.sh            # here
#   TESTS=./.devbin/tests QUIRE=./.devbin/quire scripts/gpu-check.sh   # there
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.devbin/tests}"
targets=()
for f in tests/cuda_*.rs; do
  targets+=(--test "$(basename "$f" .rs)")
done
json=$(mktemp)
trap 'rm -f "$json"' EXIT
cargo test --release --no-run --message-format=json "${targets[@]}" >"$json"
mkdir -p "$dest"
rm -f "$dest"/cuda_*
n=0
while IFS=$'\t' read -r name exe; do
  # Only binaries with device tests: gpu-check runs them with --ignored,
  # and one with none would run nothing.
  if [ -z "$("$exe" --list --ignored --format terse 2>/dev/null | grep ': test$' || true)" ]; then
    echo "$name: no #[ignore]d device tests, not copied"
    continue
  fi
  strip --strip-debug -o "$dest/$name" "$exe" 2>/dev/null || cp "$exe" "$dest/$name"
  echo "$name: $("$dest/$name" --list --ignored --format terse | grep -c ': test$') device tests -> $dest/$name ($(du -h "$dest/$name" | cut -f1))"
  n=$((n + 1))
done < <(jq -r 'select(.reason == "compiler-artifact" and .profile.test == true
                       and (.target.kind | index("test")) and .executable != null
                       and (.target.name | startswith("cuda_")))
                | [.target.name, .executable] | @tsv' "$json")
if [ "$n" -eq 0 ]; then
  echo "error: no test binary with device tests was built" >&2
  exit 1
fi
