// Private interface of attention against a KV cache (include/lowbit/ops.h: kv_cache_write,
// attention_cache_fwd): the CPU twin (attention_cache_ref.cpp) and the CUDA launchers
// (attention_cache.cu). attention_cache.cpp validates every argument and then calls one of them,
// so these functions trust their inputs.
#pragma once

#include <cstdint>

#include "lowbit/core.h"

namespace lowbit::attn {

// ---- CPU twin -----------------------------------------------------------------------------
// cache [B, Tmax, Hkv, Dh] rows [t0, t0 + Tq) = src [B, Tq, Hkv, Dh] (same dtype, strided).
void kv_cache_write_ref(const TensorView& cache, const TensorView& src, int64_t t0);
// out [B, Tq, H, Dh] from q [B, Tq, H, Dh] and the caches [B, Tmax, Hkv, Dh]; bf16 or f32,
// strided, last dim contiguous. Plain fp32 loops, the same operations in the same order as
// attention_fwd_ref for a query at position t0 + i.
void attention_cache_fwd_ref(const TensorView& out, const TensorView& q, const TensorView& k_cache,
                             const TensorView& v_cache, int64_t t0, float scale);

// ---- CUDA ---------------------------------------------------------------------------------
// bf16 on ctx's GPU, rows 16-byte aligned (checked by the caller).
void kv_cache_write_cuda(Context& ctx, const TensorView& cache, const TensorView& src, int64_t t0);
// The cache kernel itself (one block per query and head, any t0 and Tq), Dh 64 or 128. The
// dispatcher sends prefills (t0 = 0, Tq ≥ kFlashMinQueries) to attention_fwd_cuda instead.
void attention_cache_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& q,
                              const TensorView& k_cache, const TensorView& v_cache, int64_t t0,
                              float scale);
inline constexpr int64_t kFlashMinQueries = 16;

}  // namespace lowbit::attn
