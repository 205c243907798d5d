#!/usr/bin/env bash
# Fails when any C++/CUDA source differs from what clang-format (.clang-format) would write.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' 2>/dev/null || true)
if [ -z "$files" ]; then
  files=$(find include src tests bench -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh')
fi
# shellcheck disable=SC2086
if ! out=$(clang-format --dry-run --Werror $files 2>&1); then
  echo "$out" | head -40
  echo "clang-format: the files above are not formatted; run 'make format'" >&2
  exit 1
fi
echo "clang-format: $(echo "$files" | wc -w) files formatted"
