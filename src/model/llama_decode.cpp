// Incremental decoding of the LLaMA decoder with a KV cache (include/lowbit/model.h: KvCache,
// LlamaModel::decode). Built only on the model's public surface (config, parameter arena) and
// the public ops, so it does not depend on the training forward's internals.
//
// One call runs Tq new tokens at positions [t0, t0 + Tq), t0 = cache.length(); block l
// (x [N, D] bf16, N = B·Tq):
//   ln1 = rmsnorm(x)
//   qkv = ln1 · Wqkvᵀ                      [N, (H + 2·Hkv)·Dh]; q, k rotated at positions t0 + i
//   cache_k[l], cache_v[l] rows [t0, t0 + Tq) = k, v
//   att = attention_cache(q, cache rows [0, t0 + Tq))   [N, H·Dh]
//   x'  = x + att · Woᵀ
//   out = x' + swiglu(rmsnorm(x') · Wguᵀ) · Wdownᵀ
// then the final norm and the head on the last position of each sequence. The operations per
// row are those of LlamaModel's BF16 forward, so decoding a window token by token reproduces
// last_logits over it up to the summation order of GEMMs run with other row counts (and, on the
// GPU, the flash kernel's bf16 rounding of P in the full forward).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>

#include "lowbit/core/nvtx.h"
#include "lowbit/gemm.h"
#include "lowbit/model.h"
#include "model/model_views.h"

