// QuantizedTensor layouts and validation, QuantConfig presets and checks, the block-scale
// swizzle, and the device dispatch of quantize / dequantize.
#include <string>

#include "core/current_device.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/formats.h"
#include "lowbit/quant.h"
#include "lowbit/quant/layout.h"
#include "quant/quant_cuda.h"
#include "quant/quant_ref.h"

namespace lowbit {

std::string_view scaling_mode_name(ScalingMode m) {
  switch (m) {
    case ScalingMode::kPerTensor: return "per_tensor";
    case ScalingMode::kBlock1x128: return "block1x128";
    case ScalingMode::kBlock128x128: return "block128x128";
    case ScalingMode::kMX1x32: return "mx1x32";
    case ScalingMode::kNVFP4_1x16: return "nvfp4_1x16";
    case ScalingMode::kNVFP4_16x16: return "nvfp4_16x16";
  }
  return "?";
}

namespace {

bool is_fp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }
bool is_mx_element(DType t) {
  return is_fp8(t) || t == DType::kE3M2 || t == DType::kE2M3 || t == DType::kE2M1;
}
bool is_nvfp4(ScalingMode m) {
  return m == ScalingMode::kNVFP4_1x16 || m == ScalingMode::kNVFP4_16x16;
}

// Element types a mode accepts.
bool mode_accepts(ScalingMode m, DType t) {
  switch (m) {
    case ScalingMode::kPerTensor:
    case ScalingMode::kBlock1x128:
    case ScalingMode::kBlock128x128: return is_fp8(t);
    case ScalingMode::kMX1x32: return is_mx_element(t);
    case ScalingMode::kNVFP4_1x16:
    case ScalingMode::kNVFP4_16x16: return t == DType::kE2M1;
  }
  return false;
}

const char* mode_dtypes(ScalingMode m) {
  switch (m) {
    case ScalingMode::kMX1x32: return "e4m3, e5m2, e3m2, e2m3 or e2m1";
    case ScalingMode::kNVFP4_1x16:
    case ScalingMode::kNVFP4_16x16: return "e2m1";
    default: return "e4m3 or e5m2";
  }
}

Tensor copy_if_defined(const Tensor& t, Device dev) {
  return t.defined() ? Tensor::copy_of(t.view(), dev) : Tensor();
}

// The same quantized tensor with every field copied to `dev`.
QuantizedTensor copy_quantized(const QuantizedTensor& q, Device dev) {
  QuantizedTensor out = q;
  out.rowwise_data = copy_if_defined(q.rowwise_data, dev);
  out.rowwise_scale_inv = copy_if_defined(q.rowwise_scale_inv, dev);
  out.columnwise_data = copy_if_defined(q.columnwise_data, dev);
  out.columnwise_scale_inv = copy_if_defined(q.columnwise_scale_inv, dev);
  out.amax = copy_if_defined(q.amax, dev);
  out.columnwise_amax = copy_if_defined(q.columnwise_amax, dev);
  return out;
}

}  // namespace

// --- QuantConfig --------------------------------------------------------------------------------

bool QuantConfig::effective_pow2() const {
  if (pow2_scales.has_value()) return *pow2_scales;
  // Block scaling defaults to power-of-two scales, current scaling does not (§2.3, §2.4).
  return mode == ScalingMode::kBlock1x128 || mode == ScalingMode::kBlock128x128;
}

QuantConfig QuantConfig::fp8_current(DType t, bool pow2) {
  QuantConfig c;
  c.dtype = t;
  c.mode = ScalingMode::kPerTensor;
  c.columnwise = true;
  c.pow2_scales = pow2;
  return c;
}

QuantConfig QuantConfig::fp8_delayed(DelayedScalingState& state, int slot) {
  QuantConfig c;
  c.dtype = state.dtype();
  c.mode = ScalingMode::kPerTensor;
  c.columnwise = true;
  c.delayed = &state;
  c.delayed_slot = slot;
  return c;
}

QuantConfig QuantConfig::fp8_block_1x128(DType t) {
  QuantConfig c;
  c.dtype = t;
  c.mode = ScalingMode::kBlock1x128;
  c.columnwise = true;
  return c;
}

