// Private to the ops layer: the two implementations behind cross_entropy_fwd_bwd
// (include/lowbit/ops.h). Arguments have been validated by the dispatcher (cross_entropy.cpp).
//
// Per row x [V] with target t (not ignore_index), m = max_j x_j (NaN ignored):
//   s    = Σ_j e_j,  e_j = exp(x_j − m)  (e_j = 0 for x_j = −inf, also when m = −inf)
//   loss = (m − x_t) + log s            (= logsumexp(x) − x_t, without cancelling large terms)
//   dx_j = grad_scale · (e_j / s − [j = t])
// Ignored rows: loss 0 and a zero gradient row. Specials follow from IEEE arithmetic on these
// formulas: a NaN or +inf logit makes the row's loss and gradient NaN; a row of −inf only too; a
// target logit of −inf (others finite) gives loss +inf.
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/core.h"

namespace lowbit::ops_detail {

// CPU twin (cross_entropy_ref.cpp): logits and dlogits bf16 or f32 (each independently);
// s, the loss and the gradient in fp64, rounded once to the output's dtype (the gradient through
// fp32). Throws UserError for a target outside [0, V) that is not ignore_index, before writing
// anything. dlogits may alias logits.
void cross_entropy_cpu(const TensorView& losses, const TensorView* dlogits,
                       const TensorView& logits, const TensorView& targets, int ignore_index,
                       float grad_scale);

// CUDA (cross_entropy.cu), bf16, on ctx.stream(): one block (or one cluster of blocks) per row,
// the row read once with an online max/sum in fp32 (kept in shared memory as far as it fits),
// then the gradient written in a second pass. A bad target gives a NaN loss and a NaN gradient
// row.
struct CeConfig {
  int threads = 512;                // per block
  int min_blocks = 2;               // __launch_bounds__ minimum blocks per SM (caps the registers)
  int unroll = 4;                   // 16-byte loads in flight per thread
  int max_cache_bytes = 100 << 10;  // shared memory per block caching the row for pass 2
  // > 1: a row per cluster of `cluster` (≤ 8) blocks, each holding its 1/cluster of the row in
  // shared memory (max_cache_bytes unused), when cross_entropy_runs_on_clusters says so;
  // otherwise the one-block kernel with the same threads, blocks per SM and unroll.
  int cluster = 0;
};
// What cross_entropy_fwd_bwd uses for a vocabulary of V.
CeConfig cross_entropy_default_config(int64_t V);
// The fastest cluster configuration measured for a vocabulary of V (the row in slices of at
// most 64 KiB; 4 blocks per row at V 128256), for tests and benchmarks.
CeConfig cross_entropy_cluster_config(int64_t V);
// Every compiled combination, for the benchmark sweep (the defaults are among them).
std::vector<CeConfig> cross_entropy_candidates();
// Whether cross_entropy_cuda runs config c on the cluster kernel for these operands: c.cluster >
// 1, dlogits given with the 16-byte alignment of logits, slices within 200 KiB of shared memory.
// A cluster config that names no compiled cluster kernel is an error.
bool cross_entropy_runs_on_clusters(const CeConfig& c, const TensorView& logits,
                                    const TensorView* dlogits);
// `config` overrides the default (must be one of the candidates).
void cross_entropy_cuda(Context& ctx, const TensorView& losses, const TensorView* dlogits,
                        const TensorView& logits, const TensorView& targets, int ignore_index,
                        float grad_scale, const CeConfig* config = nullptr);

}  // namespace lowbit::ops_detail
