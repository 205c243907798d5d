// Core on a GPU: device tensors, copies both ways, the allocator's accounting, the context.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lowbit/core.h"

namespace lowbit {
namespace {

TEST(GpuCore, TensorRoundTripAndAccounting) {
  ASSERT_GT(cuda_device_count(), 0) << "the GPU tests need a CUDA GPU (run them on a GPU host)";
  const Device gpu = Device::cuda(0);
  const int64_t before =
      mem_stats(gpu).by_category[static_cast<int>(MemCategory::kActivations)].current_bytes;
  std::vector<float> host(65 * 80);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f - 7.0f;
  TensorView hv(host.data(), DType::kF32, {65, 80}, Device::cpu());
  {
    Tensor d = Tensor::copy_of(hv, gpu, MemCategory::kActivations);
    EXPECT_EQ(d.device(), gpu);
    const MemStats s = mem_stats(gpu);
    EXPECT_EQ(s.by_category[static_cast<int>(MemCategory::kActivations)].current_bytes,
              before + 65 * 80 * 4);
    Tensor back = Tensor::copy_of(d.view(), Device::cpu());
    for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(back.ptr<float>()[i], host[i]);
    Tensor z = Tensor::zeros({3, 17}, DType::kE2M1, gpu);
    EXPECT_EQ(z.nbytes(), (3 * 17 + 1) / 2);
  }
  const MemStats after = mem_stats(gpu);
  EXPECT_EQ(after.by_category[static_cast<int>(MemCategory::kActivations)].current_bytes, before);
  EXPECT_GE(after.by_category[static_cast<int>(MemCategory::kActivations)].peak_bytes,
            before + 65 * 80 * 4);
}

TEST(GpuCore, ContextOwnsStreamHandleAndWorkspace) {
  ASSERT_GT(cuda_device_count(), 0);
  Context ctx = Context::create_default();
  EXPECT_TRUE(ctx.on_gpu());
  EXPECT_NE(ctx.stream(), nullptr);
  EXPECT_NE(ctx.cublaslt(), nullptr);
  void* w = ctx.workspace(1 << 20);
  EXPECT_NE(w, nullptr);
  EXPECT_EQ(ctx.workspace(1 << 10), w);  // no reallocation for a smaller request
  EXPECT_GE(
      mem_stats(ctx.device()).by_category[static_cast<int>(MemCategory::kWorkspace)].current_bytes,
      1 << 20);
  ctx.synchronize();
}

// fill_bytes_on: a small fill (a PDL kernel) and a large one (cudaMemsetAsync) on the context's
// stream, each ordered after the fill before it on the same bytes and before the read back.
TEST(GpuCore, StreamFillsSmallAndLargeInOrder) {
  ASSERT_GT(cuda_device_count(), 0) << "the GPU tests need a CUDA GPU (run them on a GPU host)";
  Context ctx = Context::create_default();
  for (const int64_t n :
       {int64_t(1), int64_t(5), int64_t(4095), int64_t(4096), int64_t(4097), int64_t(1) << 20}) {
    Tensor t = Tensor::empty({n + 64}, DType::kU8, ctx.device());  // [n + 64] guard after n
    fill_bytes_on(t.view(), 0xAB, ctx.stream());
    fill_bytes_on(TensorView(t.data(), DType::kU8, {n}, ctx.device()), 0x5C, ctx.stream());
    ctx.synchronize();
    const Tensor h = Tensor::copy_of(t.view(), Device::cpu());
    const uint8_t* p = h.ptr<uint8_t>();
    int64_t bad = -1;
    for (int64_t i = 0; i < n + 64 && bad < 0; ++i) {
      if (p[i] != (i < n ? 0x5C : 0xAB)) bad = i;
    }
    EXPECT_EQ(bad, -1) << "fill of " << n << " bytes: first wrong byte at " << bad;
  }
}

}  // namespace
}  // namespace lowbit
