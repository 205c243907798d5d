// CUDA token embedding. Forward: a gather, one thread per 16-byte chunk of an output row.
// Backward, deterministic without float atomics:
//   1. keys[n] = tokens[n] (V for an out-of-range token), vals[n] = n;
//   2. a stable radix sort of (key, val) pairs (CUB), so equal tokens keep increasing positions;
//   3. one block per run of equal keys (the block at a run's first position does the work) sums
//      the run's dout rows in that order into fp32 registers and adds the sum to dtable once.
// This is the CPU twin's order (embedding_ref.cpp), so CPU and GPU agree bit for bit; a row hit
// by many tokens is summed by one block (fine for natural-language token counts).
#include <cub/device/device_radix_sort.cuh>

#include "lowbit/core/cuda_check.h"
#include "ops/embedding_impl.h"
#include "ops/ops_cuda.cuh"

namespace lowbit::ops_detail {

using namespace ops_cuda;

namespace {

constexpr int kThreads = 256;
constexpr uint16_t kBf16NaN = 0x7FC0;

// out [N, D] = table [V, D] rows; kVec: D % 8 == 0 and 16-byte aligned rows, one thread per 8
// elements; otherwise one thread per element.
template <bool kVec>
__global__ void embedding_fwd_kernel(uint16_t* __restrict__ out, const int32_t* __restrict__ tokens,
                                     const uint16_t* __restrict__ table, int64_t n_rows, int64_t d,
                                     int64_t vocab) {
  constexpr int kE = kVec ? 8 : 1;
  const int64_t per_row = d / kE;
  const int64_t total = n_rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / per_row, c = (i - n * per_row) * kE;
    const int32_t tok = __ldg(tokens + n);
    const bool ok = tok >= 0 && tok < vocab;
    if constexpr (kVec) {
      const uint32_t nan2 = uint32_t(kBf16NaN) * 0x10001u;
      const uint4 v = ok ? __ldg(reinterpret_cast<const uint4*>(table + tok * d + c))
                         : make_uint4(nan2, nan2, nan2, nan2);
      *reinterpret_cast<uint4*>(out + n * d + c) = v;
    } else {
      out[n * d + c] = ok ? table[tok * d + c] : kBf16NaN;
    }
  }
}

__global__ void embedding_keys_kernel(uint32_t* __restrict__ keys, int32_t* __restrict__ vals,
                                      const int32_t* __restrict__ tokens, int64_t n_rows,
                                      int64_t vocab) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= n_rows) return;
  const int32_t tok = tokens[n];
  keys[n] = (tok >= 0 && tok < vocab) ? uint32_t(tok) : uint32_t(vocab);
  vals[n] = int32_t(n);
}

// Block b handles the run of equal keys that starts at sorted position b (if one does).
// dtable [V, D] f32 += Σ_run dout [N, D] rows, in increasing position.
template <bool kVec>
__global__ void embedding_bwd_kernel(float* __restrict__ dtable, const uint32_t* __restrict__ keys,
                                     const int32_t* __restrict__ vals,
                                     const uint16_t* __restrict__ dout, int64_t n_rows, int64_t d,
                                     int64_t vocab) {
  const int64_t b = blockIdx.x;
  const uint32_t key = keys[b];
  if (key >= vocab || (b > 0 && keys[b - 1] == key)) return;
  constexpr int kE = kVec ? 8 : 1;
  for (int64_t c = int64_t(threadIdx.x) * kE; c < d; c += int64_t(blockDim.x) * kE) {
    float acc[kE];
#pragma unroll
    for (int k = 0; k < kE; ++k) acc[k] = 0.0f;
    for (int64_t j = b; j < n_rows && keys[j] == key; ++j) {
      const uint16_t* row = dout + int64_t(vals[j]) * d + c;
      if constexpr (kVec) {
        float v[8];
        load8(row, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += v[k];
      } else {
        acc[0] += load1(row);
      }
    }
    float* dst = dtable + int64_t(key) * d + c;
    if constexpr (kVec) {
      float v[8];
      load8_rw(dst, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] += acc[k];
      store8(dst, v);
    } else {
      dst[0] += acc[0];
    }
  }
}

int grid_for(int64_t items) {
  return int(std::min<int64_t>(ceil_div(items, kThreads), int64_t(1) << 20));
}

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

}  // namespace