namespace lowbit {

using model_detail::act;
using model_detail::heads_view;
using model_detail::rows;

namespace {

// Parameter indices of one block, in the arena's order (see ParamArena): input norm, q, k, v,
// o, post-attention norm, gate, up, down.
constexpr const char* kBlockParams[] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
constexpr int kParamsPerBlock = 9;

// Index of block l's first parameter; the following eight are checked by name.
int block_base(const ParamArena& a, int l) {
  const std::string prefix = fmt::format("model.layers.{}.", l);
  const int base = a.find(prefix + kBlockParams[0]);
  LOWBIT_CHECK(base >= 0, "parameter {}{} is missing", prefix, kBlockParams[0]);
  for (int k = 1; k < kParamsPerBlock; ++k) {
    const std::string& name = a.params().at(base + k).name;
    LOWBIT_CHECK(name == prefix + kBlockParams[k], "parameter {} follows {}{}; expected {}{}", name,
                 prefix, kBlockParams[0], prefix, kBlockParams[k]);
  }
  return base;
}

}  // namespace

KvCache::KvCache(Context& ctx, const ModelConfig& cfg, int batch, int capacity) {
  cfg.validate();
  if (capacity == 0) capacity = cfg.max_seq_len;
  LOWBIT_USER_CHECK(batch > 0, "KV cache: batch must be positive, got {}", batch);
  LOWBIT_USER_CHECK(capacity > 0 && capacity <= cfg.max_seq_len,
                    "KV cache: capacity {} must be in [1, max_seq_len = {}] (RoPE positions past "
                    "max_seq_len were never trained)",
                    capacity, cfg.max_seq_len);
  n_layers_ = cfg.n_layers;
  n_kv_heads_ = cfg.n_kv_heads;
  head_dim_ = cfg.head_dim();
  batch_ = batch;
  capacity_ = capacity;
  const Shape shape{n_layers_, batch_, capacity_, n_kv_heads_, head_dim_};
  // Zeroed so that the rows not yet written hold finite values (no kernel reads them).
  k_all_ = Tensor::zeros(shape, DType::kBF16, ctx.device(), MemCategory::kActivations);
  v_all_ = Tensor::zeros(shape, DType::kBF16, ctx.device(), MemCategory::kActivations);
  // Rows are positions: row t equals row t of the training forward's table (same f64 formula).
  rope_ =
      Tensor::empty({capacity_, head_dim_ / 2, 2}, DType::kF32, ctx.device(), MemCategory::kOther);
  rope_table(ctx, rope_, cfg.rope);
}

TensorView KvCache::k(int layer) const {
  LOWBIT_CHECK(layer >= 0 && layer < n_layers_, "KV cache layer {} of {}", layer, n_layers_);
  const int64_t per_layer = int64_t(batch_) * capacity_ * n_kv_heads_ * head_dim_;
  return TensorView(k_all_.ptr<uint16_t>() + layer * per_layer, DType::kBF16,
                    Shape{batch_, capacity_, n_kv_heads_, head_dim_}, k_all_.device());
}

TensorView KvCache::v(int layer) const {
  LOWBIT_CHECK(layer >= 0 && layer < n_layers_, "KV cache layer {} of {}", layer, n_layers_);
  const int64_t per_layer = int64_t(batch_) * capacity_ * n_kv_heads_ * head_dim_;
  return TensorView(v_all_.ptr<uint16_t>() + layer * per_layer, DType::kBF16,
                    Shape{batch_, capacity_, n_kv_heads_, head_dim_}, v_all_.device());
}

std::vector<float> LlamaModel::decode(const TensorView& tokens, int batch, int tq, KvCache& cache) {
  const NvtxRange range("decode");
  const ModelConfig& cfg = cfg_;
  const ParamArena& a = *arena_;
  const Device dev = ctx_.device();
  LOWBIT_USER_CHECK(batch > 0 && tq > 0,
                    "decode: batch and token count must be positive (got {}×{})", batch, tq);
  LOWBIT_USER_CHECK(cache.batch() == batch,
                    "decode: the KV cache holds {} sequences but the batch has {}; build the cache "
                    "for this batch size",
                    cache.batch(), batch);
  LOWBIT_USER_CHECK(cache.n_layers_ == cfg.n_layers && cache.n_kv_heads_ == cfg.n_kv_heads &&
                        cache.head_dim_ == cfg.head_dim() && cache.k_all_.device() == dev,
                    "decode: the KV cache was built for another model or device ({} layers, {} kv "
                    "heads of {} on {}; the model has {}, {} of {} on {})",
                    cache.n_layers_, cache.n_kv_heads_, cache.head_dim_,
                    cache.k_all_.device().str(), cfg.n_layers, cfg.n_kv_heads, cfg.head_dim(),
                    dev.str());
  const int t0 = cache.length();
  LOWBIT_USER_CHECK(t0 + tq <= cache.capacity(),
                    "decode: {} more positions do not fit the KV cache ({} of {} used); reset() it "
                    "and prefill the last window again (or build a longer cache, up to "
                    "max_seq_len = {})",
                    tq, t0, cache.capacity(), cfg.max_seq_len);
  LOWBIT_USER_CHECK(tokens.dtype == DType::kI32 && tokens.numel() == int64_t(batch) * tq &&
                        tokens.is_contiguous(),
                    "decode: expected {}×{} contiguous int32 token ids, got {}", batch, tq,
                    tokens.str());

  const int B = batch, T = tq;
  const int64_t N = int64_t(B) * T, D = cfg.d_model, F = cfg.ffn_hidden, V = cfg.vocab_size;
  const int H = cfg.n_heads, Hkv = cfg.n_kv_heads, Dh = cfg.head_dim();
  const int64_t Wqkv = int64_t(H + 2 * Hkv) * Dh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  // RoPE rows of positions [t0, t0 + T): [T, Dh/2, 2] f32.
  const TensorView rope_rows(cache.rope_.ptr<float>() + int64_t(t0) * Dh, DType::kF32,
                             Shape{T, Dh / 2, 2}, dev);

  Tensor tok = Tensor::copy_of(tokens, dev, MemCategory::kActivations);
  Tensor x = act({N, D}, DType::kBF16, dev);  // the residual stream
  embedding_fwd(ctx_, x, tok.view().reshape({N}), a.compute(a.find("model.embed_tokens.weight")));
  Tensor rstd = act({N}, DType::kF32, dev);
  Tensor ln = act({N, D}, DType::kBF16, dev);
  Tensor qkv = act({N, Wqkv}, DType::kBF16, dev);
  Tensor att = act({N, int64_t(H) * Dh}, DType::kBF16, dev);
  Tensor x_mid = act({N, D}, DType::kBF16, dev);
  Tensor gu = act({N, 2 * F}, DType::kBF16, dev);
  Tensor h = act({N, F}, DType::kBF16, dev);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const NvtxRange block_range(fmt::format("block {} decode", l));
    const int p = block_base(a, l);
    rmsnorm_fwd(ctx_, ln, rstd, x, a.compute(p + 0), cfg.norm_eps);
    gemm(ctx_, GemmOperand::of(ln), GemmOperand::of(bf16_weight(l * kLinearsPerBlock + 0)), qkv,
         {});
    const TensorView q = heads_view(qkv, B, T, 0, H, Dh);
    const TensorView k = heads_view(qkv, B, T, int64_t(H) * Dh, Hkv, Dh);
    const TensorView v = heads_view(qkv, B, T, int64_t(H + Hkv) * Dh, Hkv, Dh);
    rope_fwd(ctx_, q, q, rope_rows);
    rope_fwd(ctx_, k, k, rope_rows);
    kv_cache_write(ctx_, cache.k(l), k, t0);
    kv_cache_write(ctx_, cache.v(l), v, t0);
    attention_cache_fwd(ctx_, att.view().reshape({B, T, H, Dh}), q, cache.k(l), cache.v(l), t0,
                        scale);
    // The residual adds run in the GEMMs' epilogues (one rounding), as in the forward.
    GemmOptions residual;
    residual.beta = 1.0f;
    const TensorView xv = x.view(), x_mid_v = x_mid.view();
    residual.c = &xv;
    gemm(ctx_, GemmOperand::of(att), GemmOperand::of(bf16_weight(l * kLinearsPerBlock + 1)), x_mid,
         residual);
    rmsnorm_fwd(ctx_, ln, rstd, x_mid, a.compute(p + 5), cfg.norm_eps);
    gemm(ctx_, GemmOperand::of(ln), GemmOperand::of(bf16_weight(l * kLinearsPerBlock + 2)), gu, {});
    swiglu_fwd(ctx_, h, gu);
    // x is the block's output, the next block's input.
    residual.c = &x_mid_v;
    gemm(ctx_, GemmOperand::of(h), GemmOperand::of(bf16_weight(l * kLinearsPerBlock + 3)), x,
         residual);
  }
  cache.length_ = t0 + T;

  // The last position of each sequence: [B, D] (x itself when T = 1).
  Tensor last = x;
  if (T > 1) {
    last = act({B, D}, DType::kBF16, dev);
    for (int b = 0; b < B; ++b) copy_tensor(rows(last, b, 1), rows(x, int64_t(b) * T + T - 1, 1));
  }
  Tensor rstd_f = act({B}, DType::kF32, dev);
  Tensor lnf = act({B, D}, DType::kBF16, dev);
  rmsnorm_fwd(ctx_, lnf, rstd_f, last, a.compute(a.find("model.norm.weight")), cfg.norm_eps);
  const int p_head =
      cfg.tie_embeddings ? a.find("model.embed_tokens.weight") : a.find("lm_head.weight");
  Tensor logits = act({B, V}, DType::kF32, dev);
  gemm(ctx_, GemmOperand::of(lnf), GemmOperand::of(a.compute(p_head)), logits, {});
  Tensor host = Tensor::copy_of(logits, Device::cpu());
  return std::vector<float>(host.ptr<float>(), host.ptr<float>() + int64_t(B) * V);
}

}  // namespace lowbit
