// gemm() on the GPU against the float64 reference over the same (dequantized) operands, for
// every CUDA backend (BF16, per-tensor FP8, FP8 block scaling, the emulated MX / NVFP4 path)
// and every role (fprop, dgrad, wgrad), plus the CPU gemm(), the HYBRID FP8 pairings, NaN / inf
// propagation, the bias epilogue, algorithm selection (autotuned and not) and the
// configurations that must be rejected.
//
// Error model (per output element, ref = the float64 result, S = Σ_j |a_j|·|b_j| of the
// dequantized operands, bounded from above by ‖a_r‖₂·‖b_c‖₂ so that it costs O((R+C)·K)):
//   |gpu − ref| ≤ out_eps·(|ref| + [bias added separately]·|bias|)
//                 + (1 + out_eps)·(|alpha|·acc_eps·S + 2^-22·(|beta·out_before| + |bias|))
//   * The fp32 value v = alpha·acc + beta·out + bias (a few fp32 roundings: the 2^-22 terms; the
//     alpha·acc part is in acc_eps) is rounded once to out's type when there is no bias or
//     cuBLASLt's epilogue adds it: |out − v| ≤ out_eps·|v| ≤ out_eps·(|ref| + |v − ref|), hence
//     the (1 + out_eps) factor. out_eps = 2^-8 for bf16 (RN to 8 significant bits; a bf16 out
//     is never reduced in bf16: split-K keeps its partial sums in fp32), 2^-22 for f32 (slack).
//   * When the bias is added by the separate kernel, a bf16 value is rounded twice (the GEMM's
//     output g ≈ v − bias, then RN(g + bias)): ≤ 2^-8·|ref − bias| + 2^-8·|ref| + … ≤
//     2^-7·(|ref| + |bias|), so out_eps = 2^-7 on |ref| + |bias| there.
//   * acc_eps, BF16 tensor cores and the emulated MX / NVFP4 path (bf16 products are exact in
//     fp32): K·2^-23, the worst case of K fp32 additions in any order with round-to-nearest or
//     truncation, + 2^-20 for the NVFP4 alpha fold (RN(RN(RN(α·A_a)·A_b)·RN(1/(36·448²))) vs the
//     reference's per-element factors: a few fp32 ulps relative to S).
//   * acc_eps, FP8 split accumulation (and both block modes): the accumulator inside a wgmma
//     chain keeps fewer bits than fp32 (formats.md §4.4). Measured there: max error 0.13 at
//     K = 16384 with |a|,|b| ≤ 2, i.e. S ≈ 16384 and error/S ≈ 7.9e-6 ≈ 2^-17. We allow
//     2^-11 (64× that) + K·2^-23 for the fp32 part.
//   * acc_eps, FP8 fast accumulation (FAST_ACCUM = 1: no promotion to fp32): measured 4.41 at
//     K = 16384, error/S ≈ 2.7e-4 ≈ 2^-11.9. The error of a random-sign sum grows like √K
//     relative to S, and 16384 is the largest K here, so 2^-8 (≥ 14× the measurement) + K·2^-23.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gemm/fused_dequant_gemm.h"
#include "gemm/gemm_cuda_kernels.h"
#include "gemm/gemm_internal.h"
#include "lowbit/core.h"
#include "lowbit/formats.h"
#include "lowbit/gemm.h"
#include "lowbit/quant.h"

namespace lowbit {
namespace {

enum class Fill { kNormal, kHeavyTail, kCancel, kTiny, kZeros, kNanInf, kNan };
const char* fill_name(Fill f) {
  switch (f) {
    case Fill::kNormal: return "normal";
    case Fill::kHeavyTail: return "heavy_tail";
    case Fill::kCancel: return "cancel";
    case Fill::kTiny: return "tiny";
    case Fill::kZeros: return "zeros";
    case Fill::kNanInf: return "nan_inf";
    case Fill::kNan: return "nan";
  }
  return "?";
}

// A [m, k] bf16 source on the CPU.
Tensor make_source(int64_t m, int64_t k, Fill fill, uint64_t seed) {
  Tensor t = Tensor::empty({m, k}, DType::kBF16, Device::cpu());
  uint16_t* p = t.ptr<uint16_t>();
  for (int64_t i = 0; i < m * k; ++i) {
    const float u1 = philox_uniform(seed, 0, 2 * i) + 1e-7f;
    const float u2 = philox_uniform(seed, 0, 2 * i + 1);
    const float g = std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    float v = 0.0f;
    switch (fill) {
      case Fill::kNormal: v = g; break;
      case Fill::kHeavyTail:
        v = g * std::exp(3.0f * g);
        break;  // up to ~1e7: wide range
      // Nearly equal magnitudes with random signs: sums cancel down to ~√K of S.
      case Fill::kCancel: v = (g < 0 ? -256.0f : 256.0f) * (1.0f + 0.015625f * u2); break;
      case Fill::kTiny: v = g * 1e-12f; break;
      case Fill::kZeros: v = 0.0f; break;
      case Fill::kNanInf:
        v = g;
        if (i % 997 == 5) v = INFINITY;
        if (i % 1009 == 7) v = -INFINITY;
        if (i % 1013 == 3) v = NAN;
        break;
      case Fill::kNan:
        v = g;
        if (i % 1013 == 3) v = NAN;
        break;
    }
    p[i] = f32_to_bf16_rn(v);
  }
  return t;
}

std::vector<float> to_host_f32(const TensorView& v) {
  Tensor h = Tensor::copy_of(v, Device::cpu());
  std::vector<float> out(h.numel());
  if (h.dtype() == DType::kBF16) {
    for (int64_t i = 0; i < h.numel(); ++i) out[i] = bf16_to_f32(h.ptr<const uint16_t>()[i]);
  } else {
    EXPECT_EQ(h.dtype(), DType::kF32);
    std::memcpy(out.data(), h.data(), out.size() * sizeof(float));
  }
  return out;
}

QuantizedTensor copy_to_cpu(const QuantizedTensor& q) {
  QuantizedTensor c;
  c.mode = q.mode;
  c.dtype = q.dtype;
  c.shape = q.shape;
  c.columnwise_hadamard = q.columnwise_hadamard;
  auto cp = [](const Tensor& t) {
    return t.defined() ? Tensor::copy_of(t.view(), Device::cpu()) : Tensor();
  };
  c.rowwise_data = cp(q.rowwise_data);
  c.rowwise_scale_inv = cp(q.rowwise_scale_inv);
  c.columnwise_data = cp(q.columnwise_data);
  c.columnwise_scale_inv = cp(q.columnwise_scale_inv);
  c.amax = cp(q.amax);
  c.columnwise_amax = cp(q.columnwise_amax);
  return c;
}

// ‖v_i‖₂ over the rows (along_rows) or the columns of a row-major [r, c] matrix.
std::vector<double> norms(const std::vector<float>& v, int64_t r, int64_t c, bool along_rows) {
  std::vector<double> n(along_rows ? r : c, 0.0);
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      const double x = v[i * c + j];
      n[along_rows ? i : j] += x * x;
    }
  }
  for (double& x : n) x = std::sqrt(x);
  return n;
}

// One framework tensor (X, W or dY) as a gemm operand: dense bf16 or quantized, on the GPU, with
// the CPU copies the reference and the CPU gemm() take.
struct Operand {
  bool quantized = false;
  Tensor dense_cpu, dense_gpu;
  QuantizedTensor q_gpu, q_cpu;

  GemmOperand gpu() const {
    return quantized ? GemmOperand::of(q_gpu) : GemmOperand::of(dense_gpu.view());
  }
  GemmOperand cpu() const {
    return quantized ? GemmOperand::of(q_cpu) : GemmOperand::of(dense_cpu.view());
  }
  // ‖·‖₂ of the canonical operand's rows: the tensor's rows (rowwise) or columns (columnwise),
  // of the values the GEMM multiplies (the dequantized copy for quantized operands).
  std::vector<double> canon_norms(Usage u) const {
    const bool row = u == Usage::kRowwise;
    if (!quantized) {
      const auto& s = dense_cpu.shape();
      return norms(to_host_f32(dense_cpu.view()), s[0], s[1], row);
    }
    Tensor d = dequantize(q_cpu, u);  // stored orientation
    const auto& s = d.shape();
    // Rowwise [M, K], columnwise transposed [K, M]: the rows either way.
    return norms(to_host_f32(d.view()), s[0], s[1], true);
  }
};

Operand make_operand(Context& ctx, const Tensor& src, const QuantConfig* cfg) {
  Operand o;
  o.dense_cpu = src;
  o.dense_gpu = Tensor::copy_of(src.view(), Device::cuda(0));
  if (cfg != nullptr) {
    o.quantized = true;
    quantize(ctx, o.dense_gpu.view(), *cfg, o.q_gpu);
    ctx.synchronize();
    o.q_cpu = copy_to_cpu(o.q_gpu);
  }
  return o;
}

// Quantization of the three framework tensors; null = dense bf16.
struct Recipe {
  std::string name;
  GemmBackend backend;
  std::optional<QuantConfig> x, w, dy;
  int64_t align;  // every dimension a multiple of this
};

std::vector<Recipe> recipes() {
  std::vector<Recipe> r;
  r.push_back({"bf16", GemmBackend::kCublasLtBf16, std::nullopt, std::nullopt, std::nullopt, 1});
  r.push_back({"fp8_hybrid", GemmBackend::kCublasLtFp8, QuantConfig::fp8_current(DType::kE4M3),
               QuantConfig::fp8_current(DType::kE4M3), QuantConfig::fp8_current(DType::kE5M2), 16});
  r.push_back({"fp8_e4m3_pow2", GemmBackend::kCublasLtFp8,
               QuantConfig::fp8_current(DType::kE4M3, true),
               QuantConfig::fp8_current(DType::kE4M3, true),
               QuantConfig::fp8_current(DType::kE4M3, true), 16});
  r.push_back({"fp8_block_hybrid", GemmBackend::kCublasLtFp8Block,
               QuantConfig::fp8_block_1x128(DType::kE4M3),
               QuantConfig::fp8_block_128x128(DType::kE4M3),
               QuantConfig::fp8_block_1x128(DType::kE5M2), 128});
  r.push_back({"fp8_block_1d_only", GemmBackend::kCublasLtFp8Block,
               QuantConfig::fp8_block_1x128(DType::kE4M3),
               QuantConfig::fp8_block_1x128(DType::kE4M3),
               QuantConfig::fp8_block_1x128(DType::kE4M3), 128});
  r.push_back({"mxfp8_hybrid", GemmBackend::kEmulatedBf16, QuantConfig::mx(DType::kE4M3),
               QuantConfig::mx(DType::kE4M3), QuantConfig::mx(DType::kE5M2), 32});
  r.push_back({"mxfp6_e3m2", GemmBackend::kEmulatedBf16, QuantConfig::mx(DType::kE3M2),
               QuantConfig::mx(DType::kE2M3), QuantConfig::mx(DType::kE3M2), 32});
  r.push_back({"mxfp4", GemmBackend::kEmulatedBf16, QuantConfig::mx(DType::kE2M1),
               QuantConfig::mx(DType::kE2M1), QuantConfig::mx(DType::kE2M1), 32});
  QuantConfig grad = QuantConfig::nvfp4_gradient();
  grad.sr_key = RngKey{0x5EED, 7};
  r.push_back({"nvfp4", GemmBackend::kEmulatedBf16, QuantConfig::nvfp4_activation(),
               QuantConfig::nvfp4_weight(), grad, 16});
  return r;
}

bool is_fp8(GemmBackend b) {
  return b == GemmBackend::kCublasLtFp8 || b == GemmBackend::kCublasLtFp8Block;
}

struct Roles {
  GemmRole role;
  const Operand* a;
  const Operand* b;
  Usage ua, ub;
  int64_t R, C, Kc;
};

Roles role_operands(GemmRole role, const Operand& x, const Operand& w, const Operand& dy, int64_t M,
                    int64_t N, int64_t K) {
  switch (role) {
    case GemmRole::kFprop: return {role, &x, &w, Usage::kRowwise, Usage::kRowwise, M, N, K};
    case GemmRole::kDgrad: return {role, &dy, &w, Usage::kRowwise, Usage::kColumnwise, M, K, N};
    case GemmRole::kWgrad: return {role, &dy, &x, Usage::kColumnwise, Usage::kColumnwise, N, K, M};
  }
  return {};
}

struct Tolerance {
  double out_eps, acc_eps;
  bool bias_separate = false;  // the bias was added after the GEMM (two roundings)
};

// `bias_separate`: a bias that the separate kernel added after the GEMM's own rounding.
Tolerance tolerance(GemmBackend backend, bool fast_accum, DType out, int64_t Kc,
                    bool bias_separate) {
  Tolerance t;
  t.bias_separate = bias_separate;
  t.out_eps = out == DType::kBF16 ? std::ldexp(1.0, bias_separate ? -7 : -8) : std::ldexp(1.0, -22);
  const double fp32_sum = double(Kc) * std::ldexp(1.0, -23);
  if (is_fp8(backend)) {
    t.acc_eps = (fast_accum ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11)) + fp32_sum;
  } else {
    t.acc_eps = fp32_sum + std::ldexp(1.0, -20);
  }
  return t;
}

// Checks got [R, C] against ref with the error model above (scaled by `slack`); NaN where ref
// is NaN, the same infinity where ref is infinite. Returns "" or a description.
std::string compare(const std::vector<double>& ref, const std::vector<float>& got, int64_t R,
                    int64_t C, const std::vector<double>& na, const std::vector<double>& nb,
                    const Tolerance& tol, const GemmOptions& opt,
                    const std::vector<float>* out_before, const std::vector<float>* bias,
                    double slack = 1.0) {
  if (ref.size() != size_t(R * C) || got.size() != size_t(R * C)) {
    return fmt::format("size mismatch: ref {} got {} want {}", ref.size(), got.size(), R * C);
  }
  int64_t bad = 0;
  std::string first;
  double worst = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const double want = ref[r * C + c], have = got[r * C + c];
      bool ok;
      double tl = 0.0;
      if (std::isnan(want)) {
        ok = std::isnan(have);
      } else if (std::isinf(want)) {
        ok = have == want;
      } else {
        const double s = na[r] * nb[c];
        const double b = bias ? std::fabs((*bias)[c]) : 0.0;
        const double before =
            out_before ? std::fabs(double(opt.beta) * (*out_before)[r * C + c]) : 0.0;
        tl = tol.out_eps * (std::fabs(want) + (tol.bias_separate ? b : 0.0)) +
             (1.0 + tol.out_eps) * (std::fabs(double(opt.alpha)) * tol.acc_eps * s +
                                    std::ldexp(1.0, -22) * (before + b));
        tl *= slack;
        if (!std::isfinite(s)) {
          ok = std::isfinite(have);  // an inf operand met zeros only: no bound to apply
        } else {
          ok = std::isfinite(have) && std::fabs(have - want) <= tl;
          if (std::isfinite(have) && tl > 0) worst = std::max(worst, std::fabs(have - want) / tl);
        }
      }
      if (!ok) {
        if (bad == 0) {
          first = fmt::format("[{}, {}]: got {} want {} (tolerance {:.3g})", r, c, have, want, tl);
        }
        ++bad;
      }
    }
  }
  if (bad == 0) return "";
  return fmt::format("{} of {} elements out of tolerance; first {}; worst error/tolerance {:.3g}",
                     bad, R * C, first, worst);
}

bool emulated_on_this_gpu() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major < 10;
}

struct RunSpec {
  DType out = DType::kBF16;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  // The bias dtype; unset: bf16 with a bf16 out, f32 with an f32 out.
  std::optional<DType> bias_dtype;
  Fp8Accumulation acc = Fp8Accumulation::kDefault;
  bool against_cpu_gemm = false;
  // Whether cuBLASLt's epilogue must have added the bias (unset: either way).
  std::optional<bool> expect_bias_epilogue;
  // beta's term reads a separate c of out's dtype (GemmOptions::c, e.g. a residual), not out.
  bool separate_c = false;
};

// What the last check_role() saw of the CUDA backend (which algorithm, where the bias went).
GemmCudaLastCall g_checked_call;

// Runs one role of one recipe on the GPU and checks it against the float64 reference (and,
// when asked, the CPU gemm()).
void check_role(Context& ctx, const Recipe& rc, const Operand& x, const Operand& w,
                const Operand& dy, int64_t M, int64_t N, int64_t K, GemmRole role,
                const RunSpec& spec, const std::string& what) {
  const Roles ro = role_operands(role, x, w, dy, M, N, K);
  const DType bias_dtype = spec.bias_dtype.value_or(spec.out);
  SCOPED_TRACE(fmt::format("{} {} M={} N={} K={} {} out={} alpha={} beta={} bias={}", rc.name,
                           gemm_role_name(role), M, N, K, what, dtype_name(spec.out), spec.alpha,
                           spec.beta, spec.bias ? dtype_name(bias_dtype) : "none"));
  GemmOptions opt;
  opt.role = role;
  opt.alpha = spec.alpha;
  opt.beta = spec.beta;
  opt.accumulation = spec.acc;

  // Expected backend on this GPU.
  const GemmBackend backend = gemm_backend_for(ctx, ro.a->gpu(), ro.b->gpu());
  if (rc.backend != GemmBackend::kEmulatedBf16 || emulated_on_this_gpu()) {
    EXPECT_EQ(gemm_backend_name(backend), gemm_backend_name(rc.backend));
  }

  Tensor bias_cpu, bias_gpu;
  std::vector<float> bias_host;
  if (spec.bias) {
    const Tensor src = make_source(1, ro.C, Fill::kNormal, 99 + ro.C);
    bias_cpu = Tensor::empty({ro.C}, DType::kBF16, Device::cpu());
    std::memcpy(bias_cpu.data(), src.data(), size_t(ro.C) * 2);
    if (bias_dtype == DType::kF32) {  // 2× a bf16 value: exact in f32
      Tensor f = Tensor::empty({ro.C}, DType::kF32, Device::cpu());
      for (int64_t i = 0; i < ro.C; ++i) {
        f.ptr<float>()[i] = 2.0f * bf16_to_f32(bias_cpu.ptr<const uint16_t>()[i]);
      }
      bias_cpu = f;
    }
    bias_gpu = Tensor::copy_of(bias_cpu.view(), Device::cuda(0));
    bias_host = to_host_f32(bias_cpu.view());
  }

  Tensor before_cpu;
  std::vector<float> before_host;
  Tensor out_gpu, c_gpu;
  if (spec.separate_c) {
    // c in out's dtype (4× a bf16 value: exact in either); out is NaN garbage, never read.
    Tensor src = make_source(ro.R, ro.C, Fill::kNormal, 4321 + ro.R);
    before_cpu = Tensor::empty({ro.R, ro.C}, spec.out, Device::cpu());
    for (int64_t i = 0; i < ro.R * ro.C; ++i) {
      const float v = 4.0f * bf16_to_f32(src.ptr<const uint16_t>()[i]);
      if (spec.out == DType::kF32) {
        before_cpu.ptr<float>()[i] = v;
      } else {
        before_cpu.ptr<uint16_t>()[i] = f32_to_bf16_rn(v);
      }
    }
    c_gpu = Tensor::copy_of(before_cpu.view(), Device::cuda(0));
    before_host = to_host_f32(before_cpu.view());
    out_gpu = Tensor::empty({ro.R, ro.C}, spec.out, Device::cuda(0));
    fill_bytes(out_gpu.view(), 0xFF);
  } else if (spec.beta != 0.0f) {
    Tensor src = make_source(ro.R, ro.C, Fill::kNormal, 1234 + ro.R);
    before_cpu = Tensor::empty({ro.R, ro.C}, DType::kF32, Device::cpu());
    for (int64_t i = 0; i < ro.R * ro.C; ++i) {
      before_cpu.ptr<float>()[i] = 4.0f * bf16_to_f32(src.ptr<const uint16_t>()[i]);
    }
    out_gpu = Tensor::copy_of(before_cpu.view(), Device::cuda(0));
    before_host = to_host_f32(before_cpu.view());
  } else {
    out_gpu = Tensor::empty({ro.R, ro.C}, spec.out, Device::cuda(0));
    fill_bytes(out_gpu.view(), 0xFF);  // NaN garbage: beta = 0 must not read it
  }

  GemmOptions gpu_opt = opt, cpu_opt = opt;
  if (spec.bias) {
    gpu_opt.bias = &bias_gpu.view();
    cpu_opt.bias = &bias_cpu.view();
  }
  const TensorView c_gpu_v = c_gpu.defined() ? c_gpu.view() : TensorView();
  const TensorView c_cpu_v = spec.separate_c ? before_cpu.view() : TensorView();
  if (spec.separate_c) {
    gpu_opt.c = &c_gpu_v;
    cpu_opt.c = &c_cpu_v;
  }
  gemm(ctx, ro.a->gpu(), ro.b->gpu(), out_gpu.view(), gpu_opt);
  g_checked_call = gemm_cuda_last_call();
  ctx.synchronize();
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = to_host_f32(out_gpu.view());
  ASSERT_TRUE(g_checked_call.valid);
  ASSERT_GE(g_checked_call.candidates, 1);
  EXPECT_LT(g_checked_call.algo_index, g_checked_call.candidates);
  const bool bias_separate = spec.bias && !g_checked_call.bias_epilogue;
  if (spec.bias && g_checked_call.fused_dequant) {
    // The fused MX / NVFP4 kernel adds any bias dtype in its epilogue (or its split-K reduction).
    EXPECT_TRUE(g_checked_call.bias_epilogue);
  } else if (spec.bias && spec.expect_bias_epilogue) {
    EXPECT_EQ(g_checked_call.bias_epilogue, *spec.expect_bias_epilogue)
        << "bias added by " << (g_checked_call.bias_epilogue ? "the epilogue" : "the kernel");
  }

  const std::vector<double> ref = gemm_reference_f64(
      ro.a->cpu(), ro.b->cpu(), cpu_opt, spec.beta != 0.0f ? &before_cpu.view() : nullptr);
  const std::vector<double> na = ro.a->canon_norms(ro.ua);
  const std::vector<double> nb = ro.b->canon_norms(ro.ub);
  ASSERT_EQ(int64_t(na.size()), ro.R);
  ASSERT_EQ(int64_t(nb.size()), ro.C);
  const bool fast = rc.backend == GemmBackend::kCublasLtFp8 &&
                    (spec.acc == Fp8Accumulation::kFast ||
                     (spec.acc == Fp8Accumulation::kDefault && role == GemmRole::kFprop));
  const Tolerance tol = tolerance(rc.backend, fast, spec.out, ro.Kc, bias_separate);
  const std::vector<float>* before_p = spec.beta != 0.0f ? &before_host : nullptr;
  const std::vector<float>* bias_p = spec.bias ? &bias_host : nullptr;
  const std::string err = compare(ref, got, ro.R, ro.C, na, nb, tol, opt, before_p, bias_p);
  EXPECT_TRUE(err.empty()) << "GPU vs float64 reference: " << err;

  if (spec.against_cpu_gemm) {
    Context cpu_ctx(Device::cpu());
    Tensor out_cpu = spec.beta != 0.0f && !spec.separate_c
                         ? Tensor::copy_of(before_cpu.view(), Device::cpu())
                         : Tensor::zeros({ro.R, ro.C}, spec.out, Device::cpu());
    gemm(cpu_ctx, ro.a->cpu(), ro.b->cpu(), out_cpu.view(), cpu_opt);
    const std::vector<float> cpu = to_host_f32(out_cpu.view());
    // Both sides are within the model of the reference: allow the sum (plus an f32 sgemm
    // whose accumulation bound is below the GPU's).
    std::vector<double> cpu_as_ref(cpu.begin(), cpu.end());
    const std::string e2 =
        compare(cpu_as_ref, got, ro.R, ro.C, na, nb, tol, opt, before_p, bias_p, 2.0);
    EXPECT_TRUE(e2.empty()) << "GPU vs CPU gemm(): " << e2;
  }
}

struct Problem {
  Operand x, w, dy;
};

Problem make_problem(Context& ctx, const Recipe& rc, int64_t M, int64_t N, int64_t K, Fill fill,
                     uint64_t seed) {
  Problem p;
  p.x = make_operand(ctx, make_source(M, K, fill, seed + 1), rc.x ? &*rc.x : nullptr);
  p.w = make_operand(ctx, make_source(N, K, fill, seed + 2), rc.w ? &*rc.w : nullptr);
  p.dy = make_operand(ctx, make_source(M, N, fill, seed + 3), rc.dy ? &*rc.dy : nullptr);
  return p;
}

constexpr GemmRole kRoles[] = {GemmRole::kFprop, GemmRole::kDgrad, GemmRole::kWgrad};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Sets gemm()'s algorithm selection for a scope, then restores the previous setting.
class AutotuneScope {
 public:
  explicit AutotuneScope(bool on) : prev_(gemm_autotune()) { set_gemm_autotune(on); }
  ~AutotuneScope() { set_gemm_autotune(prev_); }
  AutotuneScope(const AutotuneScope&) = delete;
  AutotuneScope& operator=(const AutotuneScope&) = delete;

 private:
  bool prev_;
};

// One role into a fresh f32 out (beta = 0); the host values and what the backend ran.
std::vector<float> run_f32(Context& ctx, const Roles& ro, GemmCudaLastCall* call) {
  Tensor out = Tensor::empty({ro.R, ro.C}, DType::kF32, Device::cuda(0));
  GemmOptions opt;
  opt.role = ro.role;
  gemm(ctx, ro.a->gpu(), ro.b->gpu(), out.view(), opt);
  *call = gemm_cuda_last_call();
  ctx.synchronize();
  return to_host_f32(out.view());
}

class GpuGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(cuda_device_count(), 0) << "the GPU tests need a CUDA GPU (run them on a GPU host)";
  }
};

// Every backend × role × shape × fill, bf16 output.
TEST_F(GpuGemm, EveryBackendAndRoleMatchesFloat64Reference) {
  Context ctx(Device::cuda(0));
  struct Shape3 {
    int64_t m, n, k;
  };
  const std::vector<Shape3> shapes = {{65, 80, 37},  {1, 48, 64},     {16, 16, 16},   {48, 80, 208},
                                      {32, 96, 160}, {128, 256, 384}, {256, 128, 512}};
  for (const Recipe& rc : recipes()) {
    for (const Shape3& s : shapes) {
      if (s.m % rc.align || s.n % rc.align || s.k % rc.align) continue;
      for (Fill f : {Fill::kNormal, Fill::kHeavyTail, Fill::kCancel, Fill::kTiny, Fill::kZeros}) {
        const Problem p = make_problem(ctx, rc, s.m, s.n, s.k, f, 100 + s.m + s.n + s.k);
        for (GemmRole role : kRoles) {
          check_role(ctx, rc, p.x, p.w, p.dy, s.m, s.n, s.k, role, RunSpec{}, fill_name(f));
        }
      }
    }
  }
}

// A 4096-wide problem per backend: contraction over 4096 in fprop and dgrad, long rows in wgrad.
TEST_F(GpuGemm, EveryBackendAndRoleAt4096) {
  Context ctx(Device::cuda(0));
  const int64_t M = 128, N = 4096, K = 4096;  // M: the FP8 block recipes need 128
  for (const Recipe& rc : recipes()) {
    const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 4096);
    for (GemmRole role : kRoles) {
      check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, RunSpec{}, "normal");
    }
  }
}

// f32 output, alpha, beta accumulation into an f32 buffer, bias (f32 and bf16), and agreement
// with the CPU gemm().
TEST_F(GpuGemm, AlphaBetaBiasF32OutAndCpuAgreement) {
  Context ctx(Device::cuda(0));
  const int64_t M = 128, N = 256, K = 384;
  for (const Recipe& rc : recipes()) {
    const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 77);
    for (GemmRole role : kRoles) {
      RunSpec a;
      a.out = DType::kF32;
      a.alpha = 0.5f;
      a.beta = 0.75f;
      a.bias = true;
      a.against_cpu_gemm = true;
      check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, a, "f32 alpha beta bias");
      RunSpec b;
      b.out = DType::kBF16;
      b.alpha = -2.0f;
      b.bias = true;
      b.against_cpu_gemm = true;
      check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, b, "bf16 alpha bias");
      RunSpec c;
      c.out = DType::kF32;
      c.against_cpu_gemm = true;
      check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, c, "f32");
    }
  }
}

// NaN propagates through every backend; ±inf through the BF16 path. NVFP4 gets NaNs only: an
// infinite global amax is folded into alpha on the GPU (inf · Σ) while the reference multiplies
// per element (inf · 0 = NaN), so the two legitimately differ there.
TEST_F(GpuGemm, NanAndInfPropagate) {
  Context ctx(Device::cuda(0));
  const int64_t M = 64, N = 128, K = 256;
  for (const Recipe& rc : recipes()) {
    const bool nvfp4 = rc.x && (rc.x->mode == ScalingMode::kNVFP4_1x16);
    for (Fill f : {Fill::kNan, Fill::kNanInf}) {
      if (nvfp4 && f == Fill::kNanInf) continue;
      const Problem p = make_problem(ctx, rc, M, N, K, f, 555);
      for (GemmRole role : kRoles) {
        for (DType out : {DType::kBF16, DType::kF32}) {
          RunSpec s;
          s.out = out;
          check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, s, fill_name(f));
        }
      }
    }
  }
}

// One copy for the dequantization kernels: a [rows, cols] payload of type t in `layout`.
struct DequantCase {
  DType t;
  gemm_kernels::DequantScales layout;
  int64_t rows, cols;
};

// Random code bytes and block scales of such a copy: finite scales in a range whose products stay
// normal in bf16, and a few NaN scales (UE4M3 0x7F, E8M0 0xFF).
void random_copy(std::mt19937& rng, const DequantCase& c, std::vector<uint8_t>& codes,
                 std::vector<uint8_t>& scales) {
  const bool nv = c.layout == gemm_kernels::DequantScales::kNvfp4;
  const int64_t n = c.rows * c.cols;
  codes.assign(static_cast<size_t>(c.t == DType::kE2M1 ? n / 2 : n), 0);
  scales.assign(static_cast<size_t>(nv ? c.rows * (c.cols / 16) : c.rows * (c.cols / 32)), 0);
  for (auto& b : codes) b = static_cast<uint8_t>(rng());
  for (auto& b : scales) {
    b = nv ? static_cast<uint8_t>(rng() % 0x7F) : static_cast<uint8_t>(100 + rng() % 50);
    if (rng() % 97 == 0) b = nv ? 0x7F : 0xFF;
  }
}

// decode(code) · block scale of element (r, k) of such a copy, as one fp32 product.
float host_dequant(const DequantCase& c, const std::vector<uint8_t>& codes,
                   const std::vector<uint8_t>& scales, int64_t r, int64_t k) {
  const int64_t i = r * c.cols + k;
  const uint32_t code = c.t == DType::kE2M1 ? (codes[i / 2] >> (4 * (i % 2))) & 0xFu : codes[i];
  const float f = c.layout == gemm_kernels::DequantScales::kNvfp4
                      ? decode(DType::kUE4M3, scales[r * (c.cols / 16) + k / 16])
                      : decode_e8m0(scales[r * (c.cols / 32) + k / 32]);
  return decode(c.t, code) * f;
}

// The emulated path's dequantization, every layout and payload, against a host decode of each
// element: both the 16-element-chunk kernel (aligned buffers) and the general one (the same
// buffers one 16-byte step in, so misaligned for the former) give these bits.
TEST_F(GpuGemm, DequantToBf16MatchesHostDecodeBitForBit) {
  using gemm_kernels::DequantScales;
  const DequantCase cases[] = {{DType::kE2M1, DequantScales::kNvfp4, 96, 4096},
                               {DType::kE2M1, DequantScales::kNvfp4, 3, 48},
                               {DType::kE4M3, DequantScales::kMxRowwise, 64, 1024},
                               {DType::kE5M2, DequantScales::kMxRowwise, 5, 96},
                               {DType::kE2M1, DequantScales::kMxRowwise, 33, 64}};
  std::mt19937 rng(17);
  for (const DequantCase& c : cases) {
    SCOPED_TRACE(fmt::format("{} layout {} {}x{}", dtype_name(c.t), int(c.layout), c.rows, c.cols));
    std::vector<uint8_t> codes, scales;
    random_copy(rng, c, codes, scales);
    const int64_t n = c.rows * c.cols;
    const int64_t code_bytes = int64_t(codes.size()), n_scales = int64_t(scales.size());
    std::vector<uint16_t> want(n);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t k = 0; k < c.cols; ++k) {
        want[r * c.cols + k] = f32_to_bf16_rn(host_dequant(c, codes, scales, r, k));
      }
    }
    // Device buffers with room in front: codes and output at offset 0 (16-byte aligned: the
    // chunk kernel), then codes 8 bytes and output 8 elements in (the general kernel).
    uint8_t *dcodes = nullptr, *dscales = nullptr;
    uint16_t* dout = nullptr;
    ASSERT_EQ(cudaMalloc(&dcodes, code_bytes + 32), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dscales, n_scales + 32), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, (n + 16) * 2), cudaSuccess);
    for (int shifted = 0; shifted < 2; ++shifted) {
      SCOPED_TRACE(shifted ? "general kernel" : "chunk kernel");
      const int64_t co = shifted ? 8 : 0, oo = shifted ? 8 : 0;  // bytes / bf16 elements
      ASSERT_EQ(cudaMemcpy(dcodes + co, codes.data(), code_bytes, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dscales, scales.data(), n_scales, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemset(dout, 0, (n + 16) * 2), cudaSuccess);
      gemm_kernels::dequant_to_bf16(dcodes + co, c.t, c.rows, c.cols, dscales, c.layout, dout + oo,
                                    nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint16_t> got(n);
      ASSERT_EQ(cudaMemcpy(got.data(), dout + oo, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool both_nan = std::isnan(bf16_to_f32(got[i])) && std::isnan(bf16_to_f32(want[i]));
        if (got[i] != want[i] && !both_nan) {
          if (bad++ == 0) {
            ADD_FAILURE() << "element " << i << " (row " << i / c.cols << ", col " << i % c.cols
                          << "): got 0x" << std::hex << got[i] << ", want 0x" << want[i];
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
    cudaFree(dcodes);
    cudaFree(dscales);
    cudaFree(dout);
  }
}

// The fused kernel's B' copy (dequant_b_permuted) against a host decode of every element: NVFP4
// as f16 · 2^-14 (exact, subnormal scales included), MX as bf16 (E4M3 / E5M2, NaN codes
// included), each at its permuted position k = 64·kb + 16·c + 4·kk + j → 64·kb + 16·kk + 2·c +
// (j & 1) + 8·(j >> 1); shapes whose last block or warp is partial.
TEST_F(GpuGemm, DequantBPermutedMatchesHostDecodeBitForBit) {
  using gemm_kernels::DequantScales;
  using gemm_kernels::FusedKind;
  const DequantCase cases[] = {{DType::kE2M1, DequantScales::kNvfp4, 96, 4096},
                               {DType::kE2M1, DequantScales::kNvfp4, 5, 192},
                               {DType::kE4M3, DequantScales::kMxRowwise, 64, 1024},
                               {DType::kE5M2, DequantScales::kMxRowwise, 3, 128},
                               {DType::kE4M3, DequantScales::kMxRowwise, 7, 192}};
  // f16 bits → value (exact).
  const auto f16_value = [](uint16_t h) {
    const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const float mag = e == 0    ? std::ldexp(float(m), -24)
                      : e == 31 ? (m != 0 ? NAN : INFINITY)
                                : std::ldexp(float(1024 + m), e - 25);
    return (h & 0x8000) != 0 ? -mag : mag;
  };
  std::mt19937 rng(23);
  for (const DequantCase& c : cases) {
    SCOPED_TRACE(fmt::format("{} layout {} {}x{}", dtype_name(c.t), int(c.layout), c.rows, c.cols));
    const bool nv = c.layout == DequantScales::kNvfp4;
    std::vector<uint8_t> codes, scales;
    random_copy(rng, c, codes, scales);
    const int64_t n = c.rows * c.cols;
    const int64_t code_bytes = int64_t(codes.size()), n_scales = int64_t(scales.size());
    // want[r · cols + permuted k] as a value (NVFP4: times 2^-14).
    std::vector<float> want(n);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t k = 0; k < c.cols; ++k) {
        const float p = host_dequant(c, codes, scales, r, k);
        const float v = nv ? p * std::ldexp(1.0f, -14) : bf16_to_f32(f32_to_bf16_rn(p));
        const int64_t kb = k / 64, cc = (k / 16) % 4, kk = (k / 4) % 4, j = k % 4;
        want[r * c.cols + 64 * kb + 16 * kk + 2 * cc + (j & 1) + 8 * (j >> 1)] = v;
      }
    }
    uint8_t *dcodes = nullptr, *dscales = nullptr;
    uint16_t* dout = nullptr;
    ASSERT_EQ(cudaMalloc(&dcodes, code_bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dscales, n_scales), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, n * 2), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dcodes, codes.data(), code_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dscales, scales.data(), n_scales, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dout, 0xFF, n * 2), cudaSuccess);
    const gemm_kernels::DequantJob job{dcodes, c.t, c.rows, c.cols, dscales, c.layout, dout};
    const FusedKind kind = nv ? FusedKind::kNvfp4 : FusedKind::kE4M3;
    gemm_kernels::dequant_b_permuted(job, kind, nullptr, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> got(n);
    ASSERT_EQ(cudaMemcpy(got.data(), dout, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float g = nv ? f16_value(got[i]) : bf16_to_f32(got[i]);
      const bool same = std::isnan(g) ? std::isnan(want[i])
                                      : (g == want[i] && std::signbit(g) == std::signbit(want[i]));
      if (!same && bad++ == 0) {
        ADD_FAILURE() << "position " << i << " (row " << i / c.cols << ", col " << i % c.cols
                      << "): got 0x" << std::hex << got[i] << std::dec << " = " << g << ", want "
                      << want[i];
      }
    }
    EXPECT_EQ(bad, 0);
    cudaFree(dcodes);
    cudaFree(dscales);
    cudaFree(dout);
  }
}

// A NaN block scale (E8M0 0xFF, UE4M3 0x7F) makes its rows NaN on the emulated path.
TEST_F(GpuGemm, NanBlockScaleGivesNan) {
  Context ctx(Device::cuda(0));
  const int64_t M = 64, N = 96, K = 128;
  for (const Recipe& rc : recipes()) {
    if (rc.backend != GemmBackend::kEmulatedBf16) continue;
    Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 31);
    const uint8_t nan_code = rc.x->mode == ScalingMode::kMX1x32 ? 0xFF : 0x7F;
    // Poison the first scale byte of every copy of X.
    for (Tensor* t : {&p.x.q_gpu.rowwise_scale_inv, &p.x.q_gpu.columnwise_scale_inv}) {
      ASSERT_EQ(cudaMemcpy(t->data(), &nan_code, 1, cudaMemcpyHostToDevice), cudaSuccess);
    }
    p.x.q_cpu = copy_to_cpu(p.x.q_gpu);
    for (GemmRole role : {GemmRole::kFprop, GemmRole::kWgrad}) {
      const Roles ro = role_operands(role, p.x, p.w, p.dy, M, N, K);
      Tensor out = Tensor::empty({ro.R, ro.C}, DType::kF32, Device::cuda(0));
      GemmOptions opt;
      opt.role = role;
      gemm(ctx, ro.a->gpu(), ro.b->gpu(), out.view(), opt);
      ctx.synchronize();
      const std::vector<float> got = to_host_f32(out.view());
      const std::vector<double> ref = gemm_reference_f64(ro.a->cpu(), ro.b->cpu(), opt);
      int64_t nan_ref = 0, mismatched = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        nan_ref += std::isnan(ref[i]);
        mismatched += std::isnan(ref[i]) != std::isnan(got[i]);
      }
      SCOPED_TRACE(fmt::format("{} {}", rc.name, gemm_role_name(role)));
      EXPECT_GT(nan_ref, 0) << "the poisoned scale produced no NaN in the reference";
      EXPECT_EQ(mismatched, 0) << "NaN pattern differs from the reference";
    }
  }
}

// The HYBRID pairings run in both orders (E4M3 × E4M3, E5M2 × E4M3, E4M3 × E5M2) per-tensor and
// block-scaled; E5M2 × E5M2 is a UserError raised before cuBLASLt is called.
TEST_F(GpuGemm, HybridPairingsAndE5M2TimesE5M2Rejected) {
  Context ctx(Device::cuda(0));
  const int64_t M = 128, N = 256, K = 384;
  struct Pair {
    DType x, w;
  };
  for (bool block : {false, true}) {
    for (Pair pr : {Pair{DType::kE4M3, DType::kE4M3}, Pair{DType::kE5M2, DType::kE4M3},
                    Pair{DType::kE4M3, DType::kE5M2}}) {
      Recipe rc;
      rc.name = fmt::format("{} x={} w={}", block ? "fp8_block" : "fp8", dtype_name(pr.x),
                            dtype_name(pr.w));
      rc.backend = block ? GemmBackend::kCublasLtFp8Block : GemmBackend::kCublasLtFp8;
      rc.x = block ? QuantConfig::fp8_block_1x128(pr.x) : QuantConfig::fp8_current(pr.x);
      rc.w = block ? QuantConfig::fp8_block_128x128(pr.w) : QuantConfig::fp8_current(pr.w);
      rc.dy = block ? QuantConfig::fp8_block_1x128(DType::kE4M3)
                    : QuantConfig::fp8_current(DType::kE4M3);
      rc.align = block ? 128 : 16;
      const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 900);
      for (GemmRole role : kRoles) {
        check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, RunSpec{}, "hybrid");
      }
    }
    // E5M2 × E5M2: X and W both E5M2 (fprop), dY and X both E5M2 (wgrad).
    Recipe rc;
    rc.name = "e5m2xe5m2";
    rc.backend = block ? GemmBackend::kCublasLtFp8Block : GemmBackend::kCublasLtFp8;
    rc.align = block ? 128 : 16;
    rc.x =
        block ? QuantConfig::fp8_block_1x128(DType::kE5M2) : QuantConfig::fp8_current(DType::kE5M2);
    rc.w = block ? QuantConfig::fp8_block_128x128(DType::kE5M2)
                 : QuantConfig::fp8_current(DType::kE5M2);
    rc.dy = rc.x;
    const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 901);
    for (GemmRole role : {GemmRole::kFprop, GemmRole::kWgrad}) {
      const Roles ro = role_operands(role, p.x, p.w, p.dy, M, N, K);
      Tensor out = Tensor::empty({ro.R, ro.C}, DType::kBF16, Device::cuda(0));
      GemmOptions opt;
      opt.role = role;
      SCOPED_TRACE(fmt::format("{} {}", block ? "block" : "per-tensor", gemm_role_name(role)));
      try {
        gemm(ctx, ro.a->gpu(), ro.b->gpu(), out.view(), opt);
        ADD_FAILURE() << "E5M2 × E5M2 was accepted";
      } catch (const UserError& e) {
        // Rejected by the dtype check, not by a failing cuBLASLt call.
        EXPECT_NE(lower(e.what()).find("e5m2"), std::string::npos) << e.what();
        EXPECT_EQ(lower(e.what()).find("cublaslt offers no algorithm"), std::string::npos)
            << e.what();
      }
    }
  }
}

// Fast accumulation (per-tensor FP8) stays within its measured-derived bound at K = 16384; split
// accumulation within the tighter one.
TEST_F(GpuGemm, Fp8FastAndSplitAccumulationAtLongK) {
  Context ctx(Device::cuda(0));
  const int64_t M = 64, N = 64, K = 16384;
  const Recipe rc = recipes()[1];  // fp8_hybrid
  ASSERT_EQ(rc.name, "fp8_hybrid");
  const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 16384);
  for (Fp8Accumulation acc : {Fp8Accumulation::kFast, Fp8Accumulation::kSplit}) {
    RunSpec s;
    s.out = DType::kF32;
    s.acc = acc;
    check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, GemmRole::kFprop, s,
               acc == Fp8Accumulation::kFast ? "fast" : "split");
  }
}

// Two 128×128-block operands are refused (cuBLASLt has no BLK128 × BLK128 kernel).
TEST_F(GpuGemm, TwoBlock128x128OperandsRejected) {
  Context ctx(Device::cuda(0));
  const int64_t M = 128, N = 256, K = 384;
  Recipe rc;
  rc.name = "blk_x_blk";
  rc.backend = GemmBackend::kCublasLtFp8Block;
  rc.align = 128;
  rc.x = QuantConfig::fp8_block_128x128(DType::kE4M3);
  rc.w = QuantConfig::fp8_block_128x128(DType::kE4M3);
  rc.dy = QuantConfig::fp8_block_1x128(DType::kE4M3);
  const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 902);
  Tensor out = Tensor::empty({M, N}, DType::kBF16, Device::cuda(0));
  EXPECT_THROW(gemm(ctx, p.x.gpu(), p.w.gpu(), out.view(), GemmOptions{}), UserError);
}

// Repeated calls reuse the cached plans and give identical bits (same algorithm, same stream).
TEST_F(GpuGemm, RepeatedCallsAreBitIdentical) {
  Context ctx(Device::cuda(0));
  const int64_t M = 128, N = 256, K = 384;
  for (const Recipe& rc : recipes()) {
    const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 5);
    for (GemmRole role : kRoles) {
      const Roles ro = role_operands(role, p.x, p.w, p.dy, M, N, K);
      Tensor o1 = Tensor::empty({ro.R, ro.C}, DType::kF32, Device::cuda(0));
      Tensor o2 = Tensor::empty({ro.R, ro.C}, DType::kF32, Device::cuda(0));
      GemmOptions opt;
      opt.role = role;
      gemm(ctx, ro.a->gpu(), ro.b->gpu(), o1.view(), opt);
      gemm(ctx, ro.a->gpu(), ro.b->gpu(), o2.view(), opt);
      ctx.synchronize();
      const std::vector<float> a = to_host_f32(o1.view()), b = to_host_f32(o2.view());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << rc.name << " " << gemm_role_name(role);
    }
  }
}

