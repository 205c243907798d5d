// gemm(): validation, the canonical TN problem, backend choice and the fast-accumulation policy
// (formats.md §3–§4); the backends live in gemm_cpu.cpp and the CUDA files.
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/env_switch.h"
#include "gemm/gemm_internal.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sysinfo.h"
#include "lowbit/gemm.h"
#include "lowbit/recipe.h"

namespace lowbit {

std::string_view gemm_role_name(GemmRole r) {
  switch (r) {
    case GemmRole::kFprop: return "fprop";
    case GemmRole::kDgrad: return "dgrad";
    case GemmRole::kWgrad: return "wgrad";
  }
  return "?";
}

std::string_view gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::kCpuReference: return "cpu_reference";
    case GemmBackend::kCublasLtBf16: return "cublaslt_bf16";
    case GemmBackend::kCublasLtFp8: return "cublaslt_fp8";
    case GemmBackend::kCublasLtFp8Block: return "cublaslt_fp8_block";
    case GemmBackend::kEmulatedBf16: return "emulated_bf16";
    case GemmBackend::kCublasLtBlockScaled: return "cublaslt_block_scaled";
  }
  return "?";
}

namespace {

// What each role calls its operands and their natural shapes (include/lowbit/gemm.h).
struct RoleInfo {
  const char* a_name;
  const char* a_shape;
  const char* b_name;
  const char* b_shape;
  char contracted;  // the letter of the contracted dim
  Usage a_usage, b_usage;
};

RoleInfo role_info(GemmRole r) {
  switch (r) {
    case GemmRole::kFprop:
      return {"X", "[M, K]", "W", "[N, K]", 'K', Usage::kRowwise, Usage::kRowwise};
    case GemmRole::kDgrad:
      return {"dY", "[M, N]", "W", "[N, K]", 'N', Usage::kRowwise, Usage::kColumnwise};
    case GemmRole::kWgrad:
      return {"dY", "[M, N]", "X", "[M, K]", 'M', Usage::kColumnwise, Usage::kColumnwise};
  }
  LOWBIT_CHECK(false, "unknown gemm role {}", static_cast<int>(r));
  return {};
}

const char* usage_name(Usage u) { return u == Usage::kRowwise ? "rowwise" : "columnwise"; }

bool is_fp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }
bool is_fp8_block(ScalingMode m) {
  return m == ScalingMode::kBlock1x128 || m == ScalingMode::kBlock128x128;
}

// The family of a scaling mode: operands of one GEMM must share it.
enum class Family { kPerTensor, kFp8Block, kMX, kNVFP4 };
Family family_of(ScalingMode m) {
  if (m == ScalingMode::kPerTensor) return Family::kPerTensor;
  if (is_fp8_block(m)) return Family::kFp8Block;
  if (m == ScalingMode::kMX1x32) return Family::kMX;
  return Family::kNVFP4;
}

std::string describe(const GemmOperand& op) {
  if (op.quantized()) return op.q->str();
  return op.dense.str();
}

std::string prefix(GemmRole r) { return fmt::format("gemm {}", gemm_role_name(r)); }

// Shared by both operands: builds A' or B' and checks what does not depend on the other one.
CanonOperand canon_operand(const GemmOperand& op, GemmRole role, bool is_a, Device dev,
                           bool check_device) {
  const RoleInfo ri = role_info(role);
  const char* name = is_a ? ri.a_name : ri.b_name;
  const char* shape_desc = is_a ? ri.a_shape : ri.b_shape;
  const Usage usage = is_a ? ri.a_usage : ri.b_usage;
  const std::string where =
      fmt::format("{}: operand {} ({} {})", prefix(role), is_a ? "A" : "B", name, shape_desc);
  CanonOperand c;
  c.usage = usage;
  Shape natural;
  if (op.quantized()) {
    const QuantizedTensor& q = *op.q;
    LOWBIT_USER_CHECK(q.shape.ndim == 2, "{} must be a 2-D quantized tensor, got {}", where,
                      q.str());
    const bool has = usage == Usage::kRowwise ? q.has_rowwise() : q.has_columnwise();
    LOWBIT_USER_CHECK(has,
                      "{}: {} needs the {} copy of {}, but {} has none; quantize it with "
                      "QuantConfig::{} = true",
                      where, gemm_role_name(role), usage_name(usage), name, q.str(),
                      usage_name(usage));
    q.validate();
    const Tensor& data = usage == Usage::kRowwise ? q.rowwise_data : q.columnwise_data;
    LOWBIT_USER_CHECK(!check_device || data.device() == dev,
                      "{} is on {}, but the context runs on {}; move it to {}", where,
                      data.device().str(), dev.str(), dev.str());
    c.q = &q;
    natural = q.shape;
  } else {
    const TensorView& t = op.dense;
    LOWBIT_USER_CHECK(t.data != nullptr || t.ndim() > 0,
                      "{} is neither a tensor nor a quantized tensor (empty operand)", where);
    LOWBIT_USER_CHECK(t.ndim() == 2, "{} must be 2-D, got {}", where, t.str());
    LOWBIT_USER_CHECK(!check_device || t.device == dev,
                      "{} is on {}, but the context runs on {}; move it to {}", where,
                      t.device.str(), dev.str(), dev.str());
    if (t.device.is_cuda()) {
      LOWBIT_USER_CHECK(t.dtype == DType::kBF16,
                        "{} is {}; dense GPU operands must be bf16 (convert it, or quantize it)",
                        where, t.str());
      LOWBIT_USER_CHECK(t.is_contiguous(), "{} must be contiguous on the GPU, got strides {}",
                        where, t.strides.str());
    } else {
      LOWBIT_USER_CHECK(t.dtype == DType::kBF16 || t.dtype == DType::kF32,
                        "{} is {}; dense operands must be bf16 or f32", where, t.str());
    }
    c.dense = t;
    c.transposed = usage == Usage::kColumnwise;
    natural = t.shape;
  }
  LOWBIT_USER_CHECK(natural[0] > 0 && natural[1] > 0, "{} is empty ({})", where, describe(op));
  const bool transposed = usage == Usage::kColumnwise;
  c.rows = transposed ? natural[1] : natural[0];
  c.kc = transposed ? natural[0] : natural[1];
  return c;
}

// Everything about the operand pair that holds on every device.
CanonGemm canon_pair(const GemmOperand& a, const GemmOperand& b, const GemmOptions& opt, Device dev,
                     bool check_device) {
  const GemmRole role = opt.role;
  const RoleInfo ri = role_info(role);
  const std::string p = prefix(role);
  LOWBIT_USER_CHECK(a.quantized() == b.quantized(),
                    "{}: {} is quantized ({}) but {} is dense ({}); quantize both operands or "
                    "neither",
                    p, a.quantized() ? ri.a_name : ri.b_name, describe(a.quantized() ? a : b),
                    a.quantized() ? ri.b_name : ri.a_name, describe(a.quantized() ? b : a));
  CanonGemm g;
  g.role = role;
  g.a = canon_operand(a, role, true, dev, check_device);
  g.b = canon_operand(b, role, false, dev, check_device);
  LOWBIT_USER_CHECK(g.a.kc == g.b.kc,
                    "{}: {} {} = {} and {} {} = {} disagree on the contracted dim {} ({} vs {})", p,
                    ri.a_name, ri.a_shape, describe(a), ri.b_name, ri.b_shape, describe(b),
                    ri.contracted, g.a.kc, g.b.kc);
  g.R = g.a.rows;
  g.C = g.b.rows;
  g.Kc = g.a.kc;
  if (a.quantized()) {
    const QuantizedTensor& qa = *a.q;
    const QuantizedTensor& qb = *b.q;
    LOWBIT_USER_CHECK(family_of(qa.mode) == family_of(qb.mode),
                      "{}: {} is {} but {} is {}; both operands must use the same recipe "
                      "(per-tensor FP8, FP8 blocks, MX or NVFP4)",
                      p, ri.a_name, scaling_mode_name(qa.mode), ri.b_name,
                      scaling_mode_name(qb.mode));
    LOWBIT_USER_CHECK(!(qa.dtype == DType::kE5M2 && qb.dtype == DType::kE5M2),
                      "{}: {} and {} are both E5M2; E5M2 x E5M2 GEMMs are not supported "
                      "(cuBLASLt rejects them): quantize one operand as E4M3 (the HYBRID format "
                      "uses E4M3 for X and W, E5M2 for dY)",
                      p, ri.a_name, ri.b_name);
    const bool ha = g.a.usage == Usage::kColumnwise && qa.columnwise_hadamard;
    const bool hb = g.b.usage == Usage::kColumnwise && qb.columnwise_hadamard;
    LOWBIT_USER_CHECK(ha == hb,
                      "{}: the {} copy of {} is Hadamard-transformed but the copy of {} is not; "
                      "the transform cancels only when both operands of the contraction carry "
                      "it (quantize both with hadamard_columnwise, or neither)",
                      p, usage_name(ha ? g.a.usage : g.b.usage), ha ? ri.a_name : ri.b_name,
                      ha ? ri.b_name : ri.a_name);
  }
  return g;
}

// Compute capability of the context's GPU (0 when unknown); the device list is queried once.
int context_sm(const Context& ctx) {
  static const std::vector<GpuInfo> gpus = list_gpus();
  for (const GpuInfo& gi : gpus) {
    if (gi.index == ctx.device().index) return gi.sm();
  }
  return 0;
}

}  // namespace