QuantConfig QuantConfig::fp8_block_128x128(DType t) {
  QuantConfig c = fp8_block_1x128(t);
  c.mode = ScalingMode::kBlock128x128;
  return c;
}

QuantConfig QuantConfig::mx(DType t, MxScaleRounding r) {
  QuantConfig c;
  c.dtype = t;
  c.mode = ScalingMode::kMX1x32;
  c.columnwise = true;
  c.mx_rounding = r;
  return c;
}

QuantConfig QuantConfig::nvfp4_activation() {
  QuantConfig c;
  c.dtype = DType::kE2M1;
  c.mode = ScalingMode::kNVFP4_1x16;
  c.columnwise = true;
  c.hadamard_columnwise = true;
  return c;
}

QuantConfig QuantConfig::nvfp4_weight() {
  QuantConfig c;
  c.dtype = DType::kE2M1;
  c.mode = ScalingMode::kNVFP4_16x16;
  c.columnwise = true;
  return c;
}

QuantConfig QuantConfig::nvfp4_gradient() {
  QuantConfig c = nvfp4_activation();
  c.stochastic_rounding = true;
  return c;
}

void check_quant_config(const TensorView& x, const QuantConfig& cfg) {
  const std::string_view mode = scaling_mode_name(cfg.mode);
  LOWBIT_USER_CHECK(x.ndim() == 2, "quantize: expected a 2-D [M, K] tensor, got {}", x.str());
  LOWBIT_USER_CHECK(x.dtype == DType::kBF16 || x.dtype == DType::kF32,
                    "quantize: input must be bf16 or f32, got {}", x.str());
  LOWBIT_USER_CHECK(mode_accepts(cfg.mode, cfg.dtype),
                    "quantize: scaling mode {} takes element type {}, not {}", mode,
                    mode_dtypes(cfg.mode), dtype_name(cfg.dtype));
  LOWBIT_USER_CHECK(cfg.rowwise || cfg.columnwise,
                    "quantize: ask for the rowwise copy, the columnwise copy or both");
  LOWBIT_USER_CHECK(cfg.amax_epsilon >= 0.0f, "quantize: amax_epsilon must be >= 0, got {}",
                    cfg.amax_epsilon);
  const int64_t m = x.size(0), k = x.size(1);
  // Blocked dimensions must hold whole blocks for MX and NVFP4 (TE checks the same); the FP8
  // block modes use partial last blocks instead.
  auto need_multiple = [&](int64_t dim, const char* name, int64_t n, const char* why) {
    LOWBIT_USER_CHECK(dim % n == 0,
                      "quantize {}: {} = {} must be a multiple of {} ({}); pad the tensor to a "
                      "multiple of {}",
                      mode, name, dim, n, why, n);
  };
  if (cfg.mode == ScalingMode::kMX1x32) {
    if (cfg.rowwise) need_multiple(k, "K", 32, "rowwise blocks of 32 along K");
    if (cfg.columnwise) need_multiple(m, "M", 32, "columnwise blocks of 32 along M");
    // E2M1 packs two codes per byte along each copy's rows: K for the rowwise copy; the
    // columnwise copy packs along M, which M % 32 already covers.
    if (cfg.rowwise && cfg.dtype == DType::kE2M1) {
      need_multiple(k, "K", 2, "two e2m1 per byte along K");
    }
  }
  if (cfg.mode == ScalingMode::kNVFP4_1x16) {
    if (cfg.rowwise) need_multiple(k, "K", 16, "rowwise blocks of 16 along K");
    if (cfg.columnwise) need_multiple(m, "M", 16, "columnwise blocks of 16 along M");
  }
  if (cfg.mode == ScalingMode::kNVFP4_16x16) {
    need_multiple(m, "M", 16, "16x16 tiles");
    need_multiple(k, "K", 16, "16x16 tiles");
  }
  if (cfg.hadamard_columnwise) {
    LOWBIT_USER_CHECK(cfg.mode == ScalingMode::kNVFP4_1x16,
                      "quantize {}: the Hadamard transform is only defined for the columnwise "
                      "copy of nvfp4_1x16 (activations and gradients)",
                      mode);
    LOWBIT_USER_CHECK(!cfg.columnwise || x.dtype == DType::kBF16,
                      "quantize nvfp4_1x16: the Hadamard transform takes bf16 input, got {}; "
                      "cast the tensor to bf16 first",
                      x.str());
  }
  if (cfg.delayed != nullptr) {
    const DelayedScalingState& st = *cfg.delayed;
    LOWBIT_USER_CHECK(cfg.mode == ScalingMode::kPerTensor,
                      "quantize: delayed scaling is per tensor, not {}", mode);
    LOWBIT_USER_CHECK(cfg.delayed_slot >= 0 && cfg.delayed_slot < st.num_slots(),
                      "quantize: delayed-scaling slot {} out of range [0, {})", cfg.delayed_slot,
                      st.num_slots());
    LOWBIT_USER_CHECK(cfg.dtype == st.dtype(),
                      "quantize: the delayed-scaling state quantizes this pass to {}, not {}",
                      dtype_name(st.dtype()), dtype_name(cfg.dtype));
    LOWBIT_USER_CHECK(!cfg.effective_pow2() && cfg.amax_epsilon == 0.0f,
                      "quantize: delayed scaling has no power-of-two option and no amax epsilon");
  }
}

// --- layouts and validation ---------------------------------------------------------------------

QuantLayout quant_layout(ScalingMode mode, DType dtype, int64_t m, int64_t k, Usage usage) {
  const bool row = usage == Usage::kRowwise;
  // Columnwise copies are stored transposed, [K, M]: every one is then K-contiguous for its GEMM
  // (the TN layout that Hopper's FP8 / emulated paths need and Blackwell takes too).
  const bool transposed = !row;
  QuantLayout l;
  l.data_dtype = dtype;
  l.data_shape = transposed ? Shape{k, m} : Shape{m, k};
  switch (mode) {
    case ScalingMode::kPerTensor:
      l.scale_dtype = DType::kF32;
      l.scale_shape = {1};
      l.scale_desc = "[1]";
      break;
    case ScalingMode::kBlock1x128:
      l.scale_dtype = DType::kF32;
      l.scale_shape = row ? Shape{ceil_div(k, 128), pad4(m)} : Shape{ceil_div(m, 128), pad4(k)};
      l.scale_desc = row ? "[ceil(K/128), pad4(M)] (VEC128)" : "[ceil(M/128), pad4(K)] (VEC128)";
      break;
    case ScalingMode::kBlock128x128:
      l.scale_dtype = DType::kF32;
      l.scale_shape = row ? Shape{ceil_div(m, 128), pad4(ceil_div(k, 128))}
                          : Shape{ceil_div(k, 128), pad4(ceil_div(m, 128))};
      l.scale_desc = row ? "[ceil(M/128), pad4(ceil(K/128))] (BLK128x128)"
                         : "[ceil(K/128), pad4(ceil(M/128))] (BLK128x128)";
      break;
    case ScalingMode::kMX1x32:
      l.scale_dtype = DType::kE8M0;
      l.scale_shape = row ? Shape{m, k / 32} : Shape{k, m / 32};
      l.scale_desc = row ? "[M, K/32] (compact)" : "[K, M/32] (compact)";
      break;
    case ScalingMode::kNVFP4_1x16:
    case ScalingMode::kNVFP4_16x16:
      l.scale_dtype = DType::kUE4M3;
      l.scale_shape = row ? Shape{m, k / 16} : Shape{k, m / 16};
      l.scale_desc = row ? "[M, K/16] (compact)" : "[K, M/16] (compact)";
      break;
  }
  return l;
}

std::string QuantizedTensor::str() const {
  std::string copies = has_rowwise() && has_columnwise() ? "rowwise+columnwise"
                       : has_rowwise()                   ? "rowwise"
                       : has_columnwise()                ? "columnwise"
                                                         : "empty";
  return fmt::format("{} {}{} {}", scaling_mode_name(mode), dtype_name(dtype), shape.str(), copies);
}

