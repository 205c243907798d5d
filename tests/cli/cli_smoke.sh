#!/usr/bin/env bash
# Smoke test of the `lowbit` binary: help, info (table and JSON), bench quant's options and
# errors, and the usage-error paths.
# Usage: cli_smoke.sh path/to/lowbit
set -euo pipefail

bin=${1:?usage: cli_smoke.sh path/to/lowbit}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in out err; do
    if [[ -s $tmp/$f ]]; then
      echo "--- std$f:" >&2
      head -40 "$tmp/$f" >&2
    fi
  done
  exit 1
}

# run EXPECTED_STATUS ARGS...: runs the binary, keeps stdout/stderr in $tmp/out and $tmp/err.
run() {
  local want=$1 got=0
  shift
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err" || got=$?
  [[ $got -eq $want ]] || fail "'lowbit $*' exited $got, expected $want"
}

run 0 --help
grep -q "info" "$tmp/out" || fail "'lowbit --help' does not list the info command"
run 0 info --help
grep -q -- "--json" "$tmp/out" || fail "'lowbit info --help' does not list --json"
run 0 --version
grep -q "^lowbit [0-9]" "$tmp/out" || fail "'lowbit --version' does not print 'lowbit <version>'"

run 0 info
for recipe in bf16 fp8 fp8-current fp8-block mxfp8 nvfp4; do
  grep -q -- "^  $recipe " "$tmp/out" || fail "'lowbit info' has no line for recipe $recipe"
done
info_table=$(cat "$tmp/out")

run 0 info --json
python3 - "$tmp/out" <<'EOF' || fail "'lowbit info --json' is not the expected JSON"
import json, sys
with open(sys.argv[1]) as f:
    info = json.load(f)
names = [r["name"] for r in info["recipes"]]
want = ["bf16", "fp8", "fp8-current", "fp8-block", "mxfp8", "nvfp4"]
assert names == want, f"recipes {names}, expected {want}"
levels = {"native", "emulated", "unavailable"}
for r in info["recipes"]:
    assert r["cpu"]["support"] in levels, r
    assert len(r["gpus"]) == len(info["gpus"]), r
    for g in r["gpus"]:
        assert g["support"] in levels and g["reason"], r
for lib in ("cuda_runtime", "cuda_driver", "cublaslt", "cudnn", "nccl"):
    assert lib in info["libraries"], f"libraries.{lib} missing"
assert info["path"] in ("cpu", "gpu"), info["path"]
EOF
json_path=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$tmp/out")

# Without a GPU, info says that lowbit takes the CPU path (table and JSON agree).
if [[ ! -e /dev/nvidia0 && $json_path != cpu ]]; then
  fail "'lowbit info --json' reports path '$json_path' on a machine without /dev/nvidia0"
fi
if [[ $json_path == cpu ]]; then
  grep -q "CPU path" <<<"$info_table" || fail "'lowbit info' found no GPU but does not say it takes the CPU path"
fi

# bench quant: its options, a bad --shapes (rejected before any GPU is needed), and on a machine
# without a GPU a clear error instead of a crash.
run 0 bench --help
grep -q "quant" "$tmp/out" || fail "'lowbit bench --help' does not list quant"
run 0 bench quant --help
for opt in --shapes --iters --json-out; do
  grep -q -- "$opt" "$tmp/out" || fail "'lowbit bench quant --help' does not list $opt"
done
run 2 bench quant --shapes 8192
grep -q "error: --shapes: '8192' is not MxK" "$tmp/err" ||
  fail "bad --shapes: no 'is not MxK' error"
run 2 bench quant --iters 0
grep -q -- "--iters" "$tmp/err" || fail "--iters 0: the message does not name --iters"
if [[ $json_path == cpu ]]; then
  run 2 bench quant
  grep -q "error: bench quant needs a CUDA GPU" "$tmp/err" ||
    fail "'lowbit bench quant' without a GPU does not say that it needs one"
fi

run 2 bogus-command
grep -q "error:" "$tmp/err" || fail "unknown command: no 'error:' line"
grep -q "bogus-command" "$tmp/err" || fail "unknown command: the message does not name it"
grep -q "Usage:" "$tmp/err" || fail "unknown command: no usage printed"

run 2 --bogus-flag
grep -q "bogus-flag" "$tmp/err" || fail "unknown top-level flag: the message does not name it"

run 2 info --bogus-flag
grep -q "error:" "$tmp/err" || fail "unknown info flag: no 'error:' line"
grep -q "bogus-flag" "$tmp/err" || fail "unknown info flag: the message does not name it"
grep -q "Usage: lowbit info" "$tmp/err" || fail "unknown info flag: no usage of 'lowbit info'"

run 2
grep -q "Usage:" "$tmp/err" || fail "no command: no usage printed"

echo "cli_smoke: ok ($json_path path)"
