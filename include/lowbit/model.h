// lowbit model layer: LLaMA-family configuration, the parameter arena, the precision plan and
// the explicit forward / backward call sequence of the decoder.
//
// Shapes: B batch, T sequence, N = B·T tokens, D model width, H / Hkv query / key-value heads,
// Dh head dim, F MLP hidden width, V vocabulary, L layers.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/ops.h"
#include "lowbit/quant.h"
#include "lowbit/recipe.h"

namespace lowbit {

// ---- configuration -------------------------------------------------------------------------
struct ModelConfig {
  std::string preset = "custom";
  int64_t vocab_size = 0;  // 0: taken from the tokenizer when training starts
  int d_model = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;  // grouped-query attention: n_heads must be a multiple
  int ffn_hidden = 0;  // F of the SwiGLU MLP
  int max_seq_len = 0;
  float norm_eps = 1e-5f;
  RopeConfig rope;
  bool tie_embeddings = true;

  int head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
  // Every parameter, the tied head counted once.
  int64_t num_params() const;
  // Parameters outside the embedding table (and the untied head): the "N" of 6·N FLOPs/token.
  int64_t num_matmul_params() const;
  // Training FLOPs per token (forward + backward): 6·(matmul params, head included) plus causal
  // attention 6·L·T·H·Dh (QKᵀ and PV, halved by the mask, ×3 for the backward).
  double train_flops_per_token(int seq_len) const;
  // Throws UserError naming the first field out of range (dims, divisibility, head dim).
  void validate() const;
  // Our JSON form (also read back by model_config_from_json).
  std::string to_json() const;
};

// "tiny" (CPU and CI), "124m", "350m", "1b", "8b", "70b". Unknown names throw UserError listing
// the presets.
ModelConfig model_preset(std::string_view name);
std::vector<std::string> model_preset_names();
// Reads a config file: our JSON (keys as in to_json, any subset overriding `base`) or a Hugging
// Face `config.json` (hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings, rms_norm_eps,
// rope_theta, rope_scaling {rope_type llama3}, tie_word_embeddings).
ModelConfig model_config_from_json(const std::string& json_text, const ModelConfig& base,
                                   const std::string& source_name);
// TOML: the keys of our JSON form, at the top level or in a [model] table.
ModelConfig model_config_from_toml(const std::string& toml_text, const ModelConfig& base,
                                   const std::string& source_name);
// By extension: .toml is TOML, anything else JSON (ours or HF config.json).
ModelConfig model_config_from_file(const std::string& path, const ModelConfig& base);

// ---- precision plan ----------------------------------------------------------------------------
// The linear layers of one block, in arena order.
enum class LinearKind : uint8_t { kQKV, kProj, kGateUp, kDown };
inline constexpr int kLinearsPerBlock = 4;
std::string_view linear_kind_name(LinearKind k);  // "qkv", "proj", "gate_up", "down"

// How one linear layer runs: its recipe and, for quantized recipes, the quantization of each
// operand (X input activation, W weight, dY output gradient). The three GEMM roles follow:
// fprop X·Wᵀ, dgrad dY·W, wgrad dYᵀ·X.
struct LinearPrecision {
  Recipe recipe = Recipe::kBF16;
  QuantConfig x, w, dy;  // unused for bf16; `delayed` pointers are bound by the model
};

struct PrecisionOverrides {
  std::vector<int> bf16_layers;  // blocks kept in BF16 whatever the recipe
  // NVFP4 keeps the last ceil(fraction · L) blocks in BF16 unless set (< 0: the default 0.15).
  double nvfp4_bf16_tail_fraction = -1.0;
  bool quantize_head = false;  // the LM head in the recipe too (default BF16)
  Fp8Format fp8_format = Fp8Format::kHybrid;
  int64_t amax_history_len = 1024;
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::kMax;
  int fp8_margin = 0;
};

struct PrecisionPlan {
  Recipe recipe = Recipe::kBF16;
  PrecisionOverrides overrides;
  std::vector<LinearPrecision> linears;  // [L · kLinearsPerBlock], block-major
  LinearPrecision head;                  // the LM head (bf16 unless quantize_head)