void embedding_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& tokens,
                        const TensorView& table) {
  const int64_t n_rows = out.size(0), d = out.size(1), vocab = table.size(0);
  uint16_t* o = out.ptr<uint16_t>();
  const uint16_t* t = table.ptr<const uint16_t>();
  const bool vec = d % 8 == 0 && aligned16(o) && aligned16(t);
  cudaStream_t s = ctx.stream();
  if (vec) {
    embedding_fwd_kernel<true><<<grid_for(n_rows * d / 8), kThreads, 0, s>>>(
        o, tokens.ptr<const int32_t>(), t, n_rows, d, vocab);
  } else {
    embedding_fwd_kernel<false><<<grid_for(n_rows * d), kThreads, 0, s>>>(
        o, tokens.ptr<const int32_t>(), t, n_rows, d, vocab);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void embedding_bwd_cuda(Context& ctx, const TensorView& dtable, const TensorView& tokens,
                        const TensorView& dout) {
  const int64_t n_rows = dout.size(0), d = dout.size(1), vocab = dtable.size(0);
  LOWBIT_USER_CHECK(n_rows < (int64_t(1) << 31) && vocab < (int64_t(1) << 31),
                    "embedding_bwd: {} tokens and a vocabulary of {} exceed the GPU kernel's "
                    "32-bit indices",
                    n_rows, vocab);
  cudaStream_t s = ctx.stream();
  // Keys 0..V (V marks an invalid token): sort only the bits needed.
  int end_bit = 1;
  while ((uint64_t(1) << end_bit) <= uint64_t(vocab)) ++end_bit;
  const int n = int(n_rows);
  size_t cub_bytes = 0;
  LOWBIT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, end_bit, s));
  const size_t arr = align256(size_t(n) * 4);
  uint8_t* ws = static_cast<uint8_t*>(ctx.workspace(4 * arr + align256(cub_bytes)));
  uint32_t* keys_in = reinterpret_cast<uint32_t*>(ws);             // [N]
  int32_t* vals_in = reinterpret_cast<int32_t*>(ws + arr);         // [N]
  uint32_t* keys_out = reinterpret_cast<uint32_t*>(ws + 2 * arr);  // [N], sorted
  int32_t* vals_out = reinterpret_cast<int32_t*>(ws + 3 * arr);    // [N], positions by key
  void* cub_tmp = ws + 4 * arr;
  embedding_keys_kernel<<<int(ceil_div(n_rows, kThreads)), kThreads, 0, s>>>(
      keys_in, vals_in, tokens.ptr<const int32_t>(), n_rows, vocab);
  LOWBIT_CUDA_CHECK_LAUNCH();
  LOWBIT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, keys_in, keys_out, vals_in,
                                                    vals_out, n, 0, end_bit, s));
  float* dt = dtable.ptr<float>();
  const uint16_t* dy = dout.ptr<const uint16_t>();
  const bool vec = d % 8 == 0 && aligned16(dt) && aligned16(dy);
  const int64_t lanes = vec ? d / 8 : d;
  const int threads = int(std::min<int64_t>(kThreads, ceil_div(lanes, kWarp) * kWarp));
  if (vec) {
    embedding_bwd_kernel<true><<<n, threads, 0, s>>>(dt, keys_out, vals_out, dy, n_rows, d, vocab);
  } else {
    embedding_bwd_kernel<false><<<n, threads, 0, s>>>(dt, keys_out, vals_out, dy, n_rows, d, vocab);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail
