// CUDA token embedding. Forward: a gather, one thread per 16-byte chunk of an output row.
// Backward, deterministic without float atomics (the order of embedding_impl.h, bit for bit the
// CPU twin's):
//   1. keys[n] = tokens[n] (V for an out-of-range token, sorted last and skipped), vals[n] = n;
//   2. a stable radix sort of the (key, val) pairs (CUB): equal tokens keep increasing positions;
//   3. one block per chunk of kEmbeddingBwdChunk sorted entries sums each run of equal keys in it
//      (a "piece") in position order; a run wholly inside the chunk is added to dtable directly,
//      a piece of a run that crosses a chunk boundary goes to a slot of the workspace;
//   4. the chunk where such a run starts adds its pieces in chunk order and then to dtable.
// A token that occurs thousands of times is thus summed by many blocks, not serially by one.
#include <cub/device/device_radix_sort.cuh>

#include "core/pdl.cuh"
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
  pdl::grid_sync();
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
  pdl::grid_sync();
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= n_rows) return;
  const int32_t tok = tokens[n];
  keys[n] = (tok >= 0 && tok < vocab) ? uint32_t(tok) : uint32_t(vocab);
  vals[n] = int32_t(n);
}

constexpr int kChunk = int(kEmbeddingBwdChunk);

