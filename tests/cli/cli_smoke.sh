#!/usr/bin/env bash
# Smoke test of the `lowbit` binary: help, info (table and JSON), bench quant's, bench gemm's and
# bench ops' options and errors, quantize of a small safetensors file, and the usage-error paths.
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

# bench gemm: its options, bad --shapes / --modes (rejected before any GPU is needed), and on a
# machine without a GPU a clear error instead of a crash.
run 0 bench --help
grep -q "gemm" "$tmp/out" || fail "'lowbit bench --help' does not list gemm"
run 0 bench gemm --help
for opt in --shapes --modes --roles --iters --warmup --json-out --fused-parts; do
  grep -q -- "$opt" "$tmp/out" || fail "'lowbit bench gemm --help' does not list $opt"
done
for word in 124m 1b 8b square fp8-block mxfp8 nvfp4; do
  grep -q -- "$word" "$tmp/out" || fail "'lowbit bench gemm --help' does not mention $word"
done
run 2 bench gemm --shapes 8192x8192
grep -q "error: --shapes: '8192x8192' is neither MxNxK" "$tmp/err" ||
  fail "bench gemm, bad --shapes: no 'is neither MxNxK' error"
run 2 bench gemm --modes fp4
grep -q "error: --modes: unknown mode 'fp4'" "$tmp/err" ||
  fail "bench gemm, bad --modes: no 'unknown mode' error"
run 2 bench gemm --iters 0
grep -q -- "--iters" "$tmp/err" || fail "bench gemm --iters 0: the message does not name --iters"
run 2 bench gemm --fused-parts -1
grep -q -- "--fused-parts" "$tmp/err" ||
  fail "bench gemm --fused-parts -1: the message does not name --fused-parts"
if [[ $json_path == cpu ]]; then
  run 2 bench gemm --shapes 124m --json-out "$tmp/gemm.jsonl"
  grep -q "error: bench gemm needs a CUDA GPU" "$tmp/err" ||
    fail "'lowbit bench gemm' without a GPU does not say that it needs one"
  [[ ! -e $tmp/gemm.jsonl ]] || fail "'lowbit bench gemm' without a GPU wrote its --json-out file"
fi

# bench ops: its options, a bad --presets (rejected before any GPU is needed), and on a machine
# without a GPU a clear error instead of a crash.
run 0 bench ops --help
for opt in --presets --iters --json-out; do
  grep -q -- "$opt" "$tmp/out" || fail "'lowbit bench ops --help' does not list $opt"
done
run 2 bench ops --presets 7b
grep -q "error: --presets: unknown preset '7b'" "$tmp/err" ||
  fail "bench ops, bad --presets: no 'unknown preset' error"
if [[ $json_path == cpu ]]; then
  run 2 bench ops --json-out "$tmp/ops.jsonl"
  grep -q "error: bench ops needs a CUDA GPU" "$tmp/err" ||
    fail "'lowbit bench ops' without a GPU does not say that it needs one"
  [[ ! -e $tmp/ops.jsonl ]] || fail "'lowbit bench ops' without a GPU wrote its --json-out file"
  # --presets none (the copy and attention rows only) is a valid choice: the error is the GPU's.
  run 2 bench ops --presets none
  grep -q "error: bench ops needs a CUDA GPU" "$tmp/err" ||
    fail "'lowbit bench ops --presets none' without a GPU does not say that it needs one"
fi

# quantize: a small safetensors checkpoint (a 64x64 BF16 matrix, a rank-1 F32 norm) converted
# to nvfp4 and fp8; then a truncated input and an unknown recipe.
run 0 quantize --help
for word in --recipe nvfp4 fp8-current Rank-1; do
  grep -q -- "$word" "$tmp/out" || fail "'lowbit quantize --help' does not mention $word"
done
python3 - "$tmp/in.safetensors" <<'EOF' || fail "cannot write the test safetensors file"
import json, math, struct, sys
def bf16(x):
    return struct.pack("<H", struct.unpack("<I", struct.pack("<f", x))[0] >> 16)