namespace {

std::string describe(const Tensor& t) {
  return t.defined() ? t.view().str() : std::string("nothing");
}

[[noreturn]] void invalid(const QuantizedTensor& q, const std::string& what) {
  throw_internal(__FILE__, __LINE__, fmt::format("QuantizedTensor {}: {}", q.str(), what));
}

void validate_f32_scalar(const QuantizedTensor& q, const Tensor& t, const char* name,
                         const char* why) {
  if (!t.defined() || t.dtype() != DType::kF32 || t.shape() != Shape{1}) {
    invalid(q, fmt::format("{} must be f32 [1] ({}), got {}", name, why, describe(t)));
  }
}

void validate_copy(const QuantizedTensor& q, Usage usage) {
  const bool row = usage == Usage::kRowwise;
  const char* data_name = row ? "rowwise_data" : "columnwise_data";
  const char* scale_name = row ? "rowwise_scale_inv" : "columnwise_scale_inv";
  const Tensor& data = row ? q.rowwise_data : q.columnwise_data;
  const Tensor& scale = row ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  const QuantLayout l = quant_layout(q.mode, q.dtype, q.shape[0], q.shape[1], usage);
  if (data.dtype() != l.data_dtype || data.shape() != l.data_shape) {
    invalid(q, fmt::format("{} must be {}{}{}, got {}", data_name, dtype_name(l.data_dtype),
                           l.data_shape.str(),
                           !row && l.data_shape != q.shape ? " (transposed)" : "", describe(data)));
  }
  if (!scale.defined() || scale.dtype() != l.scale_dtype || scale.shape() != l.scale_shape) {
    invalid(q, fmt::format("{} must be {}{} {}, got {}", scale_name, dtype_name(l.scale_dtype),
                           l.scale_shape.str(), l.scale_desc, describe(scale)));
  }
  if (data.device() != scale.device()) {
    invalid(q, fmt::format("{} and {} live on different devices", data_name, scale_name));
  }
  if (is_nvfp4(q.mode)) {
    if (row) {
      validate_f32_scalar(q, q.amax, "amax", "NVFP4 rowwise global amax");
    } else {
      validate_f32_scalar(q, q.columnwise_amax, "columnwise_amax", "NVFP4 columnwise global amax");
    }
  }
}

}  // namespace

void QuantizedTensor::validate() const {
  if (shape.ndim != 2) invalid(*this, "shape must be 2-D [M, K]");
  if (!mode_accepts(mode, dtype)) {
    invalid(*this, fmt::format("mode {} takes element type {}", scaling_mode_name(mode),
                               mode_dtypes(mode)));
  }
  if (!has_rowwise() && !has_columnwise()) {
    invalid(*this, "holds neither a rowwise nor a columnwise copy");
  }
  if (has_rowwise()) validate_copy(*this, Usage::kRowwise);
  if (has_columnwise()) validate_copy(*this, Usage::kColumnwise);
  if (has_rowwise() && has_columnwise() && rowwise_data.device() != columnwise_data.device()) {
    invalid(*this, "rowwise and columnwise copies live on different devices");
  }
  if (amax.defined() && !is_nvfp4(mode)) validate_f32_scalar(*this, amax, "amax", "optional");
  if (columnwise_hadamard && !(mode == ScalingMode::kNVFP4_1x16 && has_columnwise())) {
    invalid(*this,
            "columnwise_hadamard is set but only an nvfp4_1x16 columnwise copy can hold "
            "a Hadamard-transformed tensor");
  }
}

// --- dispatch -----------------------------------------------------------------------------------

