// Core tensors and the allocator on the CPU.
#include <gtest/gtest.h>

#include "lowbit/core.h"

namespace lowbit {
namespace {

int64_t current(Device d, MemCategory c) {
  return mem_stats(d).by_category[static_cast<int>(c)].current_bytes;
}

TEST(CoreTensor, ShapesStridesAndPackedSizes) {
  Tensor t = Tensor::empty({4, 6}, DType::kBF16, Device::cpu());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48);
  EXPECT_EQ(t.view().strides[0], 6);
  EXPECT_EQ(t.view().strides[1], 1);
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_EQ(t.view().str(), "bf16[4, 6] cpu");
  EXPECT_EQ(Tensor::empty({3, 5}, DType::kE2M1, Device::cpu()).nbytes(), 8);  // 15 nibbles
  EXPECT_EQ(dtype_storage_bytes(DType::kE2M1, 16), 8);
  TensorView r = t.view().reshape({2, 12});
  EXPECT_EQ(r.data, t.data());
  EXPECT_THROW(t.view().reshape({5, 5}), InternalError);
  TensorView strided(t.data(), DType::kBF16, {4, 3}, {6, 2}, Device::cpu());
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_THROW(strided.reshape({12}), InternalError);
}

TEST(CoreTensor, DTypeNamesRoundTrip) {
  for (DType t : kAllDTypes) EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  EXPECT_FALSE(dtype_from_name("e9m9").has_value());
}

TEST(CoreAllocator, CountsCurrentAndPeakPerCategory) {
  const Device cpu = Device::cpu();
  const int64_t w0 = current(cpu, MemCategory::kWeights);
  const int64_t g0 = current(cpu, MemCategory::kGradients);
  mem_reset_peaks(cpu);
  {
    Tensor a = Tensor::zeros({1024}, DType::kF32, cpu, MemCategory::kWeights);
    Tensor b = Tensor::zeros({256}, DType::kBF16, cpu, MemCategory::kGradients);
    EXPECT_EQ(current(cpu, MemCategory::kWeights), w0 + 4096);
    EXPECT_EQ(current(cpu, MemCategory::kGradients), g0 + 512);
    for (int i = 0; i < 1024; ++i) ASSERT_EQ(a.ptr<float>()[i], 0.0f);
  }
  const MemStats s = mem_stats(cpu);
  EXPECT_EQ(s.by_category[static_cast<int>(MemCategory::kWeights)].current_bytes, w0);
  EXPECT_EQ(s.by_category[static_cast<int>(MemCategory::kWeights)].peak_bytes, w0 + 4096);
  EXPECT_GE(s.total.peak_bytes, s.total.current_bytes + 4096 + 512);
  mem_reset_peaks(cpu);
  EXPECT_EQ(mem_stats(cpu).by_category[static_cast<int>(MemCategory::kWeights)].peak_bytes, w0);
}

TEST(CoreTensor, CopiesBetweenViewsAndChecksArguments) {
  Tensor a = Tensor::empty({8}, DType::kF32, Device::cpu());
  for (int i = 0; i < 8; ++i) a.ptr<float>()[i] = static_cast<float>(i);
  Tensor b = Tensor::copy_of(a.view(), Device::cpu());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b.ptr<float>()[i], static_cast<float>(i));
  Tensor c = Tensor::empty({8}, DType::kBF16, Device::cpu());
  EXPECT_THROW(copy_tensor(c.view(), a.view()), InternalError);
  Tensor d = Tensor::empty({7}, DType::kF32, Device::cpu());
  EXPECT_THROW(copy_tensor(d.view(), a.view()), InternalError);
}

TEST(CoreContext, CpuContextWhenNoGpuIsRequested) {
  Context ctx(Device::cpu());
  EXPECT_FALSE(ctx.on_gpu());
  EXPECT_EQ(ctx.stream(), nullptr);
  EXPECT_THROW(ctx.cublaslt(), InternalError);
  void* w = ctx.workspace(4096);
  EXPECT_NE(w, nullptr);
  EXPECT_GE(current(Device::cpu(), MemCategory::kWorkspace), 4096);
  ctx.set_seed(7);
  EXPECT_EQ(ctx.take_rng_offset(), 0u);
  EXPECT_EQ(ctx.take_rng_offset(), 1u);
}

TEST(CoreErrors, CheckMacrosCarryLocationAndMessage) {
  try {
    LOWBIT_CHECK(1 + 1 == 3, "value was {}", 42);
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("test_tensor.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("value was 42"), std::string::npos) << m;
  }
  EXPECT_THROW(LOWBIT_USER_CHECK(false, "bad flag {}", "--x"), UserError);
}

}  // namespace
}  // namespace lowbit
