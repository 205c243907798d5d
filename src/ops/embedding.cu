// CUDA token embedding. Forward: a gather, one thread per 16-byte chunk of an output row.
// Backward, deterministic without float atomics (the order of embedding_impl.h, bit for bit the
// CPU twin's):
//   1. keys[n] = tokens[n] (V for an out-of-range token, sorted last and skipped), vals[n] = n,
//      stably sorted by key, so equal tokens keep increasing positions. Up to
//      kEmbeddingBwdMergeRankMaxRows tokens: a merge-rank sort (each segment of kSeg positions
//      sorted by one block, then every entry's global rank counted by binary searches in the
//      other segments, then scattered); beyond: a CUB radix sort (its one-sweep kernel runs on a
//      handful of blocks at these sizes, so it is latency-bound and slower below that limit).
//      While the merge-rank sort's first kernel runs on a few SMs, blocks on the others ask the
//      L2 for dout (where it fits half of it), which step 2 then reads from there;
//   2. one block per chunk of kEmbeddingBwdChunk sorted entries sums each run of equal keys in it
//      (a "piece") in position order; a run wholly inside the chunk is added to dtable directly,
//      a piece of a run that crosses a chunk boundary goes to a slot of the workspace;
//   3. one warp per chunk boundary: where a run starts in that chunk and continues, its pieces
//      are added in chunk order and then to dtable.
// A token that occurs thousands of times is thus summed by many blocks, not serially by one.
// Both sorts give the same (key, position) sequence, so the output bits do not depend on which
// one ran. The sorted pairs depend on the tokens only: the forward can write them to a sort plan
// (sorting on the side stream while the main stream gathers), and a backward given that plan
// starts at step 2.
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <optional>

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

// The sort key of a token: itself, or V for an out-of-range token (sorted last, skipped). Both
// sorts take their keys from here, so they sort the same sequence.
__device__ __forceinline__ uint32_t token_key(int32_t tok, int64_t vocab) {
  return (tok >= 0 && tok < vocab) ? uint32_t(tok) : uint32_t(vocab);
}

__global__ void embedding_keys_kernel(uint32_t* __restrict__ keys, int32_t* __restrict__ vals,
                                      const int32_t* __restrict__ tokens, int64_t n_rows,
                                      int64_t vocab) {
  pdl::grid_sync();
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= n_rows) return;
  const int32_t tok = tokens[n];
  keys[n] = token_key(tok, vocab);
  vals[n] = int32_t(n);
}

// ---- merge-rank sort (step 1 up to kEmbeddingBwdMergeRankMaxRows tokens) --------------------

// Positions are cut into segments of kSeg; one block sorts a segment, blocked over its threads.
// 1024: the rank kernel then searches ≤ 32 segments of 11 levels per entry, and holding all keys
// in its shared memory takes 4 bytes per token (128 KiB at the row limit).
constexpr int kSegThreads = 256;
constexpr int kSegItems = 4;
constexpr int kSeg = kSegThreads * kSegItems;
constexpr int kSegLog2 = 10;
static_assert(kSeg == 1 << kSegLog2, "the branchless searches need a power-of-two segment");
// 227 KiB: the most dynamic shared memory one block may opt into on sm_90.
static_assert((kEmbeddingBwdMergeRankMaxRows + kSeg - 1) / kSeg * kSeg * 4 <= 227 * 1024,
              "the rank kernel holds every key in shared memory");
// Threads of the rank kernel: one per entry; a block lies within one segment.
constexpr int kRankThreads = 256;
static_assert(kSeg % kRankThreads == 0, "a rank block must not straddle two segments");
// Segments searched at once per thread (independent shared-memory loads in flight).
constexpr int kRankGroup = 8;

// CUB's block sort is stable over the blocked arrangement (thread t holds items t·kSegItems …),
// which is position order here, so equal keys keep increasing positions.
using SegmentSort = cub::BlockRadixSort<uint32_t, kSegThreads, kSegItems, int32_t>;