// Step 3. Blocks (b, ·) sum sorted entries [b·C, b·C + C) of dout [N, D] by runs of equal keys
// ("pieces"): thread (x, y) handles the piece that starts at entry y of the chunk, if one does,
// for columns of lane x, so that distinct tokens are summed in parallel and only repeats of one
// token are sequential. slots [chunks, 2, D] f32: [b][0] the chunk's first piece when its run
// started in an earlier chunk, [b][1] its last piece when its run started here and continues
// into the next chunk; other pieces are whole runs, added to dtable directly.
template <bool kVec>
__global__ void embedding_bwd_chunk_kernel(float* __restrict__ dtable, float* __restrict__ slots,
                                           const uint32_t* __restrict__ keys,
                                           const int32_t* __restrict__ vals,
                                           const uint16_t* __restrict__ dout, int64_t n_rows,
                                           int64_t d, int64_t vocab) {
  pdl::grid_sync();
  __shared__ uint32_t skey[kChunk];
  __shared__ int32_t sval[kChunk];
  const int64_t b = blockIdx.x, start = b * kChunk;
  const int cnt = int(min(int64_t(kChunk), n_rows - start));
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  if (tid < cnt) {
    skey[tid] = keys[start + tid];
    sval[tid] = vals[start + tid];
  }
  __syncthreads();
  const int j = threadIdx.y;
  if (j >= cnt) return;
  const uint32_t key = skey[j];
  if (key >= vocab || (j > 0 && skey[j - 1] == key)) return;  // not a piece's first entry
  int e = j + 1;
  while (e < cnt && skey[e] == key) ++e;
  const bool from_prev = j == 0 && start > 0 && keys[start - 1] == key;
  const bool to_next = e == cnt && start + cnt < n_rows && keys[start + cnt] == key;
  constexpr int kE = kVec ? 8 : 1;
  const int64_t step = int64_t(gridDim.y) * blockDim.x * kE;
  for (int64_t c = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kE; c < d; c += step) {
    float acc[kE];
#pragma unroll
    for (int k = 0; k < kE; ++k) acc[k] = 0.0f;
    for (int r = j; r < e; ++r) {
      const uint16_t* row = dout + int64_t(sval[r]) * d + c;
      if constexpr (kVec) {
        float v[8];
        load8(row, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += v[k];
      } else {
        acc[0] += load1(row);
      }
    }
    float* dst = from_prev ? slots + (2 * b) * d + c
                 : to_next ? slots + (2 * b + 1) * d + c
                           : dtable + int64_t(key) * d + c;
    if constexpr (kVec) {
      if (from_prev || to_next) {
        store8(dst, acc);
      } else {
        float v[8];
        load8_rw(dst, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] += acc[k];
        store8(dst, v);
      }
    } else {
      dst[0] = (from_prev || to_next) ? acc[0] : dst[0] + acc[0];
    }
  }
}

// Step 4. Block b: if the run of its last key starts in chunk b and continues, total =
// slots[b][1] + slots[b+1][0] + … (in chunk order) and dtable row += total.
__global__ void embedding_bwd_carry_kernel(float* __restrict__ dtable,
                                           const float* __restrict__ slots,
                                           const uint32_t* __restrict__ keys, int64_t n_rows,
                                           int64_t d, int64_t vocab) {
  pdl::grid_sync();
  __shared__ int64_t last_chunk;
  const int64_t b = blockIdx.x, start = b * kChunk, end = min(n_rows, start + kChunk);
  if (end >= n_rows) return;
  const uint32_t key = keys[end - 1];
  if (key >= vocab || keys[end] != key) return;
  if (keys[start] == key && start > 0 && keys[start - 1] == key) return;  // not the run's start
  if (threadIdx.x == 0) {
    // The run covers chunks b+1 … b2 entirely while it continues past their ends.
    int64_t b2 = b + 1;
    while ((b2 + 1) * kChunk < n_rows && keys[(b2 + 1) * kChunk] == key) ++b2;
    last_chunk = b2;
  }
  __syncthreads();
  const int64_t b_last = last_chunk;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float total = slots[(2 * b + 1) * d + c];
    for (int64_t bb = b + 1; bb <= b_last; ++bb) total += slots[(2 * bb) * d + c];
    dtable[int64_t(key) * d + c] += total;
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
    pdl::launch(embedding_fwd_kernel<true>, grid_for(n_rows * d / 8), kThreads, 0, s, o,
                tokens.ptr<const int32_t>(), t, n_rows, d, vocab);
  } else {
    pdl::launch(embedding_fwd_kernel<false>, grid_for(n_rows * d), kThreads, 0, s, o,
                tokens.ptr<const int32_t>(), t, n_rows, d, vocab);
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
  const int64_t chunks = ceil_div(n_rows, kChunk);
  const size_t arr = align256(size_t(n) * 4);
  const size_t slot_bytes = align256(size_t(chunks) * 2 * size_t(d) * sizeof(float));
  uint8_t* ws = static_cast<uint8_t*>(ctx.workspace(4 * arr + slot_bytes + align256(cub_bytes)));
  uint32_t* keys_in = reinterpret_cast<uint32_t*>(ws);             // [N]
  int32_t* vals_in = reinterpret_cast<int32_t*>(ws + arr);         // [N]
  uint32_t* keys_out = reinterpret_cast<uint32_t*>(ws + 2 * arr);  // [N], sorted
  int32_t* vals_out = reinterpret_cast<int32_t*>(ws + 3 * arr);    // [N], positions by key
  float* slots = reinterpret_cast<float*>(ws + 4 * arr);           // [chunks, 2, D]
  void* cub_tmp = ws + 4 * arr + slot_bytes;
  pdl::launch(embedding_keys_kernel, int(ceil_div(n_rows, kThreads)), kThreads, 0, s, keys_in,
              vals_in, tokens.ptr<const int32_t>(), n_rows, vocab);
  LOWBIT_CUDA_CHECK_LAUNCH();
  LOWBIT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, keys_in, keys_out, vals_in,
                                                    vals_out, n, 0, end_bit, s));
  float* dt = dtable.ptr<float>();
  const uint16_t* dy = dout.ptr<const uint16_t>();
  const bool vec = d % 8 == 0 && aligned16(dt) && aligned16(dy);
  // Threads (x, y): y = entry of the chunk, x = column lane (8 columns each when vec).
  const int64_t lanes = vec ? d / 8 : d;
  const int lanes_per_block = kWarp;  // one warp per (entry, 256-column tile): 512-byte rows
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(std::min<int64_t>(
                                                     ceil_div(lanes, lanes_per_block), 65535)));
  const dim3 block(lanes_per_block, kChunk);
  if (vec) {
    pdl::launch(embedding_bwd_chunk_kernel<true>, grid, block, 0, s, dt, slots, keys_out, vals_out,
                dy, n_rows, d, vocab);
  } else {
    pdl::launch(embedding_bwd_chunk_kernel<false>, grid, block, 0, s, dt, slots, keys_out, vals_out,
                dy, n_rows, d, vocab);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  const int carry_threads = int(std::min<int64_t>(kThreads, ceil_div(d, kWarp) * kWarp));
  pdl::launch(embedding_bwd_carry_kernel, grid.x, carry_threads, 0, s, dt, slots, keys_out, n_rows,
              d, vocab);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail
