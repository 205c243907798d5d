// `lowbit bench ops`: time of every transformer op (lowbit/ops.h) at the shapes of the model
// presets, against the device's measured copy bandwidth, timed with CUDA events.
//
// Timing: one warm-up call, a 3-call estimate, one warm-up burst, then `iters` samples, each a
// burst of back-to-back calls lasting about 1 ms; a sample is the burst's time divided by its
// calls, and the row reports the median sample.
//
// Bytes counted per op are the tensors it must touch, each read and written once (a tensor
// updated in place counts one read and one write); gathered or scattered rows count only the
// rows touched. Kernels that read a tensor twice are still charged one read, so their GB/s shows
// the cost of the second pass. Attention is compute-bound and reports FLOPs instead (causal:
// fwd 2·B·H·T²·Dh, bwd 2.5× fwd).
//
// Every op runs repeatedly on the same buffers (in-place ops on their own output); working sets
// below the L2 size may be partly served from it, as they are in the PyTorch peer.
#include <cuda_runtime.h>
#include <map>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <unordered_set>
#include <vector>

#include "bench/ops_bench.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/core/philox.h"
#include "lowbit/formats.h"
#include "lowbit/model.h"
#include "lowbit/ops.h"

namespace lowbit::bench {

namespace {

// Normal(0, std) values from Philox (Box–Muller), bf16 or f32.
__global__ void fill_normal_kernel(void* x, bool bf16, int64_t n, float std, uint64_t seed) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float u1 = philox_uniform(seed, 0, 2 * i) + 1e-7f;
  const float u2 = philox_uniform(seed, 0, 2 * i + 1);
  const float v = std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  if (bf16) {
    static_cast<uint16_t*>(x)[i] = f32_to_bf16_rn(v);
  } else {
    static_cast<float*>(x)[i] = v;
  }
}

void fill_normal(const TensorView& t, float std, uint64_t seed, cudaStream_t s) {
  const int64_t n = t.numel();
  if (n == 0) return;
  fill_normal_kernel<<<unsigned((n + 255) / 256), 256, 0, s>>>(t.data, t.dtype == DType::kBF16, n,
                                                               std, seed);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

// n tokens uniform in [0, V) on the device; *unique receives the count of distinct values.
Tensor random_tokens(int64_t n, int64_t V, uint64_t seed, Device dev, int64_t* unique) {
  Tensor host = Tensor::empty({n}, DType::kI32, Device::cpu());
  std::mt19937_64 rng(seed);
  std::unordered_set<int32_t> seen;
  for (int64_t i = 0; i < n; ++i) {
    host.ptr<int32_t>()[i] = static_cast<int32_t>(rng() % uint64_t(V));
    if (unique) seen.insert(host.ptr<int32_t>()[i]);
  }
  if (unique) *unique = static_cast<int64_t>(seen.size());
  return Tensor::copy_of(host, dev);
}

// Median milliseconds of one call of fn (see the file comment).
double time_ms(cudaStream_t stream, int iters, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  LOWBIT_CUDA_CHECK(cudaEventCreate(&a));
  LOWBIT_CUDA_CHECK(cudaEventCreate(&b));
  auto burst = [&](int calls) {
    LOWBIT_CUDA_CHECK(cudaEventRecord(a, stream));
    for (int c = 0; c < calls; ++c) fn();
    LOWBIT_CUDA_CHECK(cudaEventRecord(b, stream));
    LOWBIT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    return double(t) / calls;
  };
  fn();
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double est = burst(3);
  const int calls = std::clamp(int(std::ceil(1.0 / std::max(est, 1e-4))), 1, 10000);
  burst(calls);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) ms.push_back(burst(calls));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> d) {
  std::string s;
  for (const auto& [k, v] : d) s += (s.empty() ? "" : " ") + std::string(k) + std::to_string(v);
  return s;
}

class Recorder {
 public:
  Recorder(cudaStream_t s, int iters, std::vector<std::string> ops)
      : stream_(s), iters_(iters), ops_(std::move(ops)) {}
  double copy_gbps = 0;  // 1 GiB device-to-device copy
  // Scratch of the size-matched copies: [1 GiB] u8 each.
  Tensor copy_src, copy_dst;

  // GB/s of a device-to-device copy moving the same bytes (half read, half written) as a
  // memory-bound row: small tensors cannot reach the 1 GiB copy's rate (launch and tail
  // effects), so each row is held against a copy of its own size. Cached per size.
  double matched_copy_gbps(double bytes) {
    if (!copy_src.defined()) return copy_gbps;
    const int64_t cap = copy_src.numel();
    const int64_t n = std::min<int64_t>(cap, std::max<int64_t>(4096, int64_t(bytes / 2) & ~255LL));
    auto it = copy_cache_.find(n);
    if (it != copy_cache_.end()) return it->second;
    const double ms = time_ms(stream_, iters_, [&] {
      LOWBIT_CUDA_CHECK(
          cudaMemcpyAsync(copy_dst.data(), copy_src.data(), n, cudaMemcpyDeviceToDevice, stream_));
    });
    const double g = 2.0 * n / ms / 1e6;
    copy_cache_[n] = g;
    return g;
  }

  // Times fn and appends a row: memory-bound when bytes > 0, compute-bound when flops > 0.
  void row(const std::string& op, const std::string& preset, const std::string& shape, double bytes,
           double flops, const std::function<void()>& fn) {
    if (!selected(op) && preset != "device") return;
    OpsBenchRow r;
    r.op = op;
    r.preset = preset;
    r.shape = shape;
    r.bytes = bytes;
    r.flops = flops;
    try {
      r.ms = time_ms(stream_, iters_, fn);
      if (bytes > 0) {
        r.gbps = bytes / r.ms / 1e6;
        const double ref = matched_copy_gbps(bytes);
        r.copy_gbps = ref;
        r.frac_of_copy = ref > 0 ? r.gbps / ref : 1.0;
      }
      if (flops > 0) r.tflops = flops / r.ms / 1e9;
    } catch (const std::exception& e) {
      r.error = e.what();
      cudaGetLastError();  // clear a sticky launch error where the context survives
    }
    print(r);
    rows.push_back(r);
  }
  // A case whose setup failed (allocation, shape check): recorded, the run goes on.
  void failed(const std::string& op, const std::string& preset, const std::string& what) {
    if (!selected(op)) return;
    OpsBenchRow r;
    r.op = op;
    r.preset = preset;
    r.error = what;
    cudaGetLastError();
    print(r);
    rows.push_back(r);
  }

  std::vector<OpsBenchRow> rows;

 private:
  static void print(const OpsBenchRow& r) {
    if (!r.error.empty()) {
      std::printf("%-6s %-26s %-30s error: %s\n", r.preset.c_str(), r.op.c_str(), r.shape.c_str(),
                  r.error.c_str());
    } else if (r.flops > 0) {
      std::printf("%-6s %-26s %-30s %9.4f ms %27s %8.1f TFLOP/s\n", r.preset.c_str(), r.op.c_str(),
                  r.shape.c_str(), r.ms, "", r.tflops);
    } else {
      std::printf("%-6s %-26s %-30s %9.4f ms %8.1f GB/s %6.1f%% of copy (%.0f GB/s)\n",
                  r.preset.c_str(), r.op.c_str(), r.shape.c_str(), r.ms, r.gbps,
                  100.0 * r.frac_of_copy, r.copy_gbps);
    }
    std::fflush(stdout);
  }
  bool selected(const std::string& op) const {
    if (ops_.empty()) return true;
    return std::any_of(ops_.begin(), ops_.end(),
                       [&](const std::string& f) { return op.find(f) != std::string::npos; });
  }
  cudaStream_t stream_;
  std::map<int64_t, double> copy_cache_;
  int iters_;
  std::vector<std::string> ops_;
};

// Strided [B, T, n, Dh] view of heads [h0, h0 + n) in a fused [B, T, C, Dh] bf16 tensor.
TensorView heads_view(const Tensor& fused, int64_t h0, int64_t n) {
  const Shape& s = fused.shape();
  const int64_t B = s[0], T = s[1], C = s[2], Dh = s[3];
  return TensorView(static_cast<uint16_t*>(fused.data()) + h0 * Dh, DType::kBF16,
                    Shape{B, T, n, Dh}, Shape{T * C * Dh, C * Dh, Dh, 1}, fused.device());
}

void bench_preset(Context& ctx, Recorder& rec, const OpsBenchPreset& p) {
  cudaStream_t s = ctx.stream();
  const Device dev = ctx.device();
  ModelConfig mc = model_preset(p.name);
  mc.vocab_size = p.vocab;
  mc.max_seq_len = std::max(mc.max_seq_len, p.seq_len);
  const int64_t B = p.batch, T = p.seq_len, N = B * T, D = mc.d_model, V = p.vocab;
  const int64_t H = mc.n_heads, Hkv = mc.n_kv_heads, Dh = mc.head_dim(), F = mc.ffn_hidden;
  const std::string& name = p.name;
  const DType bf = DType::kBF16, f32 = DType::kF32;

  // Embedding: the gathered rows are read once each, so the table is charged N rows (fwd);
  // the backward reads and writes each distinct row of the f32 gradient table once.
  try {
    int64_t unique = 0;
    Tensor tokens = random_tokens(N, V, 11, dev, &unique);
    Tensor table = Tensor::empty({V, D}, bf, dev);
    Tensor out = Tensor::empty({N, D}, bf, dev);
    Tensor dtable = Tensor::zeros({V, D}, f32, dev);
    fill_normal(table, 0.02f, 1, s);
    fill_normal(out, 1.0f, 2, s);
    Tensor plan = Tensor::empty({2, N}, DType::kI32, dev);  // [2, N] the backward's order
    const std::string sh = dims({{"N", N}, {"D", D}, {"V", V}});
    // Training runs the pair with the sort plan (the forward sorts beside its gather, the
    // backward reuses the order); without it (inference, or a caller that keeps no plan) the
    // backward sorts first.
    rec.row("embedding fwd", name, sh, 4.0 * N + 2.0 * N * D * 2, 0,
            [&] { embedding_fwd(ctx, out, tokens, table); });
    rec.row("embedding fwd+sort plan", name, sh, 4.0 * N + 2.0 * N * D * 2 + 8.0 * N, 0,
            [&] { embedding_fwd(ctx, out, tokens, table, plan); });
    rec.row("embedding bwd (plan)", name, sh, 8.0 * N + 2.0 * N * D + 8.0 * unique * D, 0,
            [&] { embedding_bwd(ctx, dtable, tokens, out, plan); });
    rec.row("embedding bwd, own sort", name, sh, 4.0 * N + 2.0 * N * D + 8.0 * unique * D, 0,
            [&] { embedding_bwd(ctx, dtable, tokens, out); });
  } catch (const std::exception& e) {
    rec.failed("embedding", name, e.what());
  }

  // RMSNorm over [N, D].
  try {
    Tensor x = Tensor::empty({N, D}, bf, dev), w = Tensor::empty({D}, bf, dev);
    Tensor out = Tensor::empty({N, D}, bf, dev), rstd = Tensor::empty({N}, f32, dev);
    Tensor dx = Tensor::empty({N, D}, bf, dev), dw = Tensor::zeros({D}, f32, dev);
    fill_normal(x, 1.0f, 3, s);
    fill_normal(w, 1.0f, 4, s);
    rmsnorm_fwd(ctx, out, rstd, x, w, mc.norm_eps);
    const std::string sh = dims({{"N", N}, {"D", D}});
    // fwd: x, w read; out, rstd written. bwd: dout, x, w, rstd read; dx written; dw (+=) r+w.
    rec.row("rmsnorm fwd", name, sh, 2.0 * N * D + 2.0 * D + 2.0 * N * D + 4.0 * N, 0,
            [&] { rmsnorm_fwd(ctx, out, rstd, x, w, mc.norm_eps); });
    rec.row("rmsnorm bwd", name, sh, 3 * 2.0 * N * D + 2.0 * D + 4.0 * N + 8.0 * D, 0,
            [&] { rmsnorm_bwd(ctx, dx, dw, out, x, w, rstd); });
  } catch (const std::exception& e) {
    rec.failed("rmsnorm", name, e.what());
  }

  // RMSNorm + per-tensor FP8 (delayed scaling, the forward's rowwise copy; then both copies as
  // the backward's recompute would ask): the fused kernel against rmsnorm_fwd + quantize. Both
  // rows count the fused op's traffic (x, w read; codes, rstd written; no bf16 y), so their GB/s
  // compare directly; the unfused path moves 2·N·D·2 more bytes (y written and read back).
  try {
    Tensor x = Tensor::empty({N, D}, bf, dev), w = Tensor::empty({D}, bf, dev);
    Tensor y = Tensor::empty({N, D}, bf, dev), rstd = Tensor::empty({N}, f32, dev);
    fill_normal(x, 1.0f, 3, s);
    fill_normal(w, 1.0f, 4, s);
    DelayedScalingState state(DelayedScalingConfig{}, ScalingPass::kForward, 1, dev);
    const std::string sh = dims({{"N", N}, {"D", D}});
    for (const bool both : {false, true}) {
      QuantConfig cfg = QuantConfig::fp8_delayed(state, 0);
      cfg.columnwise = both;
      QuantizedTensor q;
      const double bytes = 2.0 * N * D + 2.0 * D + (both ? 2.0 : 1.0) * N * D + 4.0 * N;
      const std::string copies = both ? "row+col" : "row";
      rec.row("rmsnorm fwd+fp8 " + copies + " fused", name, sh, bytes, 0,
              [&] { rmsnorm_fwd_quantize(ctx, TensorView(), rstd, x, w, mc.norm_eps, cfg, q); });
      rec.row("rmsnorm fwd+fp8 " + copies + " unfused", name, sh, bytes, 0, [&] {
        rmsnorm_fwd(ctx, y, rstd, x, w, mc.norm_eps);
        quantize(ctx, y, cfg, q);
      });
    }
  } catch (const std::exception& e) {
    rec.failed("rmsnorm fwd+fp8", name, e.what());
  }

  // The RMSNorm backward of a pre-norm block as the model runs it: dx += the norm's gradient
  // (residual aliasing dx), quantized as the previous linear's dY (E5M2 row+col), and the norm
  // output remade as the next linear's columnwise wgrad input — fused, against rmsnorm_bwd, the
  // cast and the recompute (rmsnorm_fwd_quantize) one after the other. Both rows count the fused
  // traffic (dout, x, dx read; dx, 3 copies of codes written).
  try {
    Tensor x = Tensor::empty({N, D}, bf, dev), w = Tensor::empty({D}, bf, dev);
    Tensor dout = Tensor::empty({N, D}, bf, dev), dx = Tensor::empty({N, D}, bf, dev);
    Tensor y = Tensor::empty({N, D}, bf, dev), rstd = Tensor::empty({N}, f32, dev);
    Tensor dw = Tensor::zeros({D}, f32, dev);
    fill_normal(x, 1.0f, 3, s);
    fill_normal(w, 1.0f, 4, s);
    fill_normal(dout, 1e-3f, 12, s);
    fill_normal(dx, 1e-3f, 13, s);
    rmsnorm_fwd(ctx, y, rstd, x, w, mc.norm_eps);
    DelayedScalingState fwd(DelayedScalingConfig{}, ScalingPass::kForward, 1, dev);
    DelayedScalingState bwd(DelayedScalingConfig{}, ScalingPass::kBackward, 1, dev);
    const QuantConfig dx_cfg = QuantConfig::fp8_delayed(bwd, 0);
    QuantConfig y_cfg = QuantConfig::fp8_delayed(fwd, 0);
    y_cfg.rowwise = false;
    y_cfg.columnwise = true;
    const std::string sh = dims({{"N", N}, {"D", D}});
    const double bytes = 3 * 2.0 * N * D + 2.0 * D + 4.0 * N + 2.0 * N * D + 3.0 * N * D;
    QuantizedTensor dxq, yq;
    rec.row("rmsnorm bwd+fp8+y fused", name, sh, bytes, 0, [&] {
      rmsnorm_bwd_quantize(ctx, dx, dw, dout, x, w, rstd, dx, mc.norm_eps, &dx_cfg, &dxq, &y_cfg,
                           &yq);
    });
    rec.row("rmsnorm bwd+fp8+y three passes", name, sh, bytes, 0, [&] {
      rmsnorm_fwd_quantize(ctx, TensorView(), TensorView(), x, w, mc.norm_eps, y_cfg, yq);
      rmsnorm_bwd(ctx, dx, dw, dout, x, w, rstd, dx);
      quantize(ctx, dx, dx_cfg, dxq);
    });
  } catch (const std::exception& e) {
    rec.failed("rmsnorm bwd+fp8+y", name, e.what());
  }

  // RoPE in place on the q heads of a fused qkv activation [B, T, H + 2·Hkv, Dh]: q read and
  // written once, the [T, Dh/2, 2] f32 table read once.
  try {
    Tensor qkv = Tensor::empty({B, T, H + 2 * Hkv, Dh}, bf, dev);
    Tensor table = Tensor::empty({T, Dh / 2, 2}, f32, dev);
    fill_normal(qkv, 1.0f, 5, s);
    rope_table(ctx, table, mc.rope);
    const TensorView q = heads_view(qkv, 0, H);
    const std::string sh = dims({{"B", B}, {"T", T}, {"H", H}, {"Dh", Dh}});
    const double bytes = 2 * 2.0 * N * H * Dh + 4.0 * T * Dh;
    rec.row("rope fwd (q)", name, sh, bytes, 0, [&] { rope_fwd(ctx, q, q, table); });
    rec.row("rope bwd (q)", name, sh, bytes, 0, [&] { rope_bwd(ctx, q, q, table); });
  } catch (const std::exception& e) {
    rec.failed("rope", name, e.what());
  }

  // The qkv gradient's rotation back fused with its quantization as the qkv linear's dY (E5M2
  // row+col), against rope_bwd in place on dq, dk and the cast of the whole [N, (H + 2·Hkv)·Dh]
  // gradient; both rows count the fused traffic (dqkv read, two copies of codes written).
  try {
    const int64_t W = (H + 2 * Hkv) * Dh;
    Tensor dqkv = Tensor::empty({B, T, H + 2 * Hkv, Dh}, bf, dev);
    Tensor table = Tensor::empty({T, Dh / 2, 2}, f32, dev);
    fill_normal(dqkv, 1e-3f, 14, s);
    rope_table(ctx, table, mc.rope);
    DelayedScalingState bwd(DelayedScalingConfig{}, ScalingPass::kBackward, 1, dev);
    const QuantConfig cfg = QuantConfig::fp8_delayed(bwd, 0);
    const std::string sh = dims({{"N", N}, {"W", W}, {"Dh", Dh}});
    const double bytes = 2.0 * N * W + 2.0 * N * W + 4.0 * T * Dh;
    QuantizedTensor q;
    rec.row("rope bwd+fp8 fused", name, sh, bytes, 0,
            [&] { rope_bwd_quantize(ctx, TensorView(), dqkv, H + Hkv, table, cfg, q); });
    rec.row("rope bwd+fp8 two passes", name, sh, bytes, 0, [&] {
      const TensorView dqk = heads_view(dqkv, 0, H + Hkv);
      rope_bwd(ctx, dqk, dqk, table);
      quantize(ctx, dqkv.view().reshape({N, W}), cfg, q);
    });
  } catch (const std::exception& e) {
    rec.failed("rope bwd+fp8", name, e.what());
  }

  // SwiGLU: fwd reads gate_up [N, 2F], writes out [N, F]; bwd reads dout and gate_up, writes
  // dgate_up.
  try {
    Tensor gu = Tensor::empty({N, 2 * F}, bf, dev), out = Tensor::empty({N, F}, bf, dev);
    Tensor dgu = Tensor::empty({N, 2 * F}, bf, dev);
    fill_normal(gu, 1.0f, 6, s);
    fill_normal(out, 1.0f, 7, s);
    const std::string sh = dims({{"N", N}, {"F", F}});
    rec.row("swiglu fwd", name, sh, 2.0 * N * 2 * F + 2.0 * N * F, 0,
            [&] { swiglu_fwd(ctx, out, gu); });
    rec.row("swiglu bwd", name, sh, 2.0 * N * F + 2 * 2.0 * N * 2 * F, 0,
            [&] { swiglu_bwd(ctx, dgu, out, gu); });
  } catch (const std::exception& e) {
    rec.failed("swiglu", name, e.what());
  }

  // SwiGLU + per-tensor FP8 (delayed scaling), fused against swiglu_fwd + quantize; both rows
  // count the fused traffic (gate_up read, codes written).
  try {
    Tensor gu = Tensor::empty({N, 2 * F}, bf, dev), h = Tensor::empty({N, F}, bf, dev);
    fill_normal(gu, 1.0f, 6, s);
    DelayedScalingState state(DelayedScalingConfig{}, ScalingPass::kForward, 1, dev);
    const std::string sh = dims({{"N", N}, {"F", F}});
    for (const bool both : {false, true}) {
      QuantConfig cfg = QuantConfig::fp8_delayed(state, 0);
      cfg.columnwise = both;
      QuantizedTensor q;
      const double bytes = 2.0 * N * 2 * F + (both ? 2.0 : 1.0) * N * F;
      const std::string copies = both ? "row+col" : "row";
      rec.row("swiglu fwd+fp8 " + copies + " fused", name, sh, bytes, 0,
              [&] { swiglu_fwd_quantize(ctx, TensorView(), gu, cfg, q); });
      rec.row("swiglu fwd+fp8 " + copies + " unfused", name, sh, bytes, 0, [&] {
        swiglu_fwd(ctx, h, gu);
        quantize(ctx, h, cfg, q);
      });
    }
  } catch (const std::exception& e) {
    rec.failed("swiglu fwd+fp8", name, e.what());
  }

  // The SwiGLU backward + FP8 (dgate_up row+col, E5M2) that also remakes h's columnwise codes
  // for the down linear's wgrad, against the backward plus a separate recompute pass over
  // gate_up; both rows count the fused traffic (gate_up and dout read, codes written).
  try {
    Tensor gu = Tensor::empty({N, 2 * F}, bf, dev), dout = Tensor::empty({N, F}, bf, dev);
    fill_normal(gu, 1.0f, 10, s);
    fill_normal(dout, 1e-3f, 11, s);
    DelayedScalingState fwd(DelayedScalingConfig{}, ScalingPass::kForward, 1, dev);
    DelayedScalingState bwd(DelayedScalingConfig{}, ScalingPass::kBackward, 1, dev);
    QuantConfig cfg = QuantConfig::fp8_delayed(bwd, 0);
    QuantConfig h_cfg = QuantConfig::fp8_delayed(fwd, 0);
    h_cfg.rowwise = false;
    h_cfg.columnwise = true;
    const std::string sh = dims({{"N", N}, {"F", F}});
    const double bytes = 2.0 * N * 2 * F + 2.0 * N * F + 2 * 2.0 * N * F + 1.0 * N * F;
    QuantizedTensor q, qh;
    rec.row("swiglu bwd+fp8+h fused", name, sh, bytes, 0,
            [&] { swiglu_bwd_quantize_with_h(ctx, TensorView(), dout, gu, cfg, q, h_cfg, qh); });
    rec.row("swiglu bwd+fp8+h two passes", name, sh, bytes, 0, [&] {
      swiglu_fwd_quantize(ctx, TensorView(), gu, h_cfg, qh);
      swiglu_bwd_quantize(ctx, TensorView(), dout, gu, cfg, q);
    });
  } catch (const std::exception& e) {
    rec.failed("swiglu bwd+fp8+h", name, e.what());
  }

  // Residual add x += y over [N, D] bf16: two reads, one write.
  try {
    Tensor a = Tensor::empty({N, D}, bf, dev), b = Tensor::empty({N, D}, bf, dev);
    fill_normal(a, 1.0f, 8, s);
    fill_normal(b, 1e-3f, 9, s);
    rec.row("add (bf16)", name, dims({{"N", N}, {"D", D}}), 3 * 2.0 * N * D, 0,
            [&] { add(ctx, a, a, b); });
  } catch (const std::exception& e) {
    rec.failed("add", name, e.what());
  }

  // Cross-entropy forward + backward in place over a chunk of rows: logits read, dlogits
  // written (same storage), targets read, losses written.
  auto cross_entropy = [&](const std::string& op, int64_t rows) {
    try {
      Tensor logits = Tensor::empty({rows, V}, bf, dev), losses = Tensor::empty({rows}, f32, dev);
      Tensor targets = random_tokens(rows, V, 12, dev, nullptr);
      fill_normal(logits, 2.0f, 10, s);
      const TensorView dl = logits.view();
      rec.row(op, name, dims({{"n", rows}, {"V", V}}), 2 * 2.0 * rows * V + 8.0 * rows, 0, [&] {
        cross_entropy_fwd_bwd(ctx, losses, &dl, logits, targets, -1, 1.0f / float(N));
      });
    } catch (const std::exception& e) {
      rec.failed(op, name, e.what());
    }
  };
  cross_entropy("cross_entropy fwd+bwd", std::min<int64_t>(4096, N));
  if (name == "124m") cross_entropy("cross_entropy fwd+bwd (all)", N);

  // AdamW over the preset's parameter arena (one segment per tensor): master, grad, m, v read;
  // master, m, v and the bf16 compute copy written. Gradient norm: grad read, one f32 per
  // segment written and read back, the three scalars written.
  try {
    ParamArena arena(mc, dev);
    const std::vector<ParamSegment>& seg = arena.segments();
    double P = 0;
    for (const ParamSegment& g : seg) P += double(g.numel);
    const double S = double(seg.size());
    fill_normal(arena.master_all, 0.02f, 13, s);
    fill_normal(arena.grad_all, 1e-3f, 14, s);
    fill_bytes(arena.m_all, 0);
    fill_bytes(arena.v_all, 0);
    Tensor seg_norms = Tensor::empty({int64_t(seg.size())}, f32, dev);
    Tensor norm = Tensor::empty({1}, f32, dev), coef = Tensor::empty({1}, f32, dev);
    Tensor skip = Tensor::zeros({1}, DType::kI32, dev);
    segment_norms(ctx, seg_norms, arena.grad_all, seg);
    clip_coefficient(ctx, norm, coef, skip, seg_norms, 1.0f);
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(skip.data(), 0, 4, s));
    AdamWConfig ac;
    ac.lr = 1e-4f;
    const std::string sh = dims({{"P", int64_t(P)}, {"segments", int64_t(S)}});
    const TensorView compute = arena.compute_all.view();
    rec.row("adamw_step", name, sh, 4 * 4.0 * P + 3 * 4.0 * P + 2.0 * P, 0, [&] {
      adamw_step(ctx, arena.master_all, arena.grad_all, arena.m_all, arena.v_all, &compute, seg, ac,
                 coef, skip);
    });
    rec.row("segment_norms + clip", name, sh, 4.0 * P + 8.0 * S + 12.0, 0, [&] {
      segment_norms(ctx, seg_norms, arena.grad_all, seg);
      clip_coefficient(ctx, norm, coef, skip, seg_norms, 1.0f);
    });
  } catch (const std::exception& e) {
    rec.failed("adamw_step", name, e.what());
  }
}

