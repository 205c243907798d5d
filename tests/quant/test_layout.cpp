// Scale layouts (formats.md §2.4–2.6, §4.5–4.6), QuantizedTensor::validate() and the
// configuration checks of quantize().
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lowbit/quant/layout.h"
#include "quant/quant_test_util.h"

namespace lowbit {
namespace {

using namespace quant_test;

TEST(QuantLayout, SwizzleOffsetFormula) {
  // Hand values of offset(r, c) = ((r/128)·(C'/4) + c/4)·512 + (r%32)·16 + ((r%128)/32)·4 + c%4.
  EXPECT_EQ(swizzled_scale_offset(0, 0, 8), 0);
  EXPECT_EQ(swizzled_scale_offset(0, 1, 8), 1);
  EXPECT_EQ(swizzled_scale_offset(1, 0, 8), 16);
  EXPECT_EQ(swizzled_scale_offset(32, 0, 8), 4);
  EXPECT_EQ(swizzled_scale_offset(64, 0, 8), 8);
  EXPECT_EQ(swizzled_scale_offset(96, 3, 8), 15);
  EXPECT_EQ(swizzled_scale_offset(0, 4, 8), 512);
  EXPECT_EQ(swizzled_scale_offset(128, 0, 8), 1024);
  EXPECT_EQ(swizzled_scale_offset(33, 5, 8), 512 + 16 + 4 + 1);
  EXPECT_EQ(swizzled_scale_offset(255, 7, 8), 2047);
}

TEST(QuantLayout, SwizzleMatchesBlockedReshape) {
  // The same map built the way torchao's to_blocked does it, with explicit index arrays:
  // S.view(RB, 128, CB, 4).permute(0, 2, 1, 3) → (RB·CB, 128, 4) → view(-1, 4, 32, 4)
  // → transpose(1, 2) → (-1, 32, 4, 4) → flatten.
  const int64_t rows = 256, cols = 12;  // already padded: 2 × 3 tiles
  std::vector<int64_t> flat;            // flat[position] = r · cols + c
  for (int64_t rb = 0; rb < rows / 128; ++rb) {
    for (int64_t cb = 0; cb < cols / 4; ++cb) {
      // tile[128][4] viewed as [4][32][4] (g, i, cc), transposed to [32][4][4] (i, g, cc).
      for (int64_t i = 0; i < 32; ++i) {
        for (int64_t g = 0; g < 4; ++g) {
          for (int64_t cc = 0; cc < 4; ++cc) {
            flat.push_back((rb * 128 + g * 32 + i) * cols + cb * 4 + cc);
          }
        }
      }
    }
  }
  ASSERT_EQ(static_cast<int64_t>(flat.size()), rows * cols);
  for (int64_t pos = 0; pos < rows * cols; ++pos) {
    const int64_t r = flat[pos] / cols, c = flat[pos] % cols;
    ASSERT_EQ(swizzled_scale_offset(r, c, cols), pos) << r << "," << c;
  }
}

TEST(QuantLayout, SwizzleBlockScalesPadsWithZeros) {
  Tensor s = Tensor::empty({3, 5}, DType::kE8M0, Device::cpu());  // [R, C] compact
  for (int i = 0; i < 15; ++i) s.ptr<uint8_t>()[i] = static_cast<uint8_t>(100 + i);
  const Tensor w = swizzle_block_scales(s);
  ASSERT_EQ(w.shape(), (Shape{128, 8}));
  EXPECT_EQ(w.dtype(), DType::kE8M0);
  int nonzero = 0;
  for (int64_t i = 0; i < w.numel(); ++i) nonzero += w.ptr<uint8_t>()[i] != 0;
  EXPECT_EQ(nonzero, 15);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < 5; ++c) {
      EXPECT_EQ(w.ptr<uint8_t>()[swizzled_scale_offset(r, c, 8)], 100 + r * 5 + c);
    }
  }
  // NVFP4 scales go through the same map (rowwise [M, K/16]).
  Context ctx(Device::cpu());
  QuantizedTensor q;
  quantize(ctx, make_bf16(64, 96, fill_fn(Fill::kGaussian, 3)), QuantConfig::nvfp4_weight(), q);
  const Tensor g = gemm_block_scales(q, Usage::kColumnwise);  // [96, 4] → [128, 4]
  ASSERT_EQ(g.shape(), (Shape{128, 4}));
  EXPECT_EQ(g.ptr<uint8_t>()[swizzled_scale_offset(95, 3, 4)],
            q.columnwise_scale_inv.ptr<uint8_t>()[95 * 4 + 3]);
}

TEST(QuantLayout, ScaleIndexHelpers) {
  EXPECT_EQ(pad4(5), 8);
  EXPECT_EQ(pad128(129), 256);
  EXPECT_EQ(ceil_div(130, 128), 2);
  EXPECT_EQ(vec128_scale_index(3, 2, 5), 2 * 8 + 3);
  EXPECT_EQ(blk128_scale_index(1, 2, 3), 1 * 4 + 2);
}