// GemmOptions::bias in every role, backend and (out, bias) dtype pair, with alpha and beta,
// against the float64 reference. Where cuBLASLt's epilogue adds the bias the value is rounded
// once and checked with the single-rounding bound; the separate kernel gets the two-rounding
// one. The epilogue is required where cuBLASLt documents the pair (the bias in out's dtype with
// bf16 operands, bf16 bias and out with FP8 operands) and must not be tried where it does not
// take the bias dtype; elsewhere (FP8 with an f32 out, the block-scaled modes) either path is
// right and the test prints which one ran. A single-row out (R = 1) is included.
TEST_F(GpuGemm, BiasEveryBackendRoleAndDtype) {
  Context ctx(Device::cuda(0));
  struct Case {
    DType out, bias;
    float beta;
  };
  const Case cases[] = {{DType::kBF16, DType::kBF16, 0.0f}, {DType::kBF16, DType::kF32, 0.0f},
                        {DType::kF32, DType::kF32, 0.0f},   {DType::kF32, DType::kBF16, 0.0f},
                        {DType::kF32, DType::kF32, 0.5f},   {DType::kF32, DType::kBF16, 0.5f}};
  struct Shape3 {
    int64_t m, n, k;
  };
  for (const Recipe& rc : recipes()) {
    for (const Shape3& sh : {Shape3{128, 256, 384}, Shape3{1, 256, 384}}) {
      const bool one_row = sh.m == 1;
      // R = 1 (one token) with bf16 and per-tensor FP8 operands; the block recipes quantize
      // blocks along M, and FP8 wgrad contracts over M (a multiple of 16).
      if (one_row && rc.backend != GemmBackend::kCublasLtBf16 &&
          rc.backend != GemmBackend::kCublasLtFp8) {
        continue;
      }
      const Problem p = make_problem(ctx, rc, sh.m, sh.n, sh.k, Fill::kNormal, 321 + sh.m);
      std::string fused;
      for (GemmRole role : kRoles) {
        if (one_row && rc.align > 1 && role == GemmRole::kWgrad) continue;
        for (const Case& c : cases) {
          RunSpec s;
          s.out = c.out;
          s.alpha = 0.75f;
          s.beta = c.beta;
          s.bias = true;
          s.bias_dtype = c.bias;
          s.against_cpu_gemm = true;
          const bool fp8 = is_fp8(rc.backend);
          if (!fp8 && c.bias != c.out) s.expect_bias_epilogue = false;
          if (fp8 && c.bias == DType::kF32) s.expect_bias_epilogue = false;
          if (!fp8 && c.bias == c.out) s.expect_bias_epilogue = true;
          if (rc.backend == GemmBackend::kCublasLtFp8 && c.bias == DType::kBF16 &&
              c.out == DType::kBF16) {
            s.expect_bias_epilogue = true;
          }
          check_role(ctx, rc, p.x, p.w, p.dy, sh.m, sh.n, sh.k, role, s, "bias");
          if (c.beta == 0.0f) {
            fused += fmt::format(" {}:{}+{}={}", gemm_role_name(role), dtype_name(c.out),
                                 dtype_name(c.bias),
                                 g_checked_call.fused_dequant   ? "fused"
                                 : g_checked_call.bias_epilogue ? "epilogue"
                                                                : "kernel");
          }
        }
      }
      std::printf("bias %-18s M=%-4lld%s\n", rc.name.c_str(), static_cast<long long>(sh.m),
                  fused.c_str());
    }
  }
}

// The beta term from a separate c (GemmOptions::c): a residual added in the epilogue of a bf16
// (or f32) out, every backend and role, out never read.
TEST_F(GpuGemm, SeparateCEveryBackendRoleAndDtype) {
  Context ctx(Device::cuda(0));
  for (const Recipe& rc : recipes()) {
    const Problem p = make_problem(ctx, rc, 128, 256, 384, Fill::kNormal, 777);
    for (GemmRole role : kRoles) {
      for (DType out : {DType::kBF16, DType::kF32}) {
        for (bool bias : {false, true}) {
          RunSpec s;
          s.out = out;
          s.alpha = 1.0f;
          s.beta = 1.0f;
          s.bias = bias;
          s.separate_c = true;
          s.against_cpu_gemm = true;
          check_role(ctx, rc, p.x, p.w, p.dy, 128, 256, 384, role, s, "separate c");
        }
      }
    }
  }
}

// With autotuning on, the first call of a shape times the candidates into a scratch output,
// never into `out`: a first call with beta ≠ 0 must still read out's previous values. The
// result stays within the error bound, and later calls rerun the chosen algorithm bit for bit.
TEST_F(GpuGemm, AutotunedPlansMatchReferenceAndRepeatBitIdentically) {
  const AutotuneScope on(true);
  Context ctx(Device::cuda(0));
  const int64_t M = 384, N = 640, K = 512;  // no other test uses these: the plans start here
  for (const Recipe& rc : recipes()) {
    const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 2024);
    for (GemmRole role : kRoles) {
      RunSpec first;
      first.out = DType::kF32;
      first.alpha = 1.5f;
      first.beta = 0.75f;
      check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, first, "first call, beta");
      const GemmCudaLastCall tuned = g_checked_call;
      EXPECT_EQ(tuned.autotuned, tuned.candidates > 1) << rc.name << " " << gemm_role_name(role);
      RunSpec bf16;
      bf16.bias = true;
      check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, bf16, "bf16 out, bias");

      const Roles ro = role_operands(role, p.x, p.w, p.dy, M, N, K);
      GemmCudaLastCall c1, c2;
      const std::vector<float> a = run_f32(ctx, ro, &c1);
      const std::vector<float> b = run_f32(ctx, ro, &c2);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << rc.name << " " << gemm_role_name(role);
      EXPECT_EQ(c1.algo_index, tuned.algo_index) << "the f32 plan changed its algorithm";
      EXPECT_EQ(c2.algo_index, tuned.algo_index);
      std::printf("autotune %-18s %s: algo #%d of %d\n", rc.name.c_str(),
                  gemm_role_name(role).data(), tuned.algo_index + 1, tuned.candidates);
    }
  }
}

// With autotuning off, gemm() runs cuBLASLt's first heuristic choice, untimed, and is correct;
// turning it on times the plan, and off again returns to the first choice's exact bits.
TEST_F(GpuGemm, AutotuneOffRunsTheFirstHeuristicChoice) {
  Context ctx(Device::cuda(0));
  const int64_t M = 640, N = 384, K = 768;  // no other test uses these
  for (const Recipe& rc : recipes()) {
    const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 77);
    for (GemmRole role : kRoles) {
      SCOPED_TRACE(fmt::format("{} {}", rc.name, gemm_role_name(role)));
      const Roles ro = role_operands(role, p.x, p.w, p.dy, M, N, K);
      std::vector<float> off_bits;
      {
        const AutotuneScope off(false);
        RunSpec s;
        s.out = DType::kF32;
        check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, s, "autotune off");
        EXPECT_EQ(g_checked_call.algo_index, 0);
        EXPECT_FALSE(g_checked_call.autotuned);
        GemmCudaLastCall c;
        off_bits = run_f32(ctx, ro, &c);
      }
      {
        const AutotuneScope on(true);
        RunSpec s;
        s.out = DType::kF32;
        check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, s, "autotune on");
        EXPECT_EQ(g_checked_call.autotuned, g_checked_call.candidates > 1);
      }
      const AutotuneScope off(false);
      GemmCudaLastCall c;
      const std::vector<float> again = run_f32(ctx, ro, &c);
      EXPECT_EQ(c.algo_index, 0);
      EXPECT_EQ(std::memcmp(off_bits.data(), again.data(), again.size() * sizeof(float)), 0);
    }
  }
}

// Inside a CUDA graph capture nothing may synchronise: the captured GEMM runs the first
// heuristic choice untimed, the graph replays it correctly, and the first call outside the
// capture times the candidates.
TEST_F(GpuGemm, AutotuneWaitsForTheEndOfAGraphCapture) {
  const AutotuneScope on(true);
  Context ctx(Device::cuda(0));
  const int64_t M = 512, N = 704, K = 320;  // no other test uses these
  const Recipe rc = recipes()[0];
  ASSERT_EQ(rc.name, "bf16");
  const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 88);
  const Roles ro = role_operands(GemmRole::kFprop, p.x, p.w, p.dy, M, N, K);
  // The context's workspace grows outside the capture (a call of another shape).
  GemmCudaLastCall warm;
  run_f32(ctx, role_operands(GemmRole::kDgrad, p.x, p.w, p.dy, M, N, K), &warm);

  Tensor out = Tensor::empty({ro.R, ro.C}, DType::kF32, Device::cuda(0));
  fill_bytes(out.view(), 0xFF);
  cudaStream_t stream = ctx.stream();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  GemmCudaLastCall captured;
  try {
    gemm(ctx, ro.a->gpu(), ro.b->gpu(), out.view(), GemmOptions{});
    captured = gemm_cuda_last_call();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "gemm() inside a capture threw: " << e.what();
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_TRUE(captured.valid);
  EXPECT_EQ(captured.algo_index, 0);
  EXPECT_FALSE(captured.autotuned);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ctx.synchronize();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  const std::vector<float> got = to_host_f32(out.view());
  GemmOptions opt;
  const std::vector<double> ref = gemm_reference_f64(ro.a->cpu(), ro.b->cpu(), opt);
  const Tolerance tol = tolerance(rc.backend, false, DType::kF32, K, false);
  const std::string err = compare(ref, got, ro.R, ro.C, ro.a->canon_norms(ro.ua),
                                  ro.b->canon_norms(ro.ub), tol, opt, nullptr, nullptr);
  EXPECT_TRUE(err.empty()) << "replayed graph vs float64 reference: " << err;

  RunSpec s;
  s.out = DType::kF32;
  check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, GemmRole::kFprop, s, "after the capture");
  EXPECT_EQ(g_checked_call.autotuned, g_checked_call.candidates > 1);
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// Sets the fused-dequantization switch (and the grid cap, and the k-partition: 0 the model's,
// 1 none, n parts) for a scope, then restores them.
class FusedScope {
 public:
  explicit FusedScope(FusedDequant mode, int max_ctas = 0, int parts = 0)
      : prev_(gemm_fused_dequant()) {
    set_gemm_fused_dequant(mode);
    set_gemm_fused_max_ctas(max_ctas);
    set_gemm_fused_parts(parts);
  }
  ~FusedScope() {
    set_gemm_fused_dequant(prev_);
    set_gemm_fused_max_ctas(0);
    set_gemm_fused_parts(0);
  }
  FusedScope(const FusedScope&) = delete;
  FusedScope& operator=(const FusedScope&) = delete;

 private:
  FusedDequant prev_;
};

