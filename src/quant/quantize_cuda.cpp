// CUDA path of quantize(): allocates the GEMM-ready output tensors on the source's device and
// launches the kernels of src/quant/*.cu. Layouts come from quant_layout(), the same function
// the CPU twin's tensors follow, so CPU and GPU results compare byte for byte.
#include <cuda_runtime.h>

#include "lowbit/core/cuda_check.h"
#include "lowbit/quant.h"
#include "quant/quant_cuda.h"
#include "quant/quant_ref.h"

namespace lowbit {

namespace {

// A zeroed small device tensor, the fill ordered on ctx's stream.
Tensor zeros_on(Context& ctx, Shape shape, DType t, MemCategory cat) {
  Tensor z = Tensor::empty(shape, t, ctx.device(), cat);
  fill_bytes_on(z, 0, ctx.stream());
  return z;
}

Tensor alloc_copy_data(Context& ctx, const QuantizedTensor& out, Usage u, Tensor* scale) {
  const QuantLayout l = quant_layout(out.mode, out.dtype, out.shape[0], out.shape[1], u);
  Tensor data = Tensor::empty(l.data_shape, l.data_dtype, ctx.device(), MemCategory::kActivations);
  // FP8 block scales are zeroed: their layouts pad to multiples of 4 (and the kernels skip the
  // padding). MX and NVFP4 layouts are compact and their kernels write every scale (the GPU
  // tests run with LOWBIT_POISON_ALLOC=1 to prove it), so they skip the fill. Per-tensor scaling
  // sets its own one-element scale_inv (run_per_tensor).
  if (out.mode == ScalingMode::kBlock1x128 || out.mode == ScalingMode::kBlock128x128) {
    *scale = zeros_on(ctx, l.scale_shape, l.scale_dtype, MemCategory::kActivations);
  } else if (out.mode != ScalingMode::kPerTensor) {
    *scale = Tensor::empty(l.scale_shape, l.scale_dtype, ctx.device(), MemCategory::kActivations);
  }
  return data;
}

// The payload tensors cfg asks for, with their scale tensors.
void alloc_copies(Context& ctx, const QuantConfig& cfg, QuantizedTensor& out) {
  if (cfg.rowwise) {
    out.rowwise_data = alloc_copy_data(ctx, out, Usage::kRowwise, &out.rowwise_scale_inv);
  }
  if (cfg.columnwise) {
    out.columnwise_data = alloc_copy_data(ctx, out, Usage::kColumnwise, &out.columnwise_scale_inv);
  }
}

// FP8 per-tensor scaling (current or delayed) into out's allocated copies. T is the source's
// element type as the kernels read it: uint16_t (bf16), float, or quant_cuda::Bf16RoundedF32
// (an f32 source rounded to bf16 on load).
template <typename T>
void run_per_tensor(Context& ctx, const TensorView& x, const QuantConfig& cfg,
                    QuantizedTensor& out) {
  const T* src = static_cast<const T*>(x.data);
  const int64_t m = x.size(0), k = x.size(1);
  const Device dev = x.device;
  cudaStream_t stream = ctx.stream();
  const bool e5m2 = cfg.dtype == DType::kE5M2;
  const float fmax = dtype_max_finite(cfg.dtype);
  auto u8 = [](Tensor& t) { return t.defined() ? t.ptr<uint8_t>() : nullptr; };
  LOWBIT_USER_CHECK(!cfg.stochastic_rounding,
                    "stochastic rounding of per-tensor FP8 is not implemented on the GPU; "
                    "it is available for NVFP4 and MX payloads");
  // v12 current scaling on a non-empty source: amax, scale and scale_inv all come from the
  // last block of quant_cuda::amax_scale, so nothing is zeroed first.
  const bool one_pass_scale =
      cfg.delayed == nullptr && m * k > 0 && quant_cuda::quant_kernels_version() >= 12;
  out.amax = one_pass_scale ? Tensor::empty({1}, DType::kF32, dev, MemCategory::kWorkspace)
                            : zeros_on(ctx, {1}, DType::kF32, MemCategory::kWorkspace);
  // Written by the cast kernel (delayed), amax_scale or the scale kernel (current): no fill.
  Tensor scale_inv = m * k > 0 ? Tensor::empty({1}, DType::kF32, dev, MemCategory::kWorkspace)
                               : zeros_on(ctx, {1}, DType::kF32, MemCategory::kWorkspace);
  const float* scale_ptr;
  Tensor scale;
  float* cast_scale_inv = scale_inv.ptr<float>();
  if (one_pass_scale) {
    scale = Tensor::empty({1}, DType::kF32, dev, MemCategory::kWorkspace);
    quant_cuda::amax_scale(src, m, k, fmax, cfg.effective_pow2(), cfg.amax_epsilon,
                           ctx.reduction_words(), out.amax.ptr<float>(), scale.ptr<float>(),
                           scale_inv.ptr<float>(), stream);
    scale_ptr = scale.ptr<float>();
    cast_scale_inv = nullptr;  // already written
  } else if (cfg.delayed != nullptr) {
    LOWBIT_USER_CHECK(cfg.delayed->scale().device() == dev,
                      "delayed scaling: the state lives on {} but the tensor on {}; create "
                      "the DelayedScalingState on the tensor's device",
                      cfg.delayed->scale().device().str(), dev.str());
    scale_ptr = cfg.delayed->scale().ptr<float>() + cfg.delayed_slot;
  } else {
    // Current scaling: amax pass, scale, then the cast (formats.md §2.3).
    scale = Tensor::empty({1}, DType::kF32, dev, MemCategory::kWorkspace);
    quant_cuda::amax(src, m * k, out.amax.ptr<float>(), stream);
    quant_cuda::current_scale(out.amax.ptr<float>(), fmax, cfg.effective_pow2(), cfg.amax_epsilon,
                              scale.ptr<float>(), scale_inv.ptr<float>(), stream);
    scale_ptr = scale.ptr<float>();
  }
  float* amax_out = cfg.delayed != nullptr ? out.amax.ptr<float>() : nullptr;
  // Delayed scaling: the cast also folds this tensor's amax into the current history row
  // (max with earlier casts of the step).
  float* row0 = cfg.delayed != nullptr ? cfg.delayed->amax_history().ptr<float>() + cfg.delayed_slot
                                       : nullptr;
  quant_cuda::fp8_cast_transpose(src, m, k, scale_ptr, e5m2, u8(out.rowwise_data),
                                 u8(out.columnwise_data), cast_scale_inv, amax_out, row0, stream);
  // Both copies share the one scale (the tensor is read-only from here on).
  if (cfg.rowwise) out.rowwise_scale_inv = scale_inv;
  if (cfg.columnwise) out.columnwise_scale_inv = scale_inv;
}

template <typename T>
void run(Context& ctx, const TensorView& x, const QuantConfig& cfg, const QuantStreams& streams,
         QuantizedTensor& out) {
  const T* src = x.ptr<const T>();
  const int64_t m = x.size(0), k = x.size(1);
  const Device dev = x.device;
  cudaStream_t stream = ctx.stream();
  const bool e5m2 = cfg.dtype == DType::kE5M2;
  const float fmax = dtype_max_finite(cfg.dtype);
  Tensor* rs = &out.rowwise_scale_inv;
  Tensor* cs = &out.columnwise_scale_inv;
  auto u8 = [](Tensor& t) { return t.defined() ? t.ptr<uint8_t>() : nullptr; };
  auto f32 = [](Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; };
  alloc_copies(ctx, cfg, out);

  switch (cfg.mode) {
    case ScalingMode::kPerTensor: run_per_tensor<T>(ctx, x, cfg, out); break;
    case ScalingMode::kBlock1x128:
    case ScalingMode::kBlock128x128: {
      LOWBIT_USER_CHECK(!cfg.stochastic_rounding,
                        "stochastic rounding of FP8 block scaling is not implemented on the GPU");
      quant_cuda::fp8_block(src, m, k, cfg.mode == ScalingMode::kBlock128x128, e5m2, fmax,
                            cfg.effective_pow2(), cfg.amax_epsilon, dtype_max_finite(x.dtype),
                            u8(out.rowwise_data), f32(*rs), u8(out.columnwise_data), f32(*cs),
                            nullptr, stream);
      break;
    }
    case ScalingMode::kMX1x32: {
      quant_cuda::mx(src, m, k, cfg.dtype, cfg.mx_rounding, cfg.rowwise, cfg.columnwise,
                     streams.stochastic, streams.rowwise, streams.columnwise, u8(out.rowwise_data),
                     u8(*rs), u8(out.columnwise_data), u8(*cs), stream);
      break;
    }
    case ScalingMode::kNVFP4_1x16:
    case ScalingMode::kNVFP4_16x16: {
      const bool two_d = cfg.mode == ScalingMode::kNVFP4_16x16;
      const bool rht = cfg.hadamard_columnwise && !two_d && cfg.columnwise;
      LOWBIT_USER_CHECK(!rht || x.dtype == DType::kBF16,
                        "the Hadamard transform takes bf16 input (formats.md §5.2); got {}",
                        dtype_name(x.dtype));
      // Written by the amax pass (quant_cuda::nvfp4 zeroes them where its kernel needs it).
      Tensor amax_row = Tensor::empty({1}, DType::kF32, dev, MemCategory::kWorkspace);
      Tensor amax_col = Tensor::empty({1}, DType::kF32, dev, MemCategory::kWorkspace);
      // The 2D transposed copy takes the same per-tile scales as the rowwise copy (the kernel
      // computes them per 16×16 tile whichever copies are asked for).
      quant_cuda::nvfp4(src, m, k, cfg.rowwise, cfg.columnwise, rht, streams.stochastic, two_d,
                        streams.rowwise, streams.columnwise, u8(out.rowwise_data), u8(*rs),
                        u8(out.columnwise_data), u8(*cs), amax_row.ptr<float>(),
                        amax_col.ptr<float>(), false, ctx.reduction_words(), stream);
      if (cfg.rowwise) out.amax = amax_row;
      if (cfg.columnwise) {
        out.columnwise_amax = two_d ? Tensor::copy_of(amax_row.view(), dev) : amax_col;
        out.columnwise_hadamard = rht;
      }
      break;
    }
  }
}

}  // namespace

void quantize_cuda(Context& ctx, const TensorView& x, const QuantConfig& cfg,
                   const QuantStreams& streams, QuantizedTensor& out) {
  LOWBIT_CHECK(ctx.on_gpu() && ctx.device() == x.device, "quantize: context on {} but tensor on {}",
               ctx.device().str(), x.device.str());
  LOWBIT_CHECK(x.is_contiguous(), "CUDA quantize needs a contiguous [M, K] source, got {}",
               x.str());
  out = QuantizedTensor{};
  out.mode = cfg.mode;
  out.dtype = cfg.dtype;
  out.shape = x.shape;
  if (x.dtype == DType::kBF16) {
    run<uint16_t>(ctx, x, cfg, streams, out);
  } else if (!cfg.round_source_to_bf16) {
    run<float>(ctx, x, cfg, streams, out);
  } else if (cfg.mode == ScalingMode::kPerTensor) {
    // The cast reads the f32 source and rounds it to bf16 on load: no bf16 copy in memory.
    alloc_copies(ctx, cfg, out);
    run_per_tensor<quant_cuda::Bf16RoundedF32>(ctx, x, cfg, out);
  } else {
    // The other quantizers read bf16: round into a transient copy first.
    Tensor rounded = Tensor::empty(x.shape, DType::kBF16, x.device, MemCategory::kWorkspace);
    quant_cuda::round_to_bf16(x.ptr<const float>(), x.numel(), rounded.ptr<uint16_t>(),
                              ctx.stream());
    run<uint16_t>(ctx, rounded.view(), cfg, streams, out);
  }
}

}  // namespace lowbit