GemmBackend gemm_backend_for(const Context& ctx, const GemmOperand& a, const GemmOperand& b) {
  LOWBIT_USER_CHECK(a.quantized() == b.quantized(),
                    "gemm: one operand is quantized ({}) and the other is dense ({}); quantize "
                    "both operands or neither",
                    describe(a.quantized() ? a : b), describe(a.quantized() ? b : a));
  if (!ctx.on_gpu()) return GemmBackend::kCpuReference;
  if (!a.quantized()) return GemmBackend::kCublasLtBf16;
  const Family fa = family_of(a.q->mode), fb = family_of(b.q->mode);
  LOWBIT_USER_CHECK(fa == fb, "gemm: operands {} and {} use different recipes; quantize both alike",
                    a.q->str(), b.q->str());
  switch (fa) {
    case Family::kPerTensor: return GemmBackend::kCublasLtFp8;
    case Family::kFp8Block: return GemmBackend::kCublasLtFp8Block;
    case Family::kMX:
    case Family::kNVFP4: {
      // Blackwell runs MXFP8 and NVFP4 natively; MX FP6/FP4 and everything on Hopper go through
      // the exact dequantization to bf16.
      // The block-scaled modes need cuBLASLt 12.9+ (recipe_support says the same).
      const bool native = fa == Family::kNVFP4 || (is_fp8(a.q->dtype) && is_fp8(b.q->dtype));
      return native && context_sm(ctx) >= 100 &&
                     library_versions().cublaslt.version_code >= kCublasLtBlockScaledVersion
                 ? GemmBackend::kCublasLtBlockScaled
                 : GemmBackend::kEmulatedBf16;
    }
  }
  return GemmBackend::kEmulatedBf16;
}

CanonGemm canonicalize_operands(const GemmOperand& a, const GemmOperand& b,
                                const GemmOptions& opt) {
  CanonGemm g = canon_pair(a, b, opt, Device::cpu(), /*check_device=*/false);
  g.backend = GemmBackend::kCpuReference;
  return g;
}

CanonGemm canonicalize(const Context& ctx, const GemmOperand& a, const GemmOperand& b,
                       const TensorView& out, const GemmOptions& opt) {
  const Device dev = ctx.device();
  CanonGemm g = canon_pair(a, b, opt, dev, /*check_device=*/true);
  const RoleInfo ri = role_info(opt.role);
  const std::string p = prefix(opt.role);
  const char* out_name = opt.role == GemmRole::kFprop   ? "Y [M, N]"
                         : opt.role == GemmRole::kDgrad ? "dX [M, K]"
                                                        : "dW [N, K]";

  // Output.
  LOWBIT_USER_CHECK(out.ndim() == 2 && out.shape == (Shape{g.R, g.C}),
                    "{}: out must be {} = [{}, {}] for {} {} and {} {}, got {}", p, out_name, g.R,
                    g.C, ri.a_name, describe(a), ri.b_name, describe(b), out.str());
  LOWBIT_USER_CHECK(out.dtype == DType::kBF16 || out.dtype == DType::kF32,
                    "{}: out must be bf16 or f32, got {}", p, out.str());
  LOWBIT_USER_CHECK(out.device == dev, "{}: out is on {}, but the context runs on {}", p,
                    out.device.str(), dev.str());
  LOWBIT_USER_CHECK(out.is_contiguous(), "{}: out must be contiguous, got strides {}", p,
                    out.strides.str());
  LOWBIT_USER_CHECK(opt.beta == 0.0f || out.dtype == DType::kF32 || opt.c != nullptr,
                    "{}: beta = {} accumulates into out, which needs an f32 out (got {}); "
                    "use an f32 buffer, beta = 0, or pass the added tensor as c",
                    p, opt.beta, out.str());
  if (opt.c != nullptr) {
    const TensorView& c = *opt.c;
    LOWBIT_USER_CHECK(c.ndim() == 2 && c.shape == out.shape && c.dtype == out.dtype &&
                          c.device == dev && c.is_contiguous(),
                      "{}: c (the beta term's input) must be like out: {} {}, contiguous, on {}; "
                      "got {}",
                      p, dtype_name(out.dtype), out.shape.str(), dev.str(), c.str());
  }
  if (opt.bias != nullptr) {
    const TensorView& bias = *opt.bias;
    LOWBIT_USER_CHECK(bias.ndim() == 1 && bias.shape[0] == g.C,
                      "{}: bias must be [{}] (one value per column of out {}), got {}", p, g.C,
                      out_name, bias.str());
    LOWBIT_USER_CHECK(bias.dtype == DType::kBF16 || bias.dtype == DType::kF32,
                      "{}: bias must be bf16 or f32, got {}", p, bias.str());
    LOWBIT_USER_CHECK(bias.device == dev && bias.is_contiguous(),
                      "{}: bias must be contiguous and on {}, got {}", p, dev.str(), bias.str());
  }

  g.backend = gemm_backend_for(ctx, a, b);

  // FP8 tensor cores need 16-byte leading dimensions: Kc elements of one byte (formats.md §4.3).
  if (ctx.on_gpu() && a.quantized() &&
      (g.backend == GemmBackend::kCublasLtFp8 || g.backend == GemmBackend::kCublasLtFp8Block)) {
    LOWBIT_USER_CHECK(g.Kc % 16 == 0,
                      "{}: FP8 operands {} and {} contract over {} = {}, which must be a multiple "
                      "of 16 on the GPU (cuBLASLt FP8 leading dimension); pad {} to a multiple of "
                      "16",
                      p, ri.a_name, ri.b_name, ri.contracted, g.Kc, ri.contracted);
    LOWBIT_USER_CHECK(
        !(a.q->mode == ScalingMode::kBlock128x128 && b.q->mode == ScalingMode::kBlock128x128),
        "{}: {} and {} both use 128x128 blocks, which cuBLASLt does not support; quantize one "
        "of them (the activation or gradient) with 1x128 blocks",
        p, ri.a_name, ri.b_name);
  }

  // Blackwell's block-scaled modes (sm_100+) take K in whole 32-element blocks (MX's block, and
  // 16-byte leading dimensions of E2M1, two per byte); other contractions (NVFP4 allows K % 16)
  // run through the exact emulation instead.
  if (g.backend == GemmBackend::kCublasLtBlockScaled && g.Kc % 32 != 0) {
    g.backend = GemmBackend::kEmulatedBf16;
  }

  // Fast accumulation (formats.md §3, §4.4): TE's default turns it on in fprop for per-tensor
  // FP8 only; the block-scaled modes reject it.
  const bool per_tensor = a.quantized() && a.q->mode == ScalingMode::kPerTensor;
  switch (opt.accumulation) {
    case Fp8Accumulation::kDefault:
      g.fast_accum = per_tensor && opt.role == GemmRole::kFprop;
      break;
    case Fp8Accumulation::kSplit: g.fast_accum = false; break;
    case Fp8Accumulation::kFast:
      LOWBIT_USER_CHECK(!a.quantized() || per_tensor,
                        "{}: fast accumulation is not available for block-scaled operands ({}); "
                        "use Fp8Accumulation::kDefault or kSplit",
                        p, scaling_mode_name(a.q->mode));
      g.fast_accum = per_tensor;
      break;
  }
  return g;
}