// Whether gemm() should take the fused kernel for this recipe and role (fused_kind and
// fused_gemm_shape_ok in src/gemm).
bool fused_applies(const Recipe& rc, GemmRole role, int64_t M, int64_t N, int64_t K) {
  const Roles ro = role_operands(role, Operand{}, Operand{}, Operand{}, M, N, K);
  const bool nv = rc.name == "nvfp4";
  if (!nv && rc.name != "mxfp8_hybrid") return false;
  return ro.R % 128 == 0 && ro.C % 256 == 0 && ro.Kc % (nv ? 64 : 128) == 0;
}

Recipe recipe_named(const std::string& name) {
  for (const Recipe& r : recipes()) {
    if (r.name == name) return r;
  }
  ADD_FAILURE() << "no recipe " << name;
  return recipes().front();
}

// The sm_100 block-scaled backend (cuBLASLt VEC32_UE8M0 / VEC16_UE4M3 with the swizzled scales)
// forced on MXFP8 and NVFP4 operands: before sm_100 cuBLASLt has no algorithm and the call is a
// clear UserError (the scales were swizzled on the way, so that much of the path runs here); on
// sm_100+ it must agree with the unfused emulated path of the same canonical problem (the fused
// kernel is sm_90a code) up to fp32 summation order.
TEST_F(GpuGemm, BlockScaledBackendRunsOrIsRefusedClearly) {
  Context ctx(Device::cuda(0));
  const int64_t M = 256, N = 256, K = 512;
  for (const char* name : {"nvfp4", "mxfp8_hybrid"}) {
    SCOPED_TRACE(name);
    const Recipe rc = recipe_named(name);
    const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 77);
    GemmOptions opt;
    opt.role = GemmRole::kFprop;
    Tensor emulated = Tensor::empty({M, N}, DType::kF32, Device::cuda(0));
    Tensor native = Tensor::empty({M, N}, DType::kF32, Device::cuda(0));
    CanonGemm g = canonicalize(ctx, p.x.gpu(), p.w.gpu(), emulated.view(), opt);
    g.backend = GemmBackend::kEmulatedBf16;
    {
      FusedScope unfused(FusedDequant::kOff);  // the fused kernel is sm_90a only
      gemm_cuda(ctx, g, emulated.view(), opt);
    }
    g.backend = GemmBackend::kCublasLtBlockScaled;
    if (emulated_on_this_gpu()) {
      try {
        gemm_cuda(ctx, g, native.view(), opt);
        ADD_FAILURE() << "cuBLASLt ran a block-scaled GEMM before sm_100";
      } catch (const std::exception& e) {
        EXPECT_NE(dynamic_cast<const UserError*>(&e), nullptr) << e.what();
        EXPECT_NE(std::string(e.what()).find("no algorithm"), std::string::npos) << e.what();
      }
      continue;
    }
    gemm_cuda(ctx, g, native.view(), opt);
    ctx.synchronize();
    const Tensor a = Tensor::copy_of(emulated.view(), Device::cpu());
    const Tensor b = Tensor::copy_of(native.view(), Device::cpu());
    double scale = 0.0, worst = 0.0;
    for (int64_t i = 0; i < M * N; ++i)
      scale = std::max(scale, std::fabs(double(a.ptr<float>()[i])));
    for (int64_t i = 0; i < M * N; ++i) {
      worst = std::max(worst, std::fabs(double(a.ptr<float>()[i]) - double(b.ptr<float>()[i])));
    }
    EXPECT_LE(worst, 1e-4 * scale) << "block-scaled against emulated, max |out| " << scale;
  }
}

// The fused kernel against the float64 reference: NVFP4 and MXFP8, every role where it applies
// (the others run the unfused path and are checked alike), every fill; an odd number of k-steps;
// a grid capped at 2 CTAs so that each walks several tiles (or parts) through the ring; the
// k-partition as its model picks it (these small problems: equal splits of every tile), none,
// and forced counts that cut each column's line of row tiles unevenly (k_partition.h
// valid_parts: 6 → 3 parts per column over 2 row tiles at 256 × 512 × 1280 fprop, so that pieces
// end and begin mid-tile beside another column's; 8 → 4 per column over 3 row tiles on a grid
// of 2).
TEST_F(GpuGemm, FusedDequantGemmMatchesFloat64Reference) {
  if (!emulated_on_this_gpu()) GTEST_SKIP() << "sm_100+: MX / NVFP4 are not emulated";
  Context ctx(Device::cuda(0));
  struct Case {
    int64_t m, n, k;
    int max_ctas, parts;
  };
  const std::vector<Case> cases = {
      {256, 512, 768, 0, 0},  {384, 256, 1280, 0, 0}, {128, 256, 576, 0, 1}, {512, 768, 256, 2, 1},
      {256, 512, 1280, 0, 6}, {512, 768, 256, 2, 0},  {384, 512, 640, 2, 8}};
  for (const char* name : {"nvfp4", "mxfp8_hybrid"}) {
    const Recipe rc = recipe_named(name);
    for (const Case& cs : cases) {
      FusedScope fused(FusedDequant::kOn, cs.max_ctas, cs.parts);
      for (Fill f : {Fill::kNormal, Fill::kHeavyTail, Fill::kCancel, Fill::kTiny, Fill::kZeros}) {
        const Problem p = make_problem(ctx, rc, cs.m, cs.n, cs.k, f, 300 + cs.m + cs.k);
        for (GemmRole role : kRoles) {
          check_role(ctx, rc, p.x, p.w, p.dy, cs.m, cs.n, cs.k, role, RunSpec{}, fill_name(f));
          EXPECT_EQ(g_checked_call.fused_dequant, fused_applies(rc, role, cs.m, cs.n, cs.k))
              << name << " " << gemm_role_name(role) << " " << cs.m << "x" << cs.n << "x" << cs.k;
          // Wgrads wider than tall (R = n < C = k) run transposed when cut along k (forced here;
          // the model may also keep whole tiles for these small problems).
          if (role == GemmRole::kWgrad && cs.parts > 1 && g_checked_call.fused_dequant) {
            EXPECT_EQ(g_checked_call.fused_transposed,
                      cs.k > cs.n && cs.k % 128 == 0 && cs.n % 256 == 0)
                << cs.m << "x" << cs.n << "x" << cs.k;
          }
        }
      }
    }
  }
  // The default (kAuto) takes NVFP4 with outputs up to 2048 wide (wider ones only with a long
  // contraction and a full GPU of tiles), and MX with outputs up to 2048 wide over a contraction
  // at least as long.
  FusedScope automatic(FusedDequant::kAuto);
  for (const char* name : {"nvfp4", "mxfp8_hybrid"}) {
    const Recipe rc = recipe_named(name);
    const bool nv = rc.name == "nvfp4";
    for (int64_t n : {512, 4352}) {
      const Problem p = make_problem(ctx, rc, 256, n, 256, Fill::kNormal, 5);
      check_role(ctx, rc, p.x, p.w, p.dy, 256, n, 256, GemmRole::kFprop, RunSpec{}, "auto");
      EXPECT_EQ(g_checked_call.fused_dequant, nv && n <= 2048) << name << " " << n;
    }
    // fprop: R 256, C 512, Kc 1024 / 512; dgrad: R 256, C 1024 / 512, Kc 512.
    for (int64_t k : {1024, 512}) {
      const Problem p = make_problem(ctx, rc, 256, 512, k, Fill::kNormal, 6);
      check_role(ctx, rc, p.x, p.w, p.dy, 256, 512, k, GemmRole::kFprop, RunSpec{}, "auto");
      EXPECT_TRUE(g_checked_call.fused_dequant) << name << " fprop k " << k;
      check_role(ctx, rc, p.x, p.w, p.dy, 256, 512, k, GemmRole::kDgrad, RunSpec{}, "auto");
      EXPECT_EQ(g_checked_call.fused_dequant, nv || k == 512) << name << " dgrad k " << k;
    }
    // dgrad with a longer contraction than the output (R 256, C 512, Kc 1024): fused for both;
    // fprop 2560 wide over K 3072 (C > 2048): NVFP4 no (4096-wide needs K >= 4096 and a full
    // GPU), MX no.
    {
      const Problem p = make_problem(ctx, rc, 256, 1024, 512, Fill::kNormal, 7);
      check_role(ctx, rc, p.x, p.w, p.dy, 256, 1024, 512, GemmRole::kDgrad, RunSpec{}, "auto");
      EXPECT_TRUE(g_checked_call.fused_dequant) << name << " dgrad 256x1024x512";
      const Problem q = make_problem(ctx, rc, 256, 2560, 3072, Fill::kNormal, 8);
      check_role(ctx, rc, q.x, q.w, q.dy, 256, 2560, 3072, GemmRole::kFprop, RunSpec{}, "auto");
      EXPECT_FALSE(g_checked_call.fused_dequant) << name << " fprop 256x2560x3072";
    }
  }
}