  const LinearPrecision& at(int layer, LinearKind k) const {
    return linears[static_cast<size_t>(layer) * kLinearsPerBlock + static_cast<int>(k)];
  }
  // One line per block: "block 3: qkv fp8 (x e4m3 delayed, w e4m3 delayed, dy e5m2 delayed) …".
  std::string describe() const;
  std::string to_json() const;  // stored in checkpoints
  bool any_quantized() const;   // some linear (or the head) runs a quantized recipe
};

PrecisionPlan resolve_precision(Recipe recipe, const ModelConfig& cfg,
                                const PrecisionOverrides& ov = {});

// ---- parameters -------------------------------------------------------------------------
// Every parameter tensor of the model is a segment of one arena: FP32 master weights, FP32
// gradients, AdamW moments, and the BF16 compute copy, all [P] and indexed alike.
struct ParamInfo {
  std::string name;  // Hugging Face LLaMA name, e.g. "model.layers.3.self_attn.q_proj.weight"
  Shape shape;
  int64_t offset = 0;           // in elements, into the [P] buffers
  int64_t compute_offset = -1;  // in elements, into compute_all; -1: no persistent bf16 copy
  bool weight_decay = true;
  bool has_compute() const { return compute_offset >= 0; }
};

class ParamArena {
 public:
  // `keeps_compute(name)` says which parameters keep a persistent bf16 compute copy (all when
  // empty). The others — weights that reach the GEMMs only quantized — are converted from the
  // master copy when needed (LlamaModel quantizes them from the master, rounded to bf16 as it is
  // read: QuantConfig::round_source_to_bf16).
  ParamArena(const ModelConfig& cfg, Device dev,
             const std::function<bool(const std::string&)>& keeps_compute = {});
  const std::vector<ParamInfo>& params() const { return params_; }
  const std::vector<ParamSegment>& segments() const { return segments_; }
  int64_t size() const { return size_; }  // P
  int find(std::string_view name) const;  // index into params(), -1 if absent

  // Views of parameter `i` (its shape) in each buffer.
  TensorView master(int i) const;   // f32
  TensorView grad(int i) const;     // f32
  TensorView compute(int i) const;  // bf16; the parameter must have a copy (has_compute())
  // A contiguous range of rows spanning params [first, last] (e.g. q, k, v as one [(H+2Hkv)·Dh,
  // D] weight): the params must be consecutive and share their trailing dims.
  TensorView compute_fused(int first, int last) const;
  bool has_compute(int i) const { return params_[i].has_compute(); }
  // compute = RN(master) for every parameter with a copy.
  void sync_compute(Context& ctx) const;
  TensorView grad_fused(int first, int last) const;
  TensorView master_fused(int first, int last) const;

  Tensor master_all, grad_all, m_all, v_all;  // [P] f32
  Tensor compute_all;                         // [Pc] bf16, Pc ≤ P (see keeps_compute)

 private:
  std::vector<ParamInfo> params_;
  std::vector<ParamSegment> segments_;
  int64_t size_ = 0;
};

// ---- incremental decoding ----------------------------------------------------------------
// The keys and values of every layer for `batch` sequences of up to `capacity` positions (RoPE
// applied to the keys), bf16 on the context's device, with the RoPE table of those positions.
// LlamaModel::decode appends to it; all sequences of a batch advance together.
class KvCache {
 public:
  // capacity ≤ cfg.max_seq_len (0: max_seq_len). Memory: 2·L·B·capacity·Hkv·Dh bf16.
  KvCache(Context& ctx, const ModelConfig& cfg, int batch, int capacity = 0);
  int batch() const { return batch_; }
  int capacity() const { return capacity_; }
  int length() const { return length_; }        // positions held, [0, capacity]
  void reset() { length_ = 0; }                 // forget every position (the memory is kept)
  TensorView k(int layer) const;                // [B, capacity, Hkv, Dh] bf16
  TensorView v(int layer) const;                // [B, capacity, Hkv, Dh] bf16
  const Tensor& rope() const { return rope_; }  // [capacity, Dh/2, 2] f32