// Block s: the keys of positions [s·kSeg, s·kSeg + len) of tokens [N], sorted stably, into
// seg_keys [N] at the same range, with their positions into seg_vals [N]. An entry's index
// within its segment is thus its rank among the segment's keys (ties by position).
// Blocks past the last segment (gridDim.x − segs of them) only ask the L2 for `prefetch_bytes`
// of `prefetch` (the backward's dout): the sort runs on a few SMs for several µs, in which HBM
// would idle; the chunk kernel then reads those rows from the L2.
__global__ void __launch_bounds__(kSegThreads)
    embedding_segment_sort_kernel(uint32_t* __restrict__ seg_keys, int32_t* __restrict__ seg_vals,
                                  const int32_t* __restrict__ tokens, int n_rows, int64_t vocab,
                                  int end_bit, const void* prefetch, int64_t prefetch_bytes) {
  pdl::grid_sync();
  __shared__ typename SegmentSort::TempStorage tmp;
  const int segs = (n_rows + kSeg - 1) >> kSegLog2;
  if (int(blockIdx.x) >= segs) {
    l2_prefetch_part(prefetch, prefetch_bytes,
                     int64_t(blockIdx.x - segs) * kSegThreads + threadIdx.x,
                     int64_t(gridDim.x - segs) * kSegThreads);
    return;
  }
  const int seg0 = blockIdx.x * kSeg;
  // Past the end: the largest key of end_bit bits, ≥ V, so these sort after every real entry
  // (after the V entries too, being later in the blocked order) and are not written back.
  const uint32_t pad = uint32_t((uint64_t(1) << end_bit) - 1);
  uint32_t key[kSegItems];
  int32_t val[kSegItems];
#pragma unroll
  for (int i = 0; i < kSegItems; ++i) {
    const int n = seg0 + threadIdx.x * kSegItems + i;
    const int32_t tok = n < n_rows ? tokens[n] : 0;
    key[i] = n >= n_rows ? pad : token_key(tok, vocab);
    val[i] = n;
  }
  SegmentSort(tmp).SortBlockedToStriped(key, val, 0, end_bit);
  // Striped: item i of thread t has rank i·kSegThreads + t (coalesced stores).
#pragma unroll
  for (int i = 0; i < kSegItems; ++i) {
    const int n = seg0 + i * kSegThreads + threadIdx.x;
    if (n < n_rows) {
      seg_keys[n] = key[i];
      seg_vals[n] = val[i];
    }
  }
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = smem_addr(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}

// Entry g of seg_keys [N] (segment s = g / kSeg, index p within it, key k, position seg_vals[g])
// goes to its place in the stable sort of all N entries: rank = p + Σ over segments t < s of
// #(keys ≤ k) + Σ over t > s of #(keys < k) (equal keys of earlier segments have smaller
// positions). keys_out [N], vals_out [N]: the sorted pairs. Dynamic shared memory: every
// segment's keys, [segs, kSeg] u32, the last one padded with 0xFFFFFFFF (above every key and
// search bound, so never counted).
__global__ void __launch_bounds__(kRankThreads)
    embedding_merge_rank_kernel(uint32_t* __restrict__ keys_out, int32_t* __restrict__ vals_out,
                                const uint32_t* __restrict__ seg_keys,
                                const int32_t* __restrict__ seg_vals, int n_rows) {
  pdl::grid_sync();
  extern __shared__ uint4 rank_smem[];
  uint32_t* skeys = reinterpret_cast<uint32_t*>(rank_smem);  // [segs, kSeg]
  const int segs = (n_rows + kSeg - 1) >> kSegLog2;
  const int g = blockIdx.x * kRankThreads + threadIdx.x;
  // Issued before the copy so that its latency overlaps it.
  const int32_t pos = g < n_rows ? seg_vals[g] : 0;
  // All 16-byte groups in flight at once (cp.async needs no registers); seg_keys is
  // 256-byte aligned in the workspace.
  const int full4 = n_rows / 4;
  for (int i = threadIdx.x; i < full4; i += kRankThreads)
    cp_async16(skeys + 4 * i, seg_keys + 4 * i);
  for (int e = 4 * full4 + threadIdx.x; e < segs * kSeg; e += kRankThreads) {
    skeys[e] = e < n_rows ? seg_keys[e] : 0xFFFFFFFFu;
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  if (g >= n_rows) return;
  const int s = g >> kSegLog2;
  const uint32_t k = skeys[g];
  int rank = g & (kSeg - 1);
  // The threads of a warp hold consecutive sorted keys of one segment, so their searches in
  // a segment follow nearly the same path: mostly broadcasts, few bank conflicts.
  for (int t0 = 0; t0 < segs; t0 += kRankGroup) {
    const uint32_t* base[kRankGroup];
    uint32_t bound[kRankGroup];
    int cnt[kRankGroup];
#pragma unroll
    for (int u = 0; u < kRankGroup; ++u) {
      const int t = t0 + u;
      base[u] = skeys + (min(t, segs - 1) << kSegLog2);  // past segs: searched, not counted
      bound[u] = t < s ? k + 1 : k;  // #(keys < k + 1) = #(keys ≤ k); k ≤ V < 2³¹
      cnt[u] = 0;
    }
    // Branchless lower bound: cnt = #(keys < bound) in [0, kSeg].
#pragma unroll
    for (int step = kSeg / 2; step >= 1; step /= 2) {
#pragma unroll
      for (int u = 0; u < kRankGroup; ++u)
        cnt[u] += base[u][cnt[u] + step - 1] < bound[u] ? step : 0;
    }
#pragma unroll
    for (int u = 0; u < kRankGroup; ++u) {
      cnt[u] += base[u][cnt[u]] < bound[u] ? 1 : 0;
      const int t = t0 + u;
      if (t < segs && t != s) rank += cnt[u];
    }
  }
  keys_out[rank] = k;
  vals_out[rank] = pos;
}

constexpr int kChunk = int(kEmbeddingBwdChunk);

// Step 2. Blocks (b, ·) sum sorted entries [b·C, b·C + C) of dout [N, D] by runs of equal keys
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

// Step 3. Warp w of block (x, y) takes the boundary after chunk b = x·kCarryWarps + w: if the run
// of chunk b's last key starts in chunk b and continues, total = slots[b][1] + slots[b+1][0] +
// … (in chunk order) and dtable row += total, for the columns of column tile y. Most boundaries
// carry nothing and their warps leave after one round of key loads.
constexpr int kCarryWarps = 8;
// Column groups per lane (kE columns each), their loads issued together.
constexpr int kCarryUnroll = 4;

template <bool kVec>
__global__ void __launch_bounds__(kCarryWarps* kWarp)
    embedding_bwd_carry_kernel(float* __restrict__ dtable, const float* __restrict__ slots,
                               const uint32_t* __restrict__ keys, int64_t n_rows, int64_t d,
                               int64_t vocab) {
  pdl::grid_sync();
  const int lane = threadIdx.x % kWarp;
  const int64_t b = int64_t(blockIdx.x) * kCarryWarps + threadIdx.x / kWarp;
  const int64_t start = b * kChunk, end = start + kChunk;
  if (end >= n_rows) return;  // no boundary after the last chunk
  const uint32_t key = keys[end - 1], next = keys[end], first = keys[start];
  // 0xFFFFFFFF: no entry before chunk 0 (never equal to a key < V < 2³¹).
  const uint32_t before = start > 0 ? keys[start - 1] : 0xFFFFFFFFu;
  if (key >= vocab || next != key) return;
  if (first == key && before == key) return;  // the run started in an earlier chunk
  // b_last: the first chunk c > b past whose end the run does not continue; lanes test 32
  // chunks per round (the run is contiguous, so the answer is the first failing lane).
  int64_t b_last = b + 1;
  for (;;) {
    const int64_t c = b_last + lane;
    const bool cont = (c + 1) * kChunk < n_rows && keys[(c + 1) * kChunk] == key;
    const unsigned stop = __ballot_sync(0xFFFFFFFFu, !cont);
    if (stop != 0) {
      b_last += __ffs(stop) - 1;
      break;
    }
    b_last += kWarp;
  }
  constexpr int kE = kVec ? 4 : 1;  // kVec: d % 4 == 0, float4 columns
  constexpr int kTile = kCarryUnroll * kWarp * kE;
  float* row = dtable + int64_t(key) * d;
  for (int64_t c0 = int64_t(blockIdx.y) * kTile + lane * kE; c0 < d;
       c0 += int64_t(gridDim.y) * kTile) {
    float cur[kCarryUnroll][kE], tot[kCarryUnroll][kE];
    auto load = [&](float(&v)[kE], const float* p) {
      if constexpr (kVec) {
        const float4 q = *reinterpret_cast<const float4*>(p);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
      } else {
        v[0] = *p;
      }
    };
    // The dtable row (likely not cached: no piece of this run went to it) is loaded first, so
    // that its latency overlaps the slots'. Only this warp touches these columns of the row.
#pragma unroll
    for (int u = 0; u < kCarryUnroll; ++u) {
      const int64_t c = c0 + u * kWarp * kE;
      if (c < d) {
        load(cur[u], row + c);
        load(tot[u], slots + (2 * b + 1) * d + c);
      }
    }
#pragma unroll 4
    for (int64_t bb = b + 1; bb <= b_last; ++bb) {
#pragma unroll
      for (int u = 0; u < kCarryUnroll; ++u) {
        const int64_t c = c0 + u * kWarp * kE;
        if (c >= d) continue;
        float v[kE];
        load(v, slots + (2 * bb) * d + c);
#pragma unroll
        for (int k = 0; k < kE; ++k) tot[u][k] += v[k];
      }
    }
#pragma unroll
    for (int u = 0; u < kCarryUnroll; ++u) {
      const int64_t c = c0 + u * kWarp * kE;
      if (c >= d) continue;
      float v[kE];
#pragma unroll
      for (int k = 0; k < kE; ++k) v[k] = cur[u][k] + tot[u][k];
      if constexpr (kVec) {
        *reinterpret_cast<float4*>(row + c) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
        row[c] = v[0];
      }
    }
  }
}

int grid_for(int64_t items) {
  return int(std::min<int64_t>(ceil_div(items, kThreads), int64_t(1) << 20));
}

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

// Whether the merge-rank sort takes these tokens: up to kEmbeddingBwdMergeRankMaxRows whose keys
// fit one block's shared memory (4 bytes per token, rounded up to whole segments: 227 KiB on
// sm_90, 99 KiB on sm_120); kMergeRank past that is an error.
bool use_merge_rank(Context& ctx, int64_t n_rows, EmbeddingSort sort) {
  const size_t rank_bytes = size_t(ceil_div(n_rows, kSeg)) * kSeg * sizeof(uint32_t);
  const bool rank_fits = dynamic_smem_fits(ctx.device().index, rank_bytes, 0);
  const bool merge_rank =
      sort == EmbeddingSort::kMergeRank ||
      (sort == EmbeddingSort::kAuto && n_rows <= kEmbeddingBwdMergeRankMaxRows && rank_fits);
  LOWBIT_CHECK(!merge_rank || (n_rows <= kEmbeddingBwdMergeRankMaxRows && rank_fits),
               "embedding: the merge-rank sort takes at most {} tokens whose keys fit the "
               "GPU's shared memory per block; {} tokens need {} bytes (use EmbeddingSort::kAuto)",
               kEmbeddingBwdMergeRankMaxRows, n_rows, rank_bytes);
  return merge_rank;
}

// Keys 0..V (V marks an invalid token): the sort takes only the bits needed.
int key_bits(int64_t vocab) {
  int end_bit = 1;
  while ((uint64_t(1) << end_bit) <= uint64_t(vocab)) ++end_bit;
  return end_bit;
}

// Scratch of sort_tokens: keys_in / vals_in [N] each (the merge-rank sort's per-segment sorted
// pairs, or the radix sort's input), then the radix sort's own temporary storage.
size_t sort_scratch_bytes(bool merge_rank, int64_t n_rows, int64_t vocab) {
  const size_t arr = align256(size_t(n_rows) * 4);
  if (merge_rank) return 2 * arr;
  size_t cub_bytes = 0;
  LOWBIT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), int(n_rows), 0,
      key_bits(vocab), cudaStream_t(nullptr)));
  return 2 * arr + align256(cub_bytes);
}

