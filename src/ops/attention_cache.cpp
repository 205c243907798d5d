// kv_cache_write / attention_cache_fwd (include/lowbit/ops.h): argument checks, then the CPU twin
// (attention_cache_ref.cpp) or the CUDA kernels (attention_cache.cu) by the context's device.
#include <cmath>
#include <cstdint>

#include "lowbit/ops.h"
#include "ops/attention_cache_impl.h"
#include "ops/attention_impl.h"
#include "ops/ops_check.h"

namespace lowbit {

namespace {

// A [B, T, heads, Dh] view: 4-D, bf16 (or f32 on the CPU), on ctx's device, last dim contiguous,
// non-negative strides and, on the GPU, 16-byte aligned rows (the kernels move 16-byte pieces).
void check_heads(const Context& ctx, const char* op, const char* name, const TensorView& t) {
  LOWBIT_USER_CHECK(t.ndim() == 4, "{}: {} must be 4-D [B, T, heads, Dh], got {}", op, name,
                    t.str());
  LOWBIT_USER_CHECK(t.data != nullptr || t.numel() == 0, "{}: {} is an empty view", op, name);
  LOWBIT_USER_CHECK(t.device == ctx.device(),
                    "{}: {} is on {}, but the context runs on {}; move it to {}", op, name,
                    t.device.str(), ctx.device().str(), ctx.device().str());
  if (ctx.on_gpu()) {
    LOWBIT_USER_CHECK(t.dtype == DType::kBF16,
                      "{}: {} is {}; the GPU path takes bf16 tensors (convert it)", op, name,
                      dtype_name(t.dtype));
  } else {
    LOWBIT_USER_CHECK(t.dtype == DType::kBF16 || t.dtype == DType::kF32,
                      "{}: {} is {}; it takes bf16 tensors (or f32 on the CPU)", op, name,
                      dtype_name(t.dtype));
  }
  ops_detail::check_heads_layout(ctx, op, name, t);
}

// t0 + Tq must fit the cache: positions past Tmax have no row.
void check_fits(const char* op, const TensorView& cache, const char* name, int64_t t0, int64_t tq) {
  LOWBIT_USER_CHECK(t0 >= 0, "{}: t0 = {} must be ≥ 0", op, t0);
  LOWBIT_USER_CHECK(t0 + tq <= cache.size(1),
                    "{}: positions [{}, {}) do not fit {} {}, which holds {} positions; allocate a "
                    "longer cache or restart from a shorter window",
                    op, t0, t0 + tq, name, cache.shape.str(), cache.size(1));
}

}  // namespace

void kv_cache_write(Context& ctx, const TensorView& cache, const TensorView& src, int64_t t0) {
  const char* op = "kv_cache_write";
  check_heads(ctx, op, "cache", cache);
  check_heads(ctx, op, "src", src);
  LOWBIT_USER_CHECK(cache.dtype == src.dtype, "{}: cache is {} but src is {}; they must match", op,
                    dtype_name(cache.dtype), dtype_name(src.dtype));
  LOWBIT_USER_CHECK(
      src.size(0) == cache.size(0) && src.size(2) == cache.size(2) && src.size(3) == cache.size(3),
      "{}: src {} must be [B, Tq, Hkv, Dh] with B, Hkv and Dh of cache {}", op, src.shape.str(),
      cache.shape.str());
  check_fits(op, cache, "cache", t0, src.size(1));
  if (src.numel() == 0) return;
  if (ctx.on_gpu()) {
    attn::kv_cache_write_cuda(ctx, cache, src, t0);
  } else {
    attn::kv_cache_write_ref(cache, src, t0);
  }
}

void attention_cache_fwd(Context& ctx, const TensorView& out, const TensorView& q,
                         const TensorView& k_cache, const TensorView& v_cache, int64_t t0,
                         float scale) {
  const char* op = "attention_cache_fwd";
  check_heads(ctx, op, "q", q);
  check_heads(ctx, op, "k_cache", k_cache);
  check_heads(ctx, op, "v_cache", v_cache);
  check_heads(ctx, op, "out", out);
  const int64_t B = q.size(0), Tq = q.size(1), H = q.size(2), Dh = q.size(3);
  const int64_t Hkv = k_cache.size(2);
  LOWBIT_USER_CHECK(k_cache.shape == v_cache.shape,
                    "{}: k_cache {} and v_cache {} must have the same shape [B, Tmax, Hkv, Dh]", op,
                    k_cache.shape.str(), v_cache.shape.str());
  LOWBIT_USER_CHECK(k_cache.size(0) == B && k_cache.size(3) == Dh,
                    "{}: the caches {} must be [B, Tmax, Hkv, Dh] with B = {} and Dh = {} of q {}",
                    op, k_cache.shape.str(), B, Dh, q.shape.str());
  LOWBIT_USER_CHECK(H > 0 && Hkv > 0 && H % Hkv == 0,
                    "{}: the query heads H = {} must be a positive multiple of the kv heads Hkv = "
                    "{} (q {}, k_cache {})",
                    op, H, Hkv, q.shape.str(), k_cache.shape.str());
  ops_detail::check_same_shape(op, "out", out, "q", q);
  if (ctx.on_gpu()) {
    LOWBIT_USER_CHECK(Dh == 64 || Dh == 128,
                      "{}: head dim Dh = {} is not supported on the GPU; it takes Dh = 64 or 128",
                      op, Dh);
  } else {
    LOWBIT_USER_CHECK(Dh >= 1 && Dh <= 256, "{}: head dim Dh = {} must be in [1, 256]", op, Dh);
  }
  LOWBIT_USER_CHECK(std::isfinite(scale) && scale > 0.0f,
                    "{}: scale must be finite and positive (typically 1/sqrt(Dh)), got {}", op,
                    scale);
  check_fits(op, k_cache, "k_cache", t0, Tq);
  if (B * Tq * H == 0) return;
  if (!ctx.on_gpu()) {
    attn::attention_cache_fwd_ref(out, q, k_cache, v_cache, t0, scale);
    return;
  }
  if (t0 == 0 && Tq >= attn::kFlashMinQueries) {
    // A prefill is causal attention over Tq = T positions: the flash kernel, reading keys and
    // values from the cache rows [0, Tq). Its lse is not needed; it goes to the workspace.
    auto rows = [Tq](const TensorView& c) {
      return TensorView(c.data, c.dtype, Shape{c.size(0), Tq, c.size(2), c.size(3)}, c.strides,
                        c.device);
    };
    const int64_t lse_elems = B * H * Tq;
    void* lse_p = ctx.workspace(static_cast<size_t>(lse_elems) * sizeof(float));
    const TensorView lse(lse_p, DType::kF32, Shape{B, H, Tq}, ctx.device());
    attn::attention_fwd_cuda(ctx, out, lse, q, rows(k_cache), rows(v_cache), scale);
    return;
  }
  attn::attention_cache_fwd_cuda(ctx, out, q, k_cache, v_cache, t0, scale);
}

}  // namespace lowbit