TEST(QuantLayout, ShapesPerMode) {
  auto l = quant_layout(ScalingMode::kBlock1x128, DType::kE4M3, 65, 300, Usage::kRowwise);
  EXPECT_EQ(l.data_shape, (Shape{65, 300}));
  EXPECT_EQ(l.scale_shape, (Shape{3, 68}));
  l = quant_layout(ScalingMode::kBlock1x128, DType::kE4M3, 65, 300, Usage::kColumnwise);
  EXPECT_EQ(l.data_shape, (Shape{300, 65}));
  EXPECT_EQ(l.scale_shape, (Shape{1, 300}));
  l = quant_layout(ScalingMode::kBlock128x128, DType::kE4M3, 300, 65, Usage::kRowwise);
  EXPECT_EQ(l.scale_shape, (Shape{3, 4}));
  l = quant_layout(ScalingMode::kBlock128x128, DType::kE4M3, 300, 65, Usage::kColumnwise);
  EXPECT_EQ(l.scale_shape, (Shape{1, 4}));
  l = quant_layout(ScalingMode::kMX1x32, DType::kE2M1, 64, 96, Usage::kColumnwise);
  EXPECT_EQ(l.data_shape, (Shape{96, 64}));  // transposed, like every columnwise copy
  EXPECT_EQ(l.scale_shape, (Shape{96, 2}));
  EXPECT_EQ(l.scale_dtype, DType::kE8M0);
  l = quant_layout(ScalingMode::kNVFP4_1x16, DType::kE2M1, 64, 96, Usage::kColumnwise);
  EXPECT_EQ(l.data_shape, (Shape{96, 64}));  // transposed
  EXPECT_EQ(l.scale_shape, (Shape{96, 4}));
  EXPECT_EQ(l.scale_dtype, DType::kUE4M3);
  l = quant_layout(ScalingMode::kPerTensor, DType::kE5M2, 7, 9, Usage::kColumnwise);
  EXPECT_EQ(l.data_shape, (Shape{9, 7}));
  EXPECT_EQ(l.scale_shape, (Shape{1}));
}

// Expects validate() to throw with `needle` in the message.
void expect_invalid(const QuantizedTensor& q, const std::string& needle) {
  try {
    q.validate();
    ADD_FAILURE() << "validate() accepted: " << needle;
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(QuantValidate, ReportsTheFirstBadField) {
  Context ctx(Device::cpu());
  const Tensor x = make_bf16(64, 96, fill_fn(Fill::kGaussian, 1));
  QuantizedTensor good;
  quantize(ctx, x, QuantConfig::fp8_block_1x128(), good);
  EXPECT_NO_THROW(good.validate());

  QuantizedTensor q = good;
  q.rowwise_scale_inv = Tensor();
  expect_invalid(q, "rowwise_scale_inv must be f32[1, 64] [ceil(K/128), pad4(M)] (VEC128)");
  q = good;
  q.columnwise_scale_inv = Tensor::zeros({1, 64}, DType::kF32, Device::cpu());
  expect_invalid(q, "columnwise_scale_inv must be f32[1, 96]");
  q = good;
  q.columnwise_data = Tensor::zeros({64, 96}, DType::kE4M3, Device::cpu());
  expect_invalid(q, "columnwise_data must be e4m3[96, 64] (transposed)");
  q = good;
  q.rowwise_data = Tensor();
  q.columnwise_data = Tensor();
  expect_invalid(q, "holds neither a rowwise nor a columnwise copy");
  q = good;
  q.dtype = DType::kE2M1;
  expect_invalid(q, "takes element type e4m3 or e5m2");

  QuantizedTensor nv;
  quantize(ctx, x, QuantConfig::nvfp4_activation(), nv);
  EXPECT_NO_THROW(nv.validate());
  q = nv;
  q.amax = Tensor();
  expect_invalid(q, "amax must be f32 [1] (NVFP4 rowwise global amax)");
  q = nv;
  q.columnwise_amax = Tensor();
  expect_invalid(q, "columnwise_amax must be f32 [1]");
  q = nv;
  q.mode = ScalingMode::kNVFP4_16x16;
  expect_invalid(q, "columnwise_hadamard is set");

  QuantizedTensor mx;
  quantize(ctx, x, QuantConfig::mx(), mx);
  q = mx;
  q.columnwise_data = Tensor::zeros({64, 96}, DType::kE4M3, Device::cpu());
  expect_invalid(q, "columnwise_data must be e4m3[96, 64]");
  q = mx;
  q.rowwise_scale_inv = Tensor::zeros({64, 3}, DType::kUE4M3, Device::cpu());
  expect_invalid(q, "rowwise_scale_inv must be e8m0[64, 3] [M, K/32] (compact)");
}

TEST(QuantValidate, ConfigErrors) {
  Context ctx(Device::cpu());
  QuantizedTensor q;
  const Tensor x = make_bf16(64, 96, fill_fn(Fill::kGaussian, 1));
  QuantConfig c = QuantConfig::fp8_current();
  c.dtype = DType::kE2M1;
  EXPECT_THROW(quantize(ctx, x, c, q), UserError);
  c = QuantConfig::nvfp4_weight();
  c.dtype = DType::kE4M3;
  EXPECT_THROW(quantize(ctx, x, c, q), UserError);
  c = QuantConfig::fp8_current();
  c.rowwise = c.columnwise = false;
  EXPECT_THROW(quantize(ctx, x, c, q), UserError);
  const Tensor x3 = Tensor::zeros({2, 3, 4}, DType::kBF16, Device::cpu());
  EXPECT_THROW(quantize(ctx, x3, QuantConfig::fp8_current(), q), UserError);
  const Tensor xi = Tensor::zeros({2, 4}, DType::kI32, Device::cpu());
  EXPECT_THROW(quantize(ctx, xi, QuantConfig::fp8_current(), q), UserError);
  EXPECT_THROW(dequantize(QuantizedTensor{}, Usage::kRowwise), InternalError);
}

TEST(QuantValidate, CudaTensorNeedsACudaContext) {
  // A CUDA view (never dereferenced) with a CPU context: refused before any memory is touched.
  const TensorView xg(nullptr, DType::kBF16, {64, 96}, Device::cuda(0));
  Context ctx(Device::cpu());
  QuantizedTensor q;
  try {
    quantize(ctx, xg, QuantConfig::fp8_current(), q);
    FAIL() << "CUDA tensor accepted by a CPU context";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("context on cpu"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lowbit