void quantize(Context& ctx, const TensorView& x, const QuantConfig& cfg, QuantizedTensor& out) {
  check_quant_config(x, cfg);
  QuantStreams streams;
  streams.stochastic = cfg.stochastic_rounding;
  if (cfg.stochastic_rounding) {
    if (cfg.sr_key.has_value()) {
      streams.rowwise = *cfg.sr_key;
      streams.columnwise = {cfg.sr_key->seed, cfg.sr_key->offset + 1};
    } else {
      streams.rowwise = {ctx.seed(), ctx.take_rng_offset()};
      streams.columnwise = {ctx.seed(), ctx.take_rng_offset()};
    }
  }
  if (x.device.is_cuda()) {
    quantize_cuda(ctx, x, cfg, streams, out);
  } else if (cfg.round_source_to_bf16 && x.dtype == DType::kF32) {
    LOWBIT_CHECK(x.is_contiguous(),
                 "quantize: round_source_to_bf16 needs a contiguous source, "
                 "got {}",
                 x.str());
    Tensor rounded = Tensor::empty(x.shape, DType::kBF16, Device::cpu());
    const float* xs = x.ptr<const float>();
    uint16_t* r = rounded.ptr<uint16_t>();
    for (int64_t i = 0; i < x.numel(); ++i) r[i] = f32_to_bf16_rn(xs[i]);
    quantize_ref(rounded.view(), cfg, streams, out);
  } else {
    quantize_ref(x, cfg, streams, out);
  }
}

Tensor dequantize(const QuantizedTensor& q, Usage usage) {
  q.validate();
  const bool row = usage == Usage::kRowwise;
  LOWBIT_USER_CHECK(row ? q.has_rowwise() : q.has_columnwise(), "dequantize: {} has no {} copy",
                    q.str(), row ? "rowwise" : "columnwise");
  const Device dev = (row ? q.rowwise_data : q.columnwise_data).device();
  if (dev.is_cuda()) {
    // Off the training path (the GEMM dequantizes in its own kernels): through the CPU twin.
    const Tensor host = dequantize_ref(copy_quantized(q, Device::cpu()), usage);
    return Tensor::copy_of(host.view(), dev);
  }
  return dequantize_ref(q, usage);
}

Tensor swizzle_block_scales(const TensorView& compact) {
  LOWBIT_CHECK(compact.ndim() == 2 && dtype_bits(compact.dtype) == 8 && compact.is_contiguous(),
               "swizzle_block_scales takes contiguous one-byte scales [R, C], got {}",
               compact.str());
  const int64_t r_count = compact.size(0), c_count = compact.size(1);
  const int64_t r_pad = pad128(r_count), c_pad = pad4(c_count);
  if (compact.device.is_cuda()) {  // the kernel twin of the loop below, on the legacy stream
    const CurrentDevice device(compact.device.index);
    Tensor out = Tensor::empty({r_pad, c_pad}, compact.dtype, compact.device);
    quant_cuda::swizzle_block_scales(compact.ptr<const uint8_t>(), r_count, c_count,
                                     out.ptr<uint8_t>(), nullptr);
    // Synchronous, as this function has always been for its callers (tests, tools).
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    return out;
  }
  Tensor out = Tensor::zeros({r_pad, c_pad}, compact.dtype, Device::cpu());  // tiles, zero pad
  const uint8_t* src = compact.ptr<const uint8_t>();
  uint8_t* dst = out.ptr<uint8_t>();
  for (int64_t r = 0; r < r_count; ++r) {
    for (int64_t c = 0; c < c_count; ++c) {
      dst[swizzled_scale_offset(r, c, c_pad)] = src[r * c_count + c];
    }
  }
  return out;
}

Tensor gemm_block_scales(const QuantizedTensor& q, Usage usage) {
  q.validate();
  LOWBIT_USER_CHECK(q.mode == ScalingMode::kMX1x32 || is_nvfp4(q.mode),
                    "gemm_block_scales: {} has fp32 scales already in their GEMM layout", q.str());
  const bool row = usage == Usage::kRowwise;
  LOWBIT_USER_CHECK(row ? q.has_rowwise() : q.has_columnwise(),
                    "gemm_block_scales: {} has no {} copy", q.str(),
                    row ? "rowwise" : "columnwise");
  // Compact scales are [rows, blocks] of their copy's stored (K-contiguous) orientation.
  return swizzle_block_scales(row ? q.rowwise_scale_inv : q.columnwise_scale_inv);
}

}  // namespace lowbit