w = b"".join(bf16(math.sin(i * 0.37) * (1 + i % 7)) for i in range(64 * 64))
n = struct.pack("<64f", *[1.0 + i / 64 for i in range(64)])
header = {"__metadata__": {"format": "pt", "layout.stale": "from another tool"},
          "layers.0.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, len(n)]},
          "layers.0.w": {"dtype": "BF16", "shape": [64, 64],
                         "data_offsets": [len(n), len(n) + len(w)]}}
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + n + w)
EOF
# check_quantized FILE RECIPE: names, dtypes, shapes, metadata and offsets of a quantize output.
check_quantized() {
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys
path, recipe = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
(n,) = struct.unpack("<Q", data[:8])
assert n % 8 == 0, f"header length {n} is not a multiple of 8"
h = json.loads(data[8:8 + n])
meta = h.pop("__metadata__")
assert meta["quantization"] == recipe, meta
assert meta["format"] == "lowbit" and meta["version"] == "1", meta
layout = {"layout.data", "layout.scale", "layout.copied"}
if recipe == "nvfp4":
    layout.add("layout.scale_2")
assert {k for k in meta if k.startswith("layout.")} == layout, meta
want = {"layers.0.norm.weight": ("F32", [64]), "layers.0.w_scale": ("F32", [1])}
if recipe == "nvfp4":
    want.update({"layers.0.w": ("U8", [64, 32]), "layers.0.w_scale": ("F8_E4M3", [64, 4]),
                 "layers.0.w_scale_2": ("F32", [1])})
else:
    want["layers.0.w"] = ("F8_E4M3", [64, 64])
got = {k: (v["dtype"], v["shape"]) for k, v in h.items()}
assert got == want, f"tensors {got}, expected {want}"
end = max(v["data_offsets"][1] for v in h.values())
assert end == len(data) - 8 - n, f"data buffer {len(data) - 8 - n} bytes, offsets end at {end}"
EOF
}
run 0 quantize "$tmp/in.safetensors" "$tmp/nvfp4.safetensors" --recipe nvfp4
grep -q "1 converted, 1 copied" "$tmp/out" || fail "quantize nvfp4: no '1 converted, 1 copied' summary"
grep -q "relative error" "$tmp/out" || fail "quantize nvfp4: no relative error in the summary"
check_quantized "$tmp/nvfp4.safetensors" nvfp4 || fail "quantize --recipe nvfp4: unexpected output"
run 0 quantize "$tmp/in.safetensors" "$tmp/fp8.safetensors" --recipe fp8
check_quantized "$tmp/fp8.safetensors" fp8 || fail "quantize --recipe fp8: unexpected output"
if ls "$tmp" | grep -q "tmp-"; then fail "quantize left a temporary file behind"; fi
# A quantize output is not quantized again (its codes and scales would be read as weights).
run 2 quantize "$tmp/nvfp4.safetensors" "$tmp/t.safetensors" --recipe fp8
grep -q "already quantized (with recipe 'nvfp4'); quantize the original" "$tmp/err" ||
  fail "quantize of a quantized file: not refused clearly"
[[ ! -e $tmp/t.safetensors ]] || fail "quantize of a quantized file: an output file was written"

head -c 200 "$tmp/in.safetensors" >"$tmp/trunc.safetensors"
run 2 quantize "$tmp/trunc.safetensors" "$tmp/t.safetensors" --recipe nvfp4
grep -q "^error: .*trunc.safetensors" "$tmp/err" || fail "truncated input: no 'error:' naming the file"
[[ ! -e $tmp/t.safetensors ]] || fail "truncated input: an output file was written"
run 2 quantize "$tmp/in.safetensors" "$tmp/t.safetensors" --recipe fp3
grep -q "unknown recipe 'fp3'" "$tmp/err" || fail "bad --recipe: no 'unknown recipe' error"
# OUT naming IN (by another path) would replace the source weights: refused, IN untouched.
cp "$tmp/in.safetensors" "$tmp/in.copy"
run 2 quantize "$tmp/in.safetensors" "$tmp/./in.safetensors" --recipe mxfp8
grep -q "OUT is the input file" "$tmp/err" || fail "quantize IN IN: not refused clearly"
cmp -s "$tmp/in.safetensors" "$tmp/in.copy" || fail "quantize IN IN: the input was changed"
run 2 quantize "$tmp/in.safetensors" "$tmp/" --recipe mxfp8
grep -q "is a directory" "$tmp/err" || fail "quantize to a directory: unclear error"
run 2 quantize "$tmp" "$tmp/t.safetensors" --recipe mxfp8
grep -q "is a directory, not a safetensors file" "$tmp/err" || fail "quantize of a directory: unclear"
run 2 quantize "$tmp/in.safetensors" "" --recipe mxfp8
grep -q "output file name is empty" "$tmp/err" || fail "quantize to an empty OUT: unclear error"
# OUT's directory is checked before the conversion, not when the output is written.
run 2 quantize "$tmp/in.safetensors" "$tmp/no/such/t.safetensors" --recipe mxfp8
grep -q "the directory $tmp/no/such does not exist" "$tmp/err" ||
  fail "quantize into a missing directory: unclear error"
run 2 quantize "$tmp/in.safetensors" "$tmp/in.copy/t.safetensors" --recipe mxfp8
grep -q "$tmp/in.copy is not a directory" "$tmp/err" || fail "quantize under a file: unclear error"
# Weights holding an inf or a NaN: converted, with a warning on stderr that counts the finite
# values the inf costs (its scale overflows: the tensor's for nvfp4, one 1x32 block's for mxfp8);
# a NaN does not enter the scales. A tensor the recipe cannot take gets a note on stderr.
python3 - "$tmp" <<'EOF' || fail "cannot write the inf / NaN safetensors files"
import struct, sys
def write(name, special):
    v = [0.5] * 1024
    v[3] = special
    data = struct.pack("<1024f", *v)
    h = ('{"w":{"dtype":"F32","shape":[32,32],"data_offsets":[0,%d]},'
         '"x":{"dtype":"F32","shape":[2,8],"data_offsets":[%d,%d]}}'
         % (len(data), len(data), len(data) + 64)).encode()
    h += b" " * (-len(h) % 8)
    open(f"{sys.argv[1]}/{name}", "wb").write(struct.pack("<Q", len(h)) + h + data + bytes(64))
write("inf.safetensors", float("inf"))
write("nan.safetensors", float("nan"))
EOF
lost="of the finite values sharing a scale with them"
run 0 quantize "$tmp/inf.safetensors" "$tmp/inf_nvfp4.safetensors" --recipe nvfp4
grep -q "warning: w \[32, 32\]: 1 non-finite source values; $lost, 1023 are lost" "$tmp/err" ||
  fail "quantize nvfp4 of a weight with an inf: the lost values are not counted"
run 0 quantize "$tmp/inf.safetensors" "$tmp/inf_mxfp8.safetensors" --recipe mxfp8
grep -q "warning: w \[32, 32\]: 1 non-finite source values; $lost, 31 are lost" "$tmp/err" ||
  fail "quantize mxfp8 of a weight with an inf: the lost values are not counted"
grep -q "note: x \[2, 8\] copied unchanged: mxfp8 needs K a multiple of 32" "$tmp/err" ||
  fail "quantize mxfp8 of a [2, 8] tensor: no note on stderr"
if grep -q "warning:\|note:" "$tmp/out"; then fail "quantize: a note or warning on stdout"; fi
grep -q "1 converted, 1 copied" "$tmp/out" || fail "quantize mxfp8 of inf.safetensors: no summary"
run 0 quantize "$tmp/nan.safetensors" "$tmp/nan_mxfp8.safetensors" --recipe mxfp8
grep -q "1 non-finite source values; the finite values sharing a scale with them are unaffected" \
  "$tmp/err" || fail "quantize mxfp8 of a weight with a NaN: no warning, or one claiming losses"

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

# train / eval / generate: flags users of the seed guides type, bad input, a tiny real run.
run 0 train --help
grep -q -- "--use_nvfp4" "$tmp/out" || fail "train --help: no --use_nvfp4"
grep -q -- "--grad_accum_steps" "$tmp/out" || fail "train --help: no --grad_accum_steps"
run 2 train --cpu --precision fp16
grep -q "fp16" "$tmp/err" || fail "unknown recipe: the message does not name it"
grep -q "nvfp4" "$tmp/err" || fail "unknown recipe: the valid ones are not listed"
PRECISION=bogus run 2 train --cpu
grep -q "bogus" "$tmp/err" || fail "PRECISION=bogus: the message does not name it"
run 2 train --cpu --batch_size 0
grep -q -- "--batch_size" "$tmp/err" || fail "batch_size 0: the message does not name the flag"
run 2 train --cpu --fp8_format e5m2
grep -q "hybrid or e4m3" "$tmp/err" || fail "fp8_format e5m2: no list of the valid formats"
run 2 train --cpu --recompute_block_outputs sometimes
grep -q -- "--recompute_block_outputs" "$tmp/err" ||
  fail "recompute_block_outputs sometimes: the message does not name the flag"
grep -q "auto" "$tmp/err" || fail "recompute_block_outputs sometimes: the valid values are not listed"
run 2 bench train --recompute_block_outputs sometimes
grep -q -- "--recompute_block_outputs" "$tmp/err" ||
  fail "bench train, bad --recompute_block_outputs: the message does not name the flag"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  run 2 bench train --presets tiny --recipes bf16 --steps 1 --warmup 1 --kernel-trace "$tmp/k.txt"
  grep -q "needs a GPU" "$tmp/err" || fail "bench train --kernel-trace on the CPU: unclear error"
  [[ ! -e $tmp/k.txt ]] || fail "bench train --kernel-trace on the CPU wrote a file"
fi
# Numeric flags are range-checked as given (NaN and infinities refused; negative is not "default").
run 2 train --cpu --precision nvfp4 --nvfp4_bf16_tail nan
grep -q -- "--nvfp4_bf16_tail: nan is outside \[0, 1\]" "$tmp/err" || fail "nvfp4_bf16_tail nan: unclear"
run 2 train --cpu --total_steps -5
grep -q -- "--total_steps: -5 is below" "$tmp/err" || fail "total_steps -5: not refused clearly"
run 2 train --cpu --time_limit_minutes inf
grep -q -- "--time_limit_minutes" "$tmp/err" || fail "time_limit_minutes inf: the flag is not named"
# Integer flags: text that is no integer, and values past the 64-bit range (strtoll's ERANGE),
# are named as such; so are the upper bounds of the bench flags.
for v in abc 1.5 ""; do
  run 2 train --cpu --batch_size "$v"
  grep -q -- "--batch_size: '$v' is not an integer" "$tmp/err" || fail "batch_size '$v': unclear"
done
run 2 train --cpu --total_steps 99999999999999999999
grep -q -- "--total_steps: 99999999999999999999 is above the largest allowed value, 9223372036854775807" \
  "$tmp/err" || fail "total_steps 99999999999999999999: not refused clearly"
run 2 train --cpu --total_steps -99999999999999999999
grep -q -- "--total_steps: -99999999999999999999 is below the smallest allowed value, 0" "$tmp/err" ||
  fail "total_steps -99999999999999999999: not refused clearly"
# An int flag: the bound is its type's, not int64's (CLI11 alone said "Could not convert").
run 2 train --cpu --batch_size 3000000000
grep -q -- "--batch_size: 3000000000 is above the largest allowed value, 2147483647" "$tmp/err" ||
  fail "batch_size 3000000000: not refused clearly"
run 2 generate "$tmp" --top_k 2147483648
grep -q -- "--top_k: 2147483648 is above the largest allowed value, 2147483647" "$tmp/err" ||
  fail "generate --top_k 2147483648: not refused clearly"
run 2 generate "$tmp" --max_tokens 3000000000
grep -q -- "--max_tokens: 3000000000 is above the largest allowed value, 2147483647" "$tmp/err" ||
  fail "generate --max_tokens 3000000000: not refused clearly"
run 2 bench gemm --iters 10001
grep -q -- "--iters: 10001 is above the largest allowed value, 10000" "$tmp/err" ||
  fail "bench gemm --iters 10001: not refused clearly"
run 2 bench quant --iters x
grep -q -- "--iters: 'x' is not an integer" "$tmp/err" || fail "bench quant --iters x: unclear"
run 2 train --cpu --n_layers 100000000 --total_steps 1 --out "$tmp/huge"
grep -q "n_layers 100000000 is above the limit" "$tmp/err" || fail "n_layers 1e8: no clear limit"
run 2 eval "$tmp/no-checkpoint"
grep -q "not a lowbit checkpoint" "$tmp/err" || fail "eval of a missing checkpoint: unclear error"
printf 'In the beginning was the word, and the word was with the text.\n%.0s' $(seq 1 400) \
  >"$tmp/corpus.txt"
run 0 train --cpu --use_fp8 --data "$tmp/corpus.txt" --vocab_size 300 --n_layers 2 \
  --batch_size 2 --seq_len 32 --total_steps 3 --eval_every 3 --sample_tokens 5 \
  --sample_prompt "In the" --out "$tmp/run"
grep -q "recipe fp8" "$tmp/out" || fail "train: the precision plan was not printed"
grep -q "first 1 of 2 blocks are recomputed" "$tmp/out" ||
  fail "train fp8: the first-block output recompute (auto: ceil(L/16) blocks) was not reported"
grep -q "sample:" "$tmp/out" || fail "train: no sample printed"
[[ -s $tmp/run/metrics.jsonl && -s $tmp/run/checkpoint/model.safetensors ]] ||
  fail "train: no metrics.jsonl or checkpoint"
# A fresh run into a directory holding a run is refused (it would replace its checkpoint)...
cp "$tmp/run/checkpoint/model.safetensors" "$tmp/model.before"
run 2 train --cpu --data "$tmp/corpus.txt" --vocab_size 300 --n_layers 2 --batch_size 2 \
  --seq_len 32 --total_steps 1 --sample_tokens 0 --out "$tmp/run"
grep -q "already holds a run" "$tmp/err" || fail "fresh train into a run directory: not refused"
grep -q -- "--overwrite_output_dir" "$tmp/err" || fail "fresh train into a run: no way out named"
cmp -s "$tmp/run/checkpoint/model.safetensors" "$tmp/model.before" ||
  fail "fresh train into a run directory: the checkpoint changed"
# ... and a checkpoint directory holding a foreign file is refused before training, not after.
mkdir -p "$tmp/run5/checkpoint" && echo notes >"$tmp/run5/checkpoint/notes.txt"
run 2 train --cpu --data "$tmp/corpus.txt" --vocab_size 300 --n_layers 2 --batch_size 2 \
  --seq_len 32 --total_steps 1 --sample_tokens 0 --out "$tmp/run5" --overwrite_output_dir
grep -q "notes.txt" "$tmp/err" || fail "checkpoint dir with a foreign file: not named"
[[ ! -e $tmp/run5/metrics.jsonl ]] || fail "checkpoint dir with a foreign file: training ran first"
run 0 eval "$tmp/run/checkpoint" --cpu --data "$tmp/corpus.txt" --seq_len 32
grep -q "perplexity" "$tmp/out" || fail "eval: no perplexity printed"
# JSONL is read as a corpus (records, not raw JSON text): a bad record is an error naming its line.
printf '{"text": "In the beginning was the word."}\n{"messages": 5}\n' >"$tmp/bad.jsonl"
run 2 eval "$tmp/run/checkpoint" --cpu --data "$tmp/bad.jsonl" --seq_len 8
grep -q "bad.jsonl:2" "$tmp/err" || fail "eval of a bad JSONL record: the line is not named"
# Chat records without an assistant reply: no token is scored, which is an error, not a NaN.
for i in 1 2 3 4; do
  printf '{"messages": [{"role": "user", "content": "In the beginning was the word %s"}]}\n' "$i"
done >"$tmp/unscored.jsonl"
run 2 eval "$tmp/run/checkpoint" --cpu --data "$tmp/unscored.jsonl" --seq_len 8
grep -q "unscored.jsonl: no scored tokens in the first" "$tmp/err" ||
  fail "eval of records without replies: no 'no scored tokens' error"
run 0 generate "$tmp/run/checkpoint" --cpu --prompt "In the" --max_tokens 5
grep -q "tokens/s (KV cache" "$tmp/err" || fail "generate: no tokens/s line for the KV cache"
grep -q "^In the" "$tmp/out" || fail "generate: the prompt is not echoed on stdout"
run 0 generate "$tmp/run/checkpoint" --cpu --prompt "In the" --max_tokens 5 --no_kv_cache
grep -q "full window per token" "$tmp/err" || fail "generate --no_kv_cache: not reported"
# Past max_seq_len (128, the tiny preset's): the cache is rebuilt from the last window.
run 0 generate "$tmp/run/checkpoint" --cpu --prompt "In the" --max_tokens 150 --temperature 0
gen_line=$(grep "^generated " "$tmp/err") || fail "generate past max_seq_len: no summary line"
gen_n=$(sed -E 's/^generated ([0-9]+) tokens.*/\1/' <<<"$gen_line")
gen_prefills=$(sed -E 's/.*; ([0-9]+) prefills?,.*/\1/' <<<"$gen_line")
[[ $gen_n =~ ^[0-9]+$ && $gen_prefills =~ ^[0-9]+$ ]] ||
  fail "generate past max_seq_len: unreadable summary '$gen_line'"
# The prompt plus the tokens must pass the 128 positions of the cache (else this checks nothing),
# and passing them takes a second prefill: the rebuild.
((gen_n >= 127)) || fail "generate past max_seq_len: the text stopped after $gen_n tokens"
((gen_prefills >= 2)) ||
  fail "generate past max_seq_len: $gen_n tokens, $gen_prefills prefill(s): the cache was not rebuilt"
run 2 generate "$tmp/run/checkpoint" --cpu --top_k -5
grep -q -- "--top_k: -5 is below" "$tmp/err" || fail "generate --top_k -5: not refused clearly"
run 2 generate "$tmp/run/checkpoint" --cpu --max_tokens -1
grep -q -- "--max_tokens" "$tmp/err" || fail "generate --max_tokens -1: the flag is not named"
run 0 train --cpu --data "$tmp/corpus.txt" --n_layers 2 --batch_size 2 --seq_len 32 \
  --total_steps 5 --out "$tmp/run" --resume "$tmp/run/checkpoint" --sample_tokens 0
grep -q "resumed from" "$tmp/out" || fail "train --resume: no resume line"
# A resume keeps an optimizer flag given on its command line, even one equal to the default
# (0.001), and takes the checkpoint's value for one not given.
run 0 train --cpu --data "$tmp/corpus.txt" --vocab_size 300 --n_layers 1 --batch_size 2 \
  --seq_len 32 --total_steps 4 --stop_at_step 2 --lr 0.002 --grad_clip 0.5 --eval_every 0 \
  --sample_tokens 0 --out "$tmp/run6"
run 0 train --cpu --data "$tmp/corpus.txt" --resume "$tmp/run6/checkpoint" --out "$tmp/run6" \
  --lr 0.001 --sample_tokens 0
grep -q "resume: lr 0.001 (the checkpoint's run used 0.002)" "$tmp/out" ||
  fail "resume --lr 0.001 (the default): the checkpoint's lr was taken instead"
grep -q "resume: grad_clip 0.5 from the checkpoint" "$tmp/out" ||
  fail "resume without --grad_clip: the checkpoint's grad_clip was not taken"
# --overwrite_output_dir keeps the run's tokenizer when --tokenizer names it (and says so).
run 0 train --cpu --data "$tmp/corpus.txt" --tokenizer "$tmp/run6/tokenizer.json" --n_layers 1 \
  --batch_size 2 --seq_len 32 --total_steps 1 --eval_every 0 --sample_tokens 0 --out "$tmp/run6" \
  --overwrite_output_dir
grep -q "its tokenizer is kept (--tokenizer names it)" "$tmp/out" ||
  fail "--overwrite_output_dir with the run's --tokenizer: not said that it is kept"
[[ -s $tmp/run6/tokenizer.json ]] || fail "--overwrite_output_dir removed the --tokenizer in use"

# bench train runs on the CPU: its --json-out is written whole (a temporary file renamed onto it),
# and a directory that does not exist is refused before anything is measured.
run 2 bench train --presets tiny --recipes bf16 --steps 1 --warmup 1 --json-out "$tmp/no/t.jsonl"
grep -q -- "--json-out $tmp/no/t.jsonl: $tmp/no is not a writable directory" "$tmp/err" ||
  fail "bench train --json-out into a missing directory: unclear error"
run 2 bench train --presets tiny --recipes bf16 --steps 1 --warmup 1 --json-out "$tmp"
grep -q -- "--json-out $tmp: is a directory; give a file" "$tmp/err" ||
  fail "bench train --json-out naming a directory: unclear error"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  run 0 bench train --presets tiny --recipes bf16 --steps 1 --warmup 1 --json-out "$tmp/t.jsonl"
  python3 - "$tmp/t.jsonl" <<'EOF' || fail "bench train --json-out: not one JSON row"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1 and rows[0]["bench"] == "train" and rows[0]["preset"] == "tiny", rows
EOF
  if ls "$tmp" | grep -q "t.jsonl.tmp-"; then fail "bench train left a temporary file behind"; fi
fi

run 0 train --cpu --precision nvfp4 --data "$tmp/corpus.txt" --vocab_size 300 --n_layers 1 \
  --batch_size 2 --seq_len 32 --total_steps 2 --eval_every 0 --sample_tokens 0 --out "$tmp/run4"
grep -q "outputs are recomputed in the backward" "$tmp/out" ||
  fail "train nvfp4: the block-output recompute (auto) was not reported"

echo "cli_smoke: ok ($json_path path)"