 private:
  friend class LlamaModel;
  int n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  int batch_ = 0, capacity_ = 0, length_ = 0;
  Tensor k_all_, v_all_;  // [L, B, capacity, Hkv, Dh] bf16
  Tensor rope_;
};

// ---- the model ---------------------------------------------------------------------------
struct ForwardOptions {
  bool training = true;                   // keep what the backward needs
  bool activation_checkpointing = false;  // keep only each block's input; recompute in backward
  int loss_chunk_rows = 4096;             // rows of logits materialised at once (bf16)
  // Quantized linears: recompute the columnwise copy of each block linear's input in the
  // backward (bit-identical) instead of keeping it from the forward — less activation memory
  // for one extra RMSNorm/SwiGLU pass per block.
  bool recompute_quantized_inputs = true;
  // Quantized linears: quantize each weight where it is used — the rowwise copy in the forward,
  // the columnwise (transposed) copy for dgrad in the backward, layer by layer — and drop it
  // after its GEMM, instead of keeping both for the rest of the step (bit-identical; less memory,
  // for one more conversion of each weight per micro-batch after the first).
  bool recompute_quantized_weights = true;
  // The outputs of a block's qkv and gate_up linears ([N, (H + 2·Hkv)·Dh] after RoPE and
  // [N, 2F] — the largest activations a block saves) are dropped after the forward and
  // recomputed in the backward from what the block keeps anyway (its input and the residual
  // after attention): one more RMSNorm + qkv GEMM + RoPE and RMSNorm + gate_up GEMM per block,
  // bit-identical gradients. kOn: every block; kOff: none; kFirst: the first
  // recompute_first_blocks blocks (whose backward runs last, when the others' activations are
  // gone, so what they drop comes off the peak in full). kAuto: every block for NVFP4 plans
  // (the memory-first recipe); the first ⌈L/16⌉ blocks for the other quantized recipes, which
  // keeps FP8's peak under 0.8× of BF16's (1b on an H200: 0.59 GiB off a 32.6 GiB peak, no
  // measurable step time); none for bf16.
  enum class Recompute { kAuto, kOn, kOff, kFirst };
  Recompute recompute_block_outputs = Recompute::kAuto;
  int recompute_first_blocks = 0;  // kFirst
  // "auto", "on", "off" or a block count N ≥ 0 (the --recompute_block_outputs flag) into
  // recompute_block_outputs / recompute_first_blocks; anything else is a UserError.
  void set_recompute_from_name(const std::string& name);
  // How many leading blocks of a model with n_layers blocks and a plan of recipe `plan_recipe`
  // recompute their outputs.
  int recomputed_blocks(Recipe plan_recipe, int n_layers) const;
  // Count saturated and underflowing elements of every quantized operand into the model's
  // quant-stats buffer (one extra pass over each operand; for the steps that log them).
  bool collect_quant_stats = false;
  // The first micro-batch of a step: each linear's first weight-gradient GEMM writes its
  // gradient (beta 0) instead of adding to it, and so does each norm's backward, so those
  // gradients need no zeroing beforehand (LlamaModel::zero_grads(true) clears only the others).
  // Off: every gradient is added to.
  bool overwrite_linear_grads = false;
  // Leave the per-token losses on the device (StepStats::losses / targets) instead of reading
  // them back after the head: the caller reads them with its other values in one wait at the
  // end of the step (StepStats::add_losses), so the backward is queued while the head runs.
  bool defer_loss_read = false;
};

// Per-step counters gathered on the device (no host synchronisation until read).
struct StepStats {
  double loss_sum = 0;  // Σ per-token loss over the valid tokens
  int64_t valid_tokens = 0;
  // With ForwardOptions::defer_loss_read: the micro-batch's per-token losses [N] f32 and its
  // targets [N] i32, on the model's device, not yet in loss_sum / valid_tokens.
  Tensor losses, targets;
  // Adds n read-back per-token losses to loss_sum, over the tokens whose target is not ignored
  // (target ≥ 0), in token order (f64).
  void add_losses(const float* loss, const int32_t* target, int64_t n);
};

class LlamaModel {
 public:
  // activation_dtype: bf16 (training), or f32 on the CPU — activations and weights in f32, the
  // reference against which gradients are checked by finite differences (bf16 recipe only).
  LlamaModel(const ModelConfig& cfg, const PrecisionPlan& plan, Context& ctx,
             DType activation_dtype = DType::kBF16);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const PrecisionPlan& plan() const { return plan_; }
  ParamArena& params() { return *arena_; }
  const ParamArena& params() const { return *arena_; }
  // Delayed-scaling states (recipe fp8), else null: forward slots (x, w per linear) and
  // backward slots (dy per linear).
  DelayedScalingState* fp8_forward_state() const;
  DelayedScalingState* fp8_backward_state() const;

