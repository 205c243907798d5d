// RoPE on the GPU against the CPU twin, bit for bit (the rotation is the same sequence of RN fp32
// operations): head layouts from the standard shapes, fused-qkv strided views in place, the
// scalar fallback, the table, and bandwidth.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "lowbit/ops.h"
#include "ops/op_harness.h"

namespace lowbit::test {
namespace {

struct Heads {
  int64_t b, t, h, dh;
};
// 1×16, 65×80, 993×512 and 16384×768 as [B, T, nH, Dh], plus a Dh whose half is not a multiple
// of 8 (scalar path).
const Heads kHeads[] = {
    {1, 1, 1, 16}, {1, 65, 1, 80}, {1, 993, 4, 128}, {4, 4096, 6, 128}, {2, 9, 3, 12}};

// A host table [T, Dh/2, 2] for the harness to fill from (LLaMA-3 scaling on, as in Llama 3.1).
std::shared_ptr<Tensor> host_table(int64_t positions, int64_t dh) {
  RopeConfig cfg;
  cfg.theta = 500000.0f;
  cfg.factor = 8.0f;
  auto t =
      std::make_shared<Tensor>(Tensor::empty({positions, dh / 2, 2}, DType::kF32, Device::cpu()));
  Context ctx(Device::cpu());
  rope_table(ctx, *t, cfg);
  return t;
}

ArgSpec table_arg(const std::shared_ptr<Tensor>& t) {
  return in("table", DType::kF32, t->shape(),
            Fill::custom("rope_table", [t](int64_t i) { return double(t->ptr<float>()[i]); }));
}

OpCase rope_case(Heads s, const Fill& fill, bool bwd, bool in_place) {
  auto table = host_table(s.t, s.dh);
  OpCase c;
  c.name = fmt::format("{} [{}, {}, {}, {}] {}{}", bwd ? "rope_bwd" : "rope_fwd", s.b, s.t, s.h,
                       s.dh, fill.name(), in_place ? " in place" : "");
  const Shape shape{s.b, s.t, s.h, s.dh};
  if (in_place) {
    c.args = {inout("x", DType::kBF16, shape, fill), table_arg(table)};
  } else {
    c.args = {in("x", DType::kBF16, shape, fill), out("y", DType::kBF16, shape), table_arg(table)};
  }
  c.run = [bwd, in_place](Context& ctx, const Args& a) {
    const TensorView& y = in_place ? a["x"] : a["y"];
    if (bwd) {
      rope_bwd(ctx, y, a["x"], a["table"]);
    } else {
      rope_fwd(ctx, y, a["x"], a["table"]);
    }
  };
  return c;
}

TEST(GpuRope, MatchesCpuBitForBit) {
  for (const Heads& s : kHeads) {
    for (const Fill& fill : standard_fills()) {
      for (bool bwd : {false, true}) EXPECT_TRUE(compare_cpu_gpu(rope_case(s, fill, bwd, false)));
    }
    EXPECT_TRUE(compare_cpu_gpu(rope_case(s, Fill::gaussian(), false, true)));
  }
}

// q and k rotated in place inside a fused qkv [B, T, H + 2·Hkv, Dh]; v must stay untouched (the
// harness compares the whole buffer, and guards its ends).
TEST(GpuRope, FusedQkvViewsInPlace) {
  for (int64_t dh : {int64_t(64), int64_t(128), int64_t(12)}) {
    const int64_t nb = 2, nt = 33, h = 8, hkv = 2, w = h + 2 * hkv;
    auto table = host_table(nt, dh);
    OpCase c;
    c.name = fmt::format("rope qkv Dh={}", dh);
    c.args = {inout("qkv", DType::kBF16, {nb, nt, w, dh}, Fill::gaussian()), table_arg(table)};
    c.run = [=](Context& ctx, const Args& a) {
      const TensorView& qkv = a["qkv"];
      const Shape st{nt * w * dh, w * dh, dh, 1};
      TensorView q(qkv.data, DType::kBF16, {nb, nt, h, dh}, st, qkv.device);
      TensorView k(static_cast<uint16_t*>(qkv.data) + h * dh, DType::kBF16, {nb, nt, hkv, dh}, st,
                   qkv.device);
      rope_fwd(ctx, q, q, a["table"]);
      rope_bwd(ctx, k, k, a["table"]);
    };
    EXPECT_TRUE(compare_cpu_gpu(c));
  }
}

TEST(GpuRope, TableIsIdenticalOnBothDevices) {
  RopeConfig cfg;
  cfg.theta = 500000.0f;
  cfg.factor = 8.0f;
  Context cpu(Device::cpu()), gpu(Device::cuda(0));
  Tensor a = Tensor::empty({4096, 64, 2}, DType::kF32, Device::cpu());
  Tensor b = Tensor::empty({4096, 64, 2}, DType::kF32, Device::cuda(0));
  rope_table(cpu, a, cfg);
  rope_table(gpu, b, cfg);
  Tensor bh = Tensor::copy_of(b.view(), Device::cpu());
  EXPECT_EQ(std::memcmp(a.data(), bh.data(), size_t(a.nbytes())), 0);
}

TEST(GpuRopePerf, Bandwidth) {
  Context ctx(Device::cuda(0));
  for (int64_t d : {768, 2048}) {
    const Heads s{4, 4096, d / 128, 128};
    const double bytes = 2.0 * 16384 * d * 2;
    const double copy = copy_gbps(ctx, 16384 * d * 2);
    const Perf f = time_op(ctx, rope_case(s, Fill::gaussian(), false, false), bytes);
    const Perf ip = time_op(ctx, rope_case(s, Fill::gaussian(), false, true), bytes);
    std::printf("rope N=16384 D=%ld: copy %.0f GB/s | fwd %s (%.0f%%) | in place %s (%.0f%%)\n",
                long(d), copy, f.str().c_str(), 100 * f.gb_per_s / copy, ip.str().c_str(),
                100 * ip.gb_per_s / copy);
  }
}

}  // namespace
}  // namespace lowbit::test