// Causal attention at T = 1024, 2048, 4096: Dh 64 with H = Hkv = 12 and B = 16·1024 / T; Dh 128
// with H 16, Hkv 4 (grouped) and B = 8·2048 / T. q, k, v are strided views of one fused
// [B, T, H + 2·Hkv, Dh] activation and their gradients of another, as in the model.
void bench_attention(Context& ctx, Recorder& rec) {
  cudaStream_t s = ctx.stream();
  const Device dev = ctx.device();
  struct Cfg {
    int64_t dh, h, hkv, tokens;
  };
  for (const Cfg c : {Cfg{64, 12, 12, 16 * 1024}, Cfg{128, 16, 4, 8 * 2048}}) {
    for (const int64_t T : {1024, 2048, 4096}) {
      const int64_t B = c.tokens / T, H = c.h, Hkv = c.hkv, Dh = c.dh;
      const std::string sh = dims({{"B", B}, {"T", T}, {"H", H}, {"Hkv", Hkv}, {"Dh", Dh}});
      try {
        Tensor qkv = Tensor::empty({B, T, H + 2 * Hkv, Dh}, DType::kBF16, dev);
        Tensor dqkv = Tensor::empty({B, T, H + 2 * Hkv, Dh}, DType::kBF16, dev);
        Tensor out = Tensor::empty({B, T, H, Dh}, DType::kBF16, dev);
        Tensor dout = Tensor::empty({B, T, H, Dh}, DType::kBF16, dev);
        Tensor lse = Tensor::empty({B, H, T}, DType::kF32, dev);
        fill_normal(qkv, 1.0f, 20, s);
        fill_normal(dout, 1.0f, 21, s);
        const TensorView q = heads_view(qkv, 0, H), k = heads_view(qkv, H, Hkv),
                         v = heads_view(qkv, H + Hkv, Hkv);
        const TensorView dq = heads_view(dqkv, 0, H), dk = heads_view(dqkv, H, Hkv),
                         dv = heads_view(dqkv, H + Hkv, Hkv);
        const float scale = 1.0f / std::sqrt(float(Dh));
        const double fwd = 2.0 * B * H * double(T) * T * Dh;
        rec.row("attention fwd", "attn", sh, 0, fwd,
                [&] { attention_fwd(ctx, out, lse, q, k, v, scale); });
        rec.row("attention fwd+bwd", "attn", sh, 0, 3.5 * fwd, [&] {
          attention_fwd(ctx, out, lse, q, k, v, scale);
          attention_bwd(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale);
        });
      } catch (const std::exception& e) {
        rec.failed("attention", "attn", e.what());
      }
    }
  }
}

}  // namespace

std::vector<OpsBenchPreset> ops_bench_presets(const std::string& csv) {
  std::vector<OpsBenchPreset> out;
  if (csv == "none") return out;  // the copy and attention rows only
  size_t i = 0;
  while (i <= csv.size()) {
    size_t j = csv.find(',', i);
    if (j == std::string::npos) j = csv.size();
    const std::string p = csv.substr(i, j - i);
    if (p == "124m") {
      out.push_back({"124m", 16, 1024, 32000});
    } else if (p == "1b") {
      out.push_back({"1b", 8, 2048, 128256});
    } else if (!p.empty()) {
      throw UserError(fmt::format("--presets: unknown preset '{}' (124m, 1b, or none)", p));
    }
    i = j + 1;
  }
  LOWBIT_USER_CHECK(!out.empty(), "--presets: no preset given (124m, 1b, or none)");
  return out;
}

std::vector<OpsBenchRow> run_ops_bench(const OpsBenchOptions& opt) {
  LOWBIT_USER_CHECK(cuda_device_count() > 0, "bench ops needs a CUDA GPU; none was found");
  Context ctx = Context::create_default();
  cudaStream_t s = ctx.stream();
  Recorder rec(s, opt.iters, opt.ops);

  // Device-to-device copy of 1 GiB: read once, written once.
  {
    const int64_t n = int64_t(1) << 30;
    Tensor src = Tensor::empty({n}, DType::kU8, ctx.device());
    Tensor dst = Tensor::empty({n}, DType::kU8, ctx.device());
    fill_bytes(src, 1);
    rec.row("copy (d2d)", "device", "1 GiB", 2.0 * n, 0, [&] {
      LOWBIT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), n, cudaMemcpyDeviceToDevice, s));
    });
    rec.copy_gbps = rec.rows.back().error.empty() ? rec.rows.back().gbps : 0;
    if (rec.copy_gbps > 0) rec.rows.back().frac_of_copy = 1.0;
    rec.copy_src = std::move(src);
    rec.copy_dst = std::move(dst);
  }
  for (const OpsBenchPreset& p : opt.presets) bench_preset(ctx, rec, p);
  bench_attention(ctx, rec);
  ctx.synchronize();
  return rec.rows;
}

}  // namespace lowbit::bench