  // Normal(0, 0.02) for matrices (output projections scaled by 1/sqrt(2L)), ones for norms;
  // deterministic in `seed` (Philox keyed by parameter offset), on the host then copied.
  void init_weights(uint64_t seed);
  // compute copy = RN_bf16(master) for every parameter that keeps one (after init or load);
  // also does what weights_changed() does.
  void sync_compute_weights();
  // The master weights changed (an optimizer step): the quantized weights and the bf16 weights
  // derived for decoding are rebuilt when next needed.
  void weights_changed();
  // The bf16 weight [rows, cols] of block linear `lin` (l·4 + LinearKind) or of the head
  // (lin = L·4): the compute copy, or for a quantized linear a conversion of its master weight,
  // cached until the weights change (generation).
  TensorView bf16_weight(int lin);

  // Forward and, when grad_scale > 0, backward of one micro-batch: tokens, targets [B, T] i32
  // (host or device; targets may hold ignore_index = -1). Returns the loss sum and valid count
  // (read back from the device: one synchronisation). Gradients accumulate (+=) into
  // params().grad_all, each token's loss gradient scaled by grad_scale.
  StepStats forward_backward(const TensorView& tokens, const TensorView& targets, int batch,
                             int seq_len, float grad_scale, const ForwardOptions& opt = {});
  // Zeroes the gradients before a step's first micro-batch: all of them, or with
  // `except_overwritten` only those that a forward_backward with overwrite_linear_grads does not
  // write outright (the embedding unless the head is tied to it) — the weight gradients of the
  // linears, the head and the norms, most of the arena, then skip a memset and a read in their
  // GEMMs and reductions.
  void zero_grads(bool except_overwritten);
  // Forward only: the loss (eval).
  StepStats forward_loss(const TensorView& tokens, const TensorView& targets, int batch,
                         int seq_len);
  // Saturation and underflow counts gathered by passes run with collect_quant_stats, per
  // quantized linear (block linears in order, then the head) and operand (x, w, dy).
  struct QuantStats {
    int64_t saturated = 0, underflow = 0, numel = 0;
  };
  // [L·4 + 1][3]; reads the device counters (one synchronisation).
  std::vector<std::array<QuantStats, 3>> quant_stats() const;
  void reset_quant_stats();

  // Logits of the last position of each sequence: [B, V] f32 on the host (generation).
  std::vector<float> last_logits(const TensorView& tokens, int batch, int seq_len);
  // Incremental decoding (src/model/llama_decode.cpp): runs tokens [B, Tq] i32 (host or device)
  // at positions [t0, t0 + Tq), t0 = cache.length(), attending to the cached positions; appends
  // their keys and values to `cache` and returns the logits of the last position [B, V] f32 on
  // the host. A prompt is one call (the prefill), then one call per generated token. Always BF16
  // with the BF16 weights (bf16_weight()), whatever the plan's recipe (generation evaluates the
  // trained weights in BF16; forward_loss measures the training recipe). Positions past
  // cache.capacity() are a UserError: reset() the cache and prefill a shorter window.
  std::vector<float> decode(const TensorView& tokens, int batch, int tq, KvCache& cache);

 private:
  struct Impl;
  ModelConfig cfg_;
  PrecisionPlan plan_;
  Context& ctx_;
  std::unique_ptr<ParamArena> arena_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lowbit