// The default rule's second branch (try_fused_emulated): NVFP4 outputs 2049–4096 wide take the
// fused kernel only with K >= 4096 and at least one tile per SM (no split-K); the values do not
// matter here (the tests above check the numbers), only which path ran.
// kAFirst (the fused kernel sends A''s first five stages before it waits for B''s copy, their B'
// panels after it) at whole tiles into bf16 with a small B' on a grid of two CTAs: fewer k-steps
// than stages (K 128: 2 steps, 2 tiles per CTA), deferred steps that span three tiles (K 256),
// more steps than stages (K 384); fprop and dgrad against the float64 reference.
TEST_F(GpuGemm, FusedAFirstMatchesFloat64Reference) {
  if (!emulated_on_this_gpu()) GTEST_SKIP() << "sm_100+: MX / NVFP4 are not emulated";
  Context ctx(Device::cuda(0));
  struct Shape {
    int64_t m, n, k;
  };
  for (const char* name : {"nvfp4", "mxfp8_hybrid"}) {
    const Recipe rc = recipe_named(name);
    for (const Shape& sh : {Shape{512, 256, 128}, Shape{768, 256, 256}, Shape{512, 256, 384}}) {
      FusedScope fused(FusedDequant::kOn, 2, 1);
      for (Fill f : {Fill::kNormal, Fill::kHeavyTail, Fill::kZeros}) {
        const Problem p = make_problem(ctx, rc, sh.m, sh.n, sh.k, f, 900 + sh.m + sh.k);
        for (GemmRole role : {GemmRole::kFprop, GemmRole::kDgrad}) {
          check_role(ctx, rc, p.x, p.w, p.dy, sh.m, sh.n, sh.k, role, RunSpec{}, fill_name(f));
          const bool whole = role == GemmRole::kFprop || sh.k % 256 == 0;  // dgrad: C = K
          if (whole) {
            EXPECT_TRUE(g_checked_call.fused_dequant && g_checked_call.fused_a_first)
                << name << " " << gemm_role_name(role) << " " << sh.m << "x" << sh.n << "x" << sh.k;
          }
        }
      }
    }
  }
}

TEST_F(GpuGemm, FusedDequantAutoRuleForWideOutputs) {
  if (!emulated_on_this_gpu()) GTEST_SKIP() << "sm_100+: MX / NVFP4 are not emulated";
  Context ctx(Device::cuda(0));
  FusedScope automatic(FusedDequant::kAuto);
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  const int64_t fill_rows = 128 * ((sms + 15) / 16);  // 16 column tiles of 256 per row tile
  const auto make = [&](int64_t rows, int64_t cols, const QuantConfig& cfg) {
    Tensor h = Tensor::empty({rows, cols}, DType::kBF16, Device::cpu());
    for (int64_t i = 0; i < rows * cols; ++i) {
      h.ptr<uint16_t>()[i] = f32_to_bf16_rn(float(int(i % 61) - 30) / 16.0f);
    }
    const Tensor d = Tensor::copy_of(h.view(), Device::cuda(0));
    QuantizedTensor q;
    quantize(ctx, d.view(), cfg, q);
    ctx.synchronize();  // before d is freed
    return q;
  };
  struct Case {
    int64_t m, n, k;
    bool fused;
  };
  const std::vector<Case> cases = {{fill_rows, 4096, 4096, true},
                                   {fill_rows, 4096, 2048, false},  // short contraction
                                   {128, 4096, 4096, false},        // too few tiles: split-K
                                   {fill_rows, 4352, 4096, false},  // wider than 4096
                                   {fill_rows, 2048, 1024, true}};  // first branch: C <= 2048
  for (const Case& cs : cases) {
    const QuantizedTensor x = make(cs.m, cs.k, QuantConfig::nvfp4_activation());
    const QuantizedTensor w = make(cs.n, cs.k, QuantConfig::nvfp4_weight());
    Tensor out = Tensor::empty({cs.m, cs.n}, DType::kBF16, Device::cuda(0));
    GemmOptions opt;
    opt.role = GemmRole::kFprop;
    gemm(ctx, GemmOperand::of(x), GemmOperand::of(w), out.view(), opt);
    ctx.synchronize();
    EXPECT_EQ(gemm_cuda_last_call().fused_dequant, cs.fused)
        << cs.m << "x" << cs.n << "x" << cs.k << " on " << sms << " SMs";
  }
}

// The fused kernel's general epilogue and the k-partition reduction's: f32 and bf16 out, alpha,
// beta into out and into a separate c, bias of either dtype; and NaN / inf operands.
TEST_F(GpuGemm, FusedDequantGemmEpilogueAndSpecials) {
  if (!emulated_on_this_gpu()) GTEST_SKIP() << "sm_100+: MX / NVFP4 are not emulated";
  Context ctx(Device::cuda(0));
  const int64_t M = 256, N = 256, K = 512;
  for (int parts : {1, 3}) {  // 3: pieces ending mid-tile (2 or 4 row tiles, one column)
    SCOPED_TRACE(fmt::format("parts {}", parts));
    FusedScope fused(FusedDequant::kOn, 0, parts);
    for (const char* name : {"nvfp4", "mxfp8_hybrid"}) {
      const Recipe rc = recipe_named(name);
      const bool nv = rc.name == "nvfp4";
      // Wgrad (R 256, C 512): with 3 parts it runs transposed (the reduction applies beta, c and
      // the bias in the transposed orientation).
      const std::vector<GemmRole> roles = {GemmRole::kFprop, GemmRole::kDgrad, GemmRole::kWgrad};
      const Problem p = make_problem(ctx, rc, M, N, K, Fill::kNormal, 91);
      for (GemmRole role : roles) {
        std::vector<RunSpec> specs;
        RunSpec s;
        s.out = DType::kF32;
        s.alpha = 0.75f;
        s.beta = 0.5f;
        s.bias = true;
        specs.push_back(s);
        s.bias_dtype = DType::kBF16;
        specs.push_back(s);
        s = RunSpec{};
        s.bias = true;
        s.bias_dtype = DType::kF32;
        specs.push_back(s);
        s = RunSpec{};
        s.beta = 1.0f;
        s.separate_c = true;
        specs.push_back(s);
        s.out = DType::kF32;
        specs.push_back(s);
        for (const RunSpec& sp : specs) {
          check_role(ctx, rc, p.x, p.w, p.dy, M, N, K, role, sp, "epilogue");
          EXPECT_TRUE(g_checked_call.fused_dequant);
          EXPECT_EQ(g_checked_call.fused_transposed, role == GemmRole::kWgrad && parts == 3);
          if (sp.bias) {
            EXPECT_TRUE(g_checked_call.bias_epilogue);
          }
        }
      }
      for (Fill f : {Fill::kNan, Fill::kNanInf}) {
        if (nv && f == Fill::kNanInf) continue;
        const Problem q = make_problem(ctx, rc, M, N, K, f, 556);
        for (GemmRole role : roles) {
          for (DType out : {DType::kBF16, DType::kF32}) {
            RunSpec sp;
            sp.out = out;
            check_role(ctx, rc, q.x, q.w, q.dy, M, N, K, role, sp, fill_name(f));
            EXPECT_TRUE(g_checked_call.fused_dequant);
          }
        }
      }
    }
  }
}

// The code conversion is exact: with B' the identity (one nonzero product per output), the
// fused kernel's f32 out equals the unfused path's (exact bf16 dequantization + cuBLASLt) bit
// for bit, over data spanning 2^24 inside a row (subnormal MX codes, tiny NVFP4 scales).
TEST_F(GpuGemm, FusedDequantGemmConvertsCodesExactly) {
  if (!emulated_on_this_gpu()) GTEST_SKIP() << "sm_100+: MX / NVFP4 are not emulated";
  Context ctx(Device::cuda(0));
  const int64_t M = 256, K = 512, N = 512;  // W [N, K] = identity
  Tensor xs = Tensor::empty({M, K}, DType::kBF16, Device::cpu());
  for (int64_t i = 0; i < M * K; ++i) {
    const float u = philox_uniform(77, 0, 2 * i);
    const float g = philox_uniform(77, 0, 2 * i + 1) - 0.5f;
    xs.ptr<uint16_t>()[i] = f32_to_bf16_rn(g * std::ldexp(1.0f, -int(u * 24.0f)));
  }
  Tensor ws = Tensor::zeros({N, K}, DType::kBF16, Device::cpu());
  for (int64_t i = 0; i < N; ++i) ws.ptr<uint16_t>()[i * K + i] = f32_to_bf16_rn(1.0f);
  struct Cfg {
    const char* name;
    QuantConfig x, w;
  };
  const std::vector<Cfg> cfgs = {
      {"nvfp4", QuantConfig::nvfp4_activation(), QuantConfig::nvfp4_weight()},
      {"mx e4m3", QuantConfig::mx(DType::kE4M3), QuantConfig::mx(DType::kE4M3)},
      {"mx e5m2", QuantConfig::mx(DType::kE5M2), QuantConfig::mx(DType::kE4M3)},
  };
  for (const Cfg& cf : cfgs) {
    SCOPED_TRACE(cf.name);
    const Operand x = make_operand(ctx, xs, &cf.x);
    const Operand w = make_operand(ctx, ws, &cf.w);
    GemmOptions opt;
    opt.role = GemmRole::kFprop;
    std::vector<float> got[2];
    for (int fused = 0; fused < 2; ++fused) {
      FusedScope scope(fused == 1 ? FusedDequant::kOn : FusedDequant::kOff);
      Tensor out = Tensor::empty({M, N}, DType::kF32, Device::cuda(0));
      gemm(ctx, x.gpu(), w.gpu(), out.view(), opt);
      EXPECT_EQ(gemm_cuda_last_call().fused_dequant, fused == 1);
      ctx.synchronize();
      got[fused] = to_host_f32(out.view());
    }
    int64_t diff = 0, nonzero = 0;
    for (size_t i = 0; i < got[0].size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[0][i], 4);
      std::memcpy(&b, &got[1][i], 4);
      // Bit for bit, except the sign of an exact zero (sums of ±0 in another order).
      diff += a != b && !(got[0][i] == 0.0f && got[1][i] == 0.0f);
      nonzero += got[0][i] != 0.0f;
    }
    EXPECT_EQ(diff, 0) << "of " << got[0].size() << " outputs";
    // One nonzero product per output where c < K (W is the identity); NVFP4 flushes the
    // smaller part of this 2^24-wide data to 0, but a good share stays nonzero.
    EXPECT_GT(nonzero, int64_t(got[0].size()) / 8);
  }
}

}  // namespace
}  // namespace lowbit