bool gemm_autotune_from_env(const char* value) {
  return parse_env_switch("LOWBIT_GEMM_AUTOTUNE", value) != 0;
}

namespace {
// -1: not yet decided (read LOWBIT_GEMM_AUTOTUNE on first use), else 0 / 1.
std::atomic<int> g_autotune{-1};
}  // namespace

void set_gemm_autotune(bool on) { g_autotune.store(on ? 1 : 0); }

bool gemm_autotune() {
  int v = g_autotune.load();
  if (v < 0) {
    const int from_env = gemm_autotune_from_env(std::getenv("LOWBIT_GEMM_AUTOTUNE")) ? 1 : 0;
    // A concurrent set_gemm_autotune() wins over the environment.
    g_autotune.compare_exchange_strong(v, from_env);
    v = g_autotune.load();
  }
  return v != 0;
}

namespace {
// -1: not yet decided (read LOWBIT_GEMM_FUSED on first use), else a FusedDequant.
std::atomic<int> g_fused{-1};
}  // namespace

FusedDequant gemm_fused_from_env(const char* value) {
  switch (parse_gemm_fused(value)) {
    case 0: return FusedDequant::kOff;
    case 1: return FusedDequant::kOn;
    default: return FusedDequant::kAuto;  // unset, empty or auto
  }
}

void set_gemm_fused_dequant(FusedDequant mode) { g_fused.store(static_cast<int>(mode)); }

FusedDequant gemm_fused_dequant() {
  int v = g_fused.load();
  if (v < 0) {
    const int from_env = static_cast<int>(gemm_fused_from_env(std::getenv("LOWBIT_GEMM_FUSED")));
    g_fused.compare_exchange_strong(v, from_env);
    v = g_fused.load();
  }
  return static_cast<FusedDequant>(v);
}

void gemm(Context& ctx, const GemmOperand& a, const GemmOperand& b, const TensorView& out,
          const GemmOptions& opt) {
  const CanonGemm g = canonicalize(ctx, a, b, out, opt);
  if (ctx.on_gpu()) {
    gemm_cuda(ctx, g, out, opt);
  } else {
    gemm_cpu(g, out, opt);
  }
}

}  // namespace lowbit