// Step 1 on stream s: keys_out [N] (token keys, V for an out-of-range token) stably sorted,
// vals_out [N] their positions, using `scratch` (scratch_bytes = sort_scratch_bytes). With the
// merge-rank sort, `prefetch_bytes` > 0 of `prefetch` are asked of the L2 by blocks beside its
// first kernel.
void sort_tokens(Context& ctx, cudaStream_t s, bool merge_rank, uint8_t* scratch,
                 size_t scratch_bytes, uint32_t* keys_out, int32_t* vals_out,
                 const TensorView& tokens, int64_t vocab, const void* prefetch = nullptr,
                 int64_t prefetch_bytes = 0) {
  const int64_t n_rows = tokens.size(0);
  const int end_bit = key_bits(vocab);
  const int n = int(n_rows);
  const size_t arr = align256(size_t(n) * 4);
  uint32_t* keys_in = reinterpret_cast<uint32_t*>(scratch);      // [N]
  int32_t* vals_in = reinterpret_cast<int32_t*>(scratch + arr);  // [N]
  if (merge_rank) {
    const int segs = int(ceil_div(n_rows, kSeg));
    const int pf_blocks = prefetch_bytes > 0 ? std::max(sm_count(ctx.device().index) - segs, 0) : 0;
    pdl::launch(embedding_segment_sort_kernel, segs + pf_blocks, kSegThreads, 0, s, keys_in,
                vals_in, tokens.ptr<const int32_t>(), n, vocab, end_bit, prefetch, prefetch_bytes);
    LOWBIT_CUDA_CHECK_LAUNCH();
    const size_t smem = size_t(segs) * kSeg * sizeof(uint32_t);  // [segs, kSeg] keys
    allow_dynamic_smem(embedding_merge_rank_kernel, smem);
    pdl::launch(embedding_merge_rank_kernel, int(ceil_div(n_rows, kRankThreads)), kRankThreads,
                smem, s, keys_out, vals_out, keys_in, vals_in, n);
    LOWBIT_CUDA_CHECK_LAUNCH();
    return;
  }
  size_t cub_bytes = scratch_bytes - 2 * arr;
  pdl::launch(embedding_keys_kernel, int(ceil_div(n_rows, kThreads)), kThreads, 0, s, keys_in,
              vals_in, tokens.ptr<const int32_t>(), n_rows, vocab);
  LOWBIT_CUDA_CHECK_LAUNCH();
  LOWBIT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch + 2 * arr, cub_bytes, keys_in, keys_out,
                                                    vals_in, vals_out, n, 0, end_bit, s));
}

void check_token_range(int64_t n_rows, int64_t vocab) {
  LOWBIT_USER_CHECK(n_rows < (int64_t(1) << 31) && vocab < (int64_t(1) << 31),
                    "embedding: {} tokens and a vocabulary of {} exceed the GPU kernel's 32-bit "
                    "indices",
                    n_rows, vocab);
}

// The plan's rows: [0] the sorted keys, [1] their positions ([2, N] i32).
uint32_t* plan_keys(const TensorView& plan) {
  return reinterpret_cast<uint32_t*>(plan.ptr<int32_t>());
}
int32_t* plan_vals(const TensorView& plan) { return plan.ptr<int32_t>() + plan.size(1); }

}  // namespace

void embedding_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& tokens,
                        const TensorView& table, const TensorView& sort_plan, EmbeddingSort sort) {
  const int64_t n_rows = out.size(0), d = out.size(1), vocab = table.size(0);
  uint16_t* o = out.ptr<uint16_t>();
  const uint16_t* t = table.ptr<const uint16_t>();
  const bool vec = d % 8 == 0 && aligned16(o) && aligned16(t);
  cudaStream_t s = ctx.stream();
  std::optional<Context::SideFork> side;
  if (sort_plan.data != nullptr) {
    // The sort (latency-bound, a few SMs) on the side stream beside the gather.
    check_token_range(n_rows, vocab);
    const bool merge_rank = use_merge_rank(ctx, n_rows, sort);
    const size_t scratch_bytes = sort_scratch_bytes(merge_rank, n_rows, vocab);
    uint8_t* scratch = static_cast<uint8_t*>(ctx.workspace(scratch_bytes));
    side.emplace(ctx);
    sort_tokens(ctx, side->stream(), merge_rank, scratch, scratch_bytes, plan_keys(sort_plan),
                plan_vals(sort_plan), tokens, vocab);
  }
  if (vec) {
    pdl::launch(embedding_fwd_kernel<true>, grid_for(n_rows * d / 8), kThreads, 0, s, o,
                tokens.ptr<const int32_t>(), t, n_rows, d, vocab);
  } else {
    pdl::launch(embedding_fwd_kernel<false>, grid_for(n_rows * d), kThreads, 0, s, o,
                tokens.ptr<const int32_t>(), t, n_rows, d, vocab);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
  if (side) side->join();
}

void embedding_bwd_cuda(Context& ctx, const TensorView& dtable, const TensorView& tokens,
                        const TensorView& dout, EmbeddingSort sort, const TensorView& sort_plan) {
  const int64_t n_rows = dout.size(0), d = dout.size(1), vocab = dtable.size(0);
  cudaStream_t s = ctx.stream();
  const int64_t chunks = ceil_div(n_rows, kChunk);
  const size_t arr = align256(size_t(n_rows) * 4);
  const size_t slot_bytes = align256(size_t(chunks) * 2 * size_t(d) * sizeof(float));
  check_token_range(n_rows, vocab);
  const uint32_t* keys_out = nullptr;  // [N] sorted keys
  const int32_t* vals_out = nullptr;   // [N] their positions
  float* slots = nullptr;              // [chunks, 2, D]
  if (sort_plan.data != nullptr) {
    slots = static_cast<float*>(ctx.workspace(slot_bytes));
    keys_out = plan_keys(sort_plan);
    vals_out = plan_vals(sort_plan);
  } else {
    // Workspace: slots, the sorted pairs, the sort's scratch.
    const bool merge_rank = use_merge_rank(ctx, n_rows, sort);
    const size_t scratch_bytes = sort_scratch_bytes(merge_rank, n_rows, vocab);
    uint8_t* ws = static_cast<uint8_t*>(ctx.workspace(slot_bytes + 2 * arr + scratch_bytes));
    slots = reinterpret_cast<float*>(ws);
    uint32_t* keys = reinterpret_cast<uint32_t*>(ws + slot_bytes);
    int32_t* vals = reinterpret_cast<int32_t*>(ws + slot_bytes + arr);
    // dout prefetched only where it takes at most half the L2 (the 124m preset's 25 MB of a
    // 50 MB L2): a larger one is evicted by the chunk kernel's dtable rows before it is read
    // (at 1b, 67 MB, the prefetch measured 3 % slower).
    const int64_t dout_bytes = n_rows * d * 2;
    const bool prefetch =
        aligned16(dout.data) &&
        2 * dout_bytes <= cached_device_attr(ctx.device().index, cudaDevAttrL2CacheSize);
    sort_tokens(ctx, s, merge_rank, ws + slot_bytes + 2 * arr, scratch_bytes, keys, vals, tokens,
                vocab, dout.data, prefetch ? dout_bytes : 0);
    keys_out = keys;
    vals_out = vals;
  }
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
  // Carry: float4 columns where rows allow (slots rows are 16-byte aligned when d % 4 == 0).
  const bool carry_vec = d % 4 == 0 && aligned16(dt);
  const int64_t carry_tile = int64_t(kCarryUnroll) * kWarp * (carry_vec ? 4 : 1);
  const dim3 carry_grid(static_cast<unsigned>(ceil_div(chunks, kCarryWarps)),
                        static_cast<unsigned>(std::min<int64_t>(ceil_div(d, carry_tile), 65535)));
  const int carry_threads = kCarryWarps * kWarp;
  if (carry_vec) {
    pdl::launch(embedding_bwd_carry_kernel<true>, carry_grid, carry_threads, 0, s, dt, slots,
                keys_out, n_rows, d, vocab);
  } else {
    pdl::launch(embedding_bwd_carry_kernel<false>, carry_grid, carry_threads, 0, s, dt, slots,
                keys_out, n_rows, d, vocab);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::ops_detail
