#!/usr/bin/env bash
# One call on a GPU host: the GPU test suite, then the benchmarks with their PyTorch peers.
# Usage: scripts/gpu_session.sh BIN_DIR OUT_DIR [tests|bench|all]
# BIN_DIR holds lowbit and lowbit_gpu_tests built on the build machine.
set -uo pipefail
bin=$1
out=$2
what=${3:-all}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
date -u +%Y-%m-%dT%H:%M:%SZ >> "$out/device.txt"
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  # Twice: device allocations poisoned (output a kernel leaves unwritten shows up), then plain
  # (the poisoning memset serialises kernels, the plain run keeps the overlap a real run has).
  LOWBIT_POISON_ALLOC=1 "$bin/lowbit_gpu_tests" --gtest_color=no 2>&1 | tee "$out/gpu_tests.log" | grep -E '^\[ *(OK|FAILED|PASSED) |Failure|differ' | head -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  LOWBIT_POISON_ALLOC=0 "$bin/lowbit_gpu_tests" --gtest_color=no > "$out/gpu_tests_plain.log" 2>&1 || status=1
  grep -E '^\[ *(FAILED|PASSED) ' "$out/gpu_tests_plain.log" | head -20
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  "$bin/lowbit" bench quant --json-out "$out/quant_lowbit.jsonl" 2>&1 | tee "$out/quant_lowbit.txt"
  PYTHONUNBUFFERED=1 timeout 330 python3 bench/peers/quant_torch.py --out "$out/quant_torch.jsonl" \
    > "$out/quant_torch.txt" 2> "$out/quant_torch.err"
  echo "torch peer exit $?"; tail -45 "$out/quant_torch.txt"
  timeout 400 "$bin/lowbit" bench gemm --json-out "$out/gemm_lowbit.jsonl" 2>&1 | tee "$out/gemm_lowbit.txt"
  PYTHONUNBUFFERED=1 timeout 330 python3 bench/peers/gemm_torch.py --out "$out/gemm_torch.jsonl" \
    > "$out/gemm_torch.txt" 2> "$out/gemm_torch.err"
  echo "torch gemm peer exit $?"; tail -45 "$out/gemm_torch.txt"
fi
exit $status
