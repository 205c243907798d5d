// Fused cross-entropy on the GPU against the CPU twin, through the op harness (poisoned outputs,
// guard bytes around every buffer), over vocabulary sizes that exercise every row layout (V = 1,
// 8, 17, 4099, 32000, 50257: rows not 16-byte aligned; 128256: rows longer than the shared-memory
// cache) and the standard fills (zeros, gaussian, near the bf16 max, subnormals, ±inf/NaN).
//
// Tolerance, per element, from the kernel's arithmetic (the twin is exact to fp64 then rounded):
// the row sum s has, per thread, up to V/32 fp32 additions (blocks of ≥ 32·8 elements per warp
// and a sequential sum per thread) and a few ulps per ex2.approx, so s, log s and every
// probability are within c·u32 relatively, c = 16 + V/32; the loss adds one rounding, the
// gradient one bf16 rounding (2·u_bf16 relative) and, next to the target where softmax − 1
// cancels, c·u32·grad_scale absolutely.
//
// Also: in place and out of place give the same bits, two runs give the same bits, a dlogits
// buffer of another alignment than the logits, a bad target (NaN row), and the timing of the
// 16384 × 32000 bf16 case (PyTorch's fused loss + backward: 9.8 ms on an H100).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lowbit/ops.h"
#include "ops/cross_entropy_impl.h"
#include "ops/op_harness.h"

namespace lowbit {
namespace {

using test::Args;
using test::Fill;

constexpr double kU32 = 0x1p-24;

test::Tol loss_tol(int64_t V) {
  test::Tol t;
  const double c = 16.0 + double(V) / 32.0;
  t.rel = 4 * kU32;
  t.abs = c * kU32;
  return t;
}

test::Tol grad_tol(int64_t V, float grad_scale) {
  test::Tol t;
  const double c = 16.0 + double(V) / 32.0;
  t.rel = 2 * test::unit_roundoff(DType::kBF16) + c * kU32;
  t.abs = test::subnormal_step(DType::kBF16) + c * kU32 * std::fabs(grad_scale);
  return t;
}

test::OpCase ce_case(int64_t n, int64_t V, const Fill& logits, float grad_scale,
                     bool in_place = false) {
  test::OpCase c;
  c.name =
      fmt::format("cross_entropy {}x{} {}{}", n, V, logits.name(), in_place ? " in place" : "");
  // Targets in [-1, V): -1 (ignore_index) marks a few rows as ignored.
  const Fill targets = Fill::ints(V > 1 ? -1 : 0, V);
  if (in_place) {
    c.args = {test::inout("logits", DType::kBF16, {n, V}, logits, grad_tol(V, grad_scale)),
              test::in("targets", DType::kI32, {n}, targets),
              test::out("losses", DType::kF32, {n}, loss_tol(V))};
    c.run = [grad_scale](Context& ctx, const Args& a) {
      const TensorView lg = a["logits"];
      cross_entropy_fwd_bwd(ctx, a["losses"], &lg, lg, a["targets"], -1, grad_scale);
    };
  } else {
    c.args = {test::in("logits", DType::kBF16, {n, V}, logits),
              test::in("targets", DType::kI32, {n}, targets),
              test::out("losses", DType::kF32, {n}, loss_tol(V)),
              test::out("dlogits", DType::kBF16, {n, V}, grad_tol(V, grad_scale))};
    c.run = [grad_scale](Context& ctx, const Args& a) {
      const TensorView dl = a["dlogits"];
      cross_entropy_fwd_bwd(ctx, a["losses"], &dl, a["logits"], a["targets"], -1, grad_scale);
    };
  }
  return c;
}

struct Shape2 {
  int64_t n, V;
};

TEST(CrossEntropyGpu, MatchesCpuTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const Shape2 shapes[] = {{5, 1},     {9, 8},     {33, 17},   {16, 4099},
                           {8, 32000}, {5, 50257}, {2, 128256}};
  for (const Shape2 s : shapes) {
    for (const Fill& f :
         {Fill::gaussian(2.0), Fill::zeros(), Fill::large(), Fill::small(), Fill::specials(3.0)}) {
      EXPECT_TRUE(test::compare_cpu_gpu(ce_case(s.n, s.V, f, 1.0f / 4096)));
    }
  }
  // Peaked rows (softmax close to one-hot) and in place.
  EXPECT_TRUE(test::compare_cpu_gpu(ce_case(12, 32000, Fill::gaussian(8.0), 0.5f)));
  EXPECT_TRUE(test::compare_cpu_gpu(ce_case(12, 32000, Fill::gaussian(2.0), 0.5f, true)));
  EXPECT_TRUE(test::compare_cpu_gpu(ce_case(6, 50257, Fill::specials(2.0), 0.5f, true)));
  // Without dlogits.
  test::OpCase c = ce_case(12, 1000, Fill::gaussian(), 1.0f);
  c.args.pop_back();
  c.run = [](Context& ctx, const Args& a) {
    cross_entropy_fwd_bwd(ctx, a["losses"], nullptr, a["logits"], a["targets"], -1, 1.0f);
  };
  EXPECT_TRUE(test::compare_cpu_gpu(c));
}

// The cluster kernel (a row per cluster of blocks, each holding a slice in shared memory), which
// cross_entropy_fwd_bwd does not choose by default: on the GPU through its config, on the CPU the
// twin. Rows of odd V start off 16-byte boundaries (head and tail elements on block 0).
TEST(CrossEntropyGpu, ClusterKernelMatchesCpuTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const Shape2 shapes[] = {{9, 4099}, {5, 50257}, {3, 128256}};
  for (const Shape2 s : shapes) {
    for (const ops_detail::CeConfig& cfg :
         {ops_detail::cross_entropy_cluster_config(s.V), ops_detail::CeConfig{512, 2, 4, 0, 3},
          ops_detail::CeConfig{256, 3, 8, 0, 8}}) {
      for (const bool in_place : {false, true}) {
        for (const Fill& f :
             {Fill::gaussian(2.0), Fill::zeros(), Fill::large(), Fill::specials(3.0)}) {
          test::OpCase c = ce_case(s.n, s.V, f, 1.0f / 4096, in_place);
          c.name += fmt::format(" cluster {}x{}", cfg.cluster, cfg.threads);
          c.run = [cfg, in_place](Context& ctx, const Args& a) {
            const TensorView dl = in_place ? a["logits"] : a["dlogits"];
            if (ctx.on_gpu()) {
              // Not a silent fallback to the one-block kernel.
              EXPECT_TRUE(ops_detail::cross_entropy_runs_on_clusters(cfg, a["logits"], &dl));
              ops_detail::cross_entropy_cuda(ctx, a["losses"], &dl, a["logits"], a["targets"], -1,
                                             1.0f / 4096, &cfg);
            } else {
              cross_entropy_fwd_bwd(ctx, a["losses"], &dl, a["logits"], a["targets"], -1,
                                    1.0f / 4096);
            }
          };
          EXPECT_TRUE(test::compare_cpu_gpu(c));
        }
      }
    }
  }
}

std::vector<uint8_t> host_bytes(const TensorView& t) {
  Tensor h = Tensor::copy_of(t, Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// Logits [n, V] bf16 gaussian (stddev 2) and targets [n] in [-1, V), on the GPU.
struct Problem {
  Tensor logits, targets;
  Problem(int64_t n, int64_t V, uint64_t seed) {
    Tensor lh = Tensor::empty({n, V}, DType::kBF16, Device::cpu());
    for (int64_t i = 0; i < n * V; ++i) {
      lh.ptr<uint16_t>()[i] =
          f32_to_bf16_rn(static_cast<float>(2.0 * test::detail::philox_gauss(seed, 1, i)));
    }
    Tensor th = Tensor::empty({n}, DType::kI32, Device::cpu());
    for (int64_t i = 0; i < n; ++i) {
      th.ptr<int32_t>()[i] = int32_t(philox_uint32(seed, 2, uint64_t(i)) % uint32_t(V + 1)) - 1;
    }
    logits = Tensor::copy_of(lh.view(), Device::cuda(0));
    targets = Tensor::copy_of(th.view(), Device::cuda(0));
  }
};

TEST(CrossEntropyGpu, InPlaceOutOfPlaceAndRepeatedRunsGiveTheSameBits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Context ctx(Device::cuda(0));
  for (const Shape2 s : {Shape2{64, 32000}, Shape2{9, 50257}, Shape2{2, 128256}}) {
    // The default kernel, then the cluster kernel.
    const ops_detail::CeConfig cluster = ops_detail::cross_entropy_cluster_config(s.V);
    for (const ops_detail::CeConfig* cfg :
         {static_cast<const ops_detail::CeConfig*>(nullptr), &cluster}) {
      SCOPED_TRACE(fmt::format("{}x{}{}", s.n, s.V, cfg ? " cluster" : ""));
      Problem p(s.n, s.V, 3);
      Tensor d1 = Tensor::empty({s.n, s.V}, DType::kBF16, ctx.device());
      Tensor d2 = Tensor::empty({s.n, s.V}, DType::kBF16, ctx.device());
      Tensor l1 = Tensor::empty({s.n}, DType::kF32, ctx.device());
      Tensor l2 = Tensor::empty({s.n}, DType::kF32, ctx.device());
      Tensor l3 = Tensor::empty({s.n}, DType::kF32, ctx.device());
      const TensorView d1v = d1.view(), d2v = d2.view(), lgv = p.logits.view();
      if (cfg != nullptr) {
        EXPECT_TRUE(ops_detail::cross_entropy_runs_on_clusters(*cfg, lgv, &d1v));
        EXPECT_TRUE(ops_detail::cross_entropy_runs_on_clusters(*cfg, lgv, &lgv));
      }
      ops_detail::cross_entropy_cuda(ctx, l1, &d1v, p.logits, p.targets, -1, 0.25f, cfg);
      ops_detail::cross_entropy_cuda(ctx, l2, &d2v, p.logits, p.targets, -1, 0.25f, cfg);
      // In place.
      ops_detail::cross_entropy_cuda(ctx, l3, &lgv, p.logits, p.targets, -1, 0.25f, cfg);
      ctx.synchronize();
      EXPECT_EQ(host_bytes(l1), host_bytes(l2));
      EXPECT_EQ(host_bytes(d1), host_bytes(d2));
      EXPECT_EQ(host_bytes(l1), host_bytes(l3));
      EXPECT_EQ(host_bytes(d1), host_bytes(p.logits));
    }
  }
}

TEST(CrossEntropyGpu, DlogitsWithAnotherAlignment) {
  // dlogits starting 2 bytes after a 16-byte boundary while the logits start on one: the
  // gradient pass cannot use the logits' vectors and goes element by element.
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (const Shape2 s : {Shape2{5, 4096}, Shape2{3, 50257}}) {
    test::OpCase c = ce_case(s.n, s.V, Fill::gaussian(2.0), 0.5f);
    c.args.back().shape = {s.n * s.V + 1};  // dlogits storage, one element longer
    c.run = [s](Context& ctx, const Args& a) {
      const TensorView dl(a["dlogits"].ptr<uint16_t>() + 1, DType::kBF16, {s.n, s.V},
                          a["dlogits"].device);
      cross_entropy_fwd_bwd(ctx, a["losses"], &dl, a["logits"], a["targets"], -1, 0.5f);
    };
    EXPECT_TRUE(test::compare_cpu_gpu(c));
  }
}

TEST(CrossEntropyGpu, BadTargetGivesNanRow) {
  // On the GPU a target outside [0, V) cannot be reported without a host synchronisation: the
  // row's loss and gradient are NaN (the NaN guard of the step then skips it); other rows are
  // unaffected.
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Context ctx(Device::cuda(0));
  // At V 128256 also with the cluster kernel (a row per cluster of blocks).
  struct Case {
    int64_t V;
    bool cluster;
  };
  for (const Case k : {Case{1000, false}, Case{128256, false}, Case{128256, true}}) {
    const int64_t V = k.V;
    const bool cluster = k.cluster;
    const int64_t n = 4;
    Problem p(n, V, 5);
    Tensor th = Tensor::copy_of(p.targets.view(), Device::cpu());
    th.ptr<int32_t>()[0] = 3;
    th.ptr<int32_t>()[1] = static_cast<int32_t>(V);
    th.ptr<int32_t>()[2] = -7;
    th.ptr<int32_t>()[3] = static_cast<int32_t>(V - 1);
    Tensor targets = Tensor::copy_of(th.view(), ctx.device());
    Tensor losses = Tensor::empty({n}, DType::kF32, ctx.device());
    Tensor dl = Tensor::empty({n, V}, DType::kBF16, ctx.device());
    const TensorView dlv = dl.view();
    const ops_detail::CeConfig cfg = ops_detail::cross_entropy_cluster_config(V);
    if (cluster) EXPECT_TRUE(ops_detail::cross_entropy_runs_on_clusters(cfg, p.logits, &dlv));
    ops_detail::cross_entropy_cuda(ctx, losses, &dlv, p.logits, targets, -1, 1.0f,
                                   cluster ? &cfg : nullptr);
    Tensor lh = Tensor::copy_of(losses.view(), Device::cpu());
    Tensor dh = Tensor::copy_of(dl.view(), Device::cpu());
    EXPECT_TRUE(std::isfinite(lh.ptr<float>()[0]));
    EXPECT_TRUE(std::isnan(lh.ptr<float>()[1]));
    EXPECT_TRUE(std::isnan(lh.ptr<float>()[2]));
    EXPECT_TRUE(std::isfinite(lh.ptr<float>()[3]));
    for (int64_t j = 0; j < V; ++j) {
      ASSERT_TRUE(std::isfinite(bf16_to_f32(dh.ptr<uint16_t>()[j]))) << j;
      ASSERT_TRUE(std::isnan(bf16_to_f32(dh.ptr<uint16_t>()[V + j]))) << j;
      ASSERT_TRUE(std::isnan(bf16_to_f32(dh.ptr<uint16_t>()[2 * V + j]))) << j;
      ASSERT_TRUE(std::isfinite(bf16_to_f32(dh.ptr<uint16_t>()[3 * V + j]))) << j;
    }
  }
}

TEST(CrossEntropyGpu, Perf) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Context ctx(Device::cuda(0));
  const Shape2 shapes[] = {{16384, 32000}, {4096, 128256}, {8192, 50257}};
  for (const Shape2 s : shapes) {
    Problem p(s.n, s.V, 7);
    Tensor losses = Tensor::empty({s.n}, DType::kF32, ctx.device());
    const TensorView lg = p.logits.view();
    // In place, as the model calls it: the logits read once and the gradient written once.
    const double bytes = 2.0 * 2.0 * double(s.n) * double(s.V);
    const test::Perf pf = test::time_gpu(
        ctx, [&] { cross_entropy_fwd_bwd(ctx, losses, &lg, lg, p.targets, -1, 1e-4f); }, bytes, 0,
        3, 20);
    const test::Perf pl = test::time_gpu(
        ctx, [&] { cross_entropy_fwd_bwd(ctx, losses, nullptr, lg, p.targets, -1, 1e-4f); },
        bytes / 2, 0, 3, 20);
    const double copy = test::copy_gbps(ctx, int64_t(2) * s.n * s.V);
    std::printf(
        "cross_entropy %lldx%lld bf16: fwd+bwd in place %s; loss only %s; device copy %.0f GB/s"
        "%s\n",
        static_cast<long long>(s.n), static_cast<long long>(s.V), pf.str().c_str(),
        pl.str().c_str(), copy,
        s.V == 32000 ? fmt::format("; PyTorch reference 9.8 ms, ratio {:.3f}", pf.ms / 9.8).c_str()
                     : "");
    if (s.V == 32000) EXPECT_LT(pf.ms, 3.0);  // a loose ceiling: the target is ~0.7 ms
    // Every compiled configuration, for choosing cross_entropy_default_config().
    const ops_detail::CeConfig def = ops_detail::cross_entropy_default_config(s.V);
    for (const ops_detail::CeConfig& c : ops_detail::cross_entropy_candidates()) {
      const test::Perf pc = test::time_gpu(
          ctx,
          [&] { ops_detail::cross_entropy_cuda(ctx, losses, &lg, lg, p.targets, -1, 1e-4f, &c); },
          bytes, 0, 2, 10);
      const bool is_def = c.threads == def.threads && c.min_blocks == def.min_blocks &&
                          c.unroll == def.unroll && c.cluster == def.cluster &&
                          (c.cluster > 1 || c.max_cache_bytes == def.max_cache_bytes);
      if (c.cluster > 1) {
        std::printf("    %4d threads, %d blocks/SM, unroll %d, %d blocks per row: %.4f ms%s\n",
                    c.threads, c.min_blocks, c.unroll, c.cluster, pc.ms,
                    is_def ? " (default)" : "");
      } else {
        std::printf("    %4d threads, %d blocks/SM, unroll %d, cache %3d KiB: %.4f ms%s\n",
                    c.threads, c.min_blocks, c.unroll, c.max_cache_bytes >> 10, pc.ms,
                    is_def ? " (default)" : "");
      }
    }
  }
}

}  // namespace
}  // namespace lowbit
