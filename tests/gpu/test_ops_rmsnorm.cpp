// RMSNorm on the GPU against the CPU twin over shapes and fills, with guards; the backward's
// determinism (two runs, same bits) and bandwidth; the time of each fused RMSNorm + FP8 kernel.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "lowbit/ops.h"
#include "lowbit/quant.h"
#include "ops/op_harness.h"
#include "ops/rmsnorm_impl.h"

namespace lowbit::test {
namespace {

constexpr float kEps = 1e-5f;

struct Shape2 {
  int64_t n, d;
};
const Shape2 kShapes[] = {{1, 16},  {65, 80},  {993, 512}, {16384, 768},
                          {33, 17}, {7, 8192}, {3, 32768}, {5, 1000}};

// Standard fills, with "large" at 1e15 rather than near the max: Σx² must not overflow in fp32
// while the CPU twin's fp64 sum stays finite (then the twins legitimately differ); values near
// the max overflow both, which `specials` covers.
std::vector<Fill> fills() {
  return {Fill::gaussian(), Fill::zeros(), Fill::large(1e15), Fill::small(), Fill::specials()};
}

OpCase fwd_case(Shape2 s, const Fill& fill) {
  OpCase c;
  c.name = fmt::format("rmsnorm_fwd {}x{} {}", s.n, s.d, fill.name());
  // Positive terms: the order of the fp32 sum changes rstd by at most D·u_f32 relative.
  c.args = {in("x", DType::kBF16, {s.n, s.d}, fill),
            in("w", DType::kBF16, {s.d}, Fill::gaussian(0.5, 1.0)),
            out("out", DType::kBF16, {s.n, s.d}, tol_rounded(DType::kBF16, double(s.d) + 4)),
            out("rstd", DType::kF32, {s.n}, tol_rounded(DType::kF32, double(s.d) + 4))};
  c.run = [](Context& ctx, const Args& a) {
    rmsnorm_fwd(ctx, a["out"], a["rstd"], a["x"], a["w"], kEps);
  };
  return c;
}

OpCase bwd_case(Shape2 s, const Fill& fill) {
  OpCase c;
  c.name = fmt::format("rmsnorm_bwd {}x{} {}", s.n, s.d, fill.name());
  c.args = {in("x", DType::kBF16, {s.n, s.d}, fill),
            in("w", DType::kBF16, {s.d}, Fill::gaussian(0.5, 1.0)),
            in("rstd", DType::kF32, {s.n}, Fill::uniform(0.5, 2.0)),
            in("dout", DType::kBF16, {s.n, s.d}, Fill::gaussian()),
            out("dx", DType::kBF16, {s.n, s.d}, tol_reduction(DType::kBF16, s.d)),
            inout("dw", DType::kF32, {s.d}, Fill::gaussian(), tol_reduction(DType::kF32, s.n))};
  c.run = [](Context& ctx, const Args& a) {
    rmsnorm_bwd(ctx, a["dx"], a["dw"], a["dout"], a["x"], a["w"], a["rstd"]);
  };
  return c;
}

// The same with the residual-stream gradient added in the kernel (a separate residual buffer;
// the model passes dx itself).
OpCase bwd_residual_case(Shape2 s, const Fill& fill) {
  OpCase c = bwd_case(s, fill);
  c.name = fmt::format("rmsnorm_bwd+residual {}x{} {}", s.n, s.d, fill.name());
  c.args.push_back(in("residual", DType::kBF16, {s.n, s.d}, Fill::gaussian(2.0)));
  c.run = [](Context& ctx, const Args& a) {
    rmsnorm_bwd(ctx, a["dx"], a["dw"], a["dout"], a["x"], a["w"], a["rstd"], a["residual"]);
  };
  return c;
}

TEST(GpuRmsNorm, ForwardMatchesCpu) {
  for (const Shape2& s : kShapes) {
    for (const Fill& fill : fills()) EXPECT_TRUE(compare_cpu_gpu(fwd_case(s, fill)));
  }
}

TEST(GpuRmsNorm, BackwardMatchesCpu) {
  for (const Shape2& s : kShapes) {
    for (const Fill& fill : fills()) EXPECT_TRUE(compare_cpu_gpu(bwd_case(s, fill)));
  }
  for (const Shape2& s : kShapes)
    EXPECT_TRUE(compare_cpu_gpu(bwd_residual_case(s, Fill::gaussian())));
  // dout with specials too.
  OpCase c = bwd_case({65, 80}, Fill::gaussian());
  c.args[3].fill = Fill::specials();
  EXPECT_TRUE(compare_cpu_gpu(c));
}

TEST(GpuRmsNorm, BackwardIsDeterministic) {
  const OpCase c = bwd_case({16384, 768}, Fill::gaussian());
  OpRun a = run_op(c, Device::cuda(0)), b = run_op(c, Device::cuda(0));
  EXPECT_TRUE(expect_close("dw", {768}, a.values("dw"), b.values("dw"), Tol::exact()));
  EXPECT_TRUE(expect_close("dx", {16384, 768}, a.values("dx"), b.values("dx"), Tol::exact()));
}

TEST(GpuRmsNormPerf, Bandwidth) {
  Context ctx(Device::cuda(0));
  for (int64_t d : {768, 2048}) {
    const int64_t n = 16384;
    const double copy = copy_gbps(ctx, n * d * 2);
    const Perf f = time_op(ctx, fwd_case({n, d}, Fill::gaussian()), 2.0 * n * d * 2 + 4 * n);
    const Perf b = time_op(ctx, bwd_case({n, d}, Fill::gaussian()), 3.0 * n * d * 2 + 4 * n);
    std::printf("rmsnorm N=%ld D=%ld: copy %.0f GB/s | fwd %s (%.0f%%) | bwd %s (%.0f%%)\n",
                long(n), long(d), copy, f.str().c_str(), 100 * f.gb_per_s / copy, b.str().c_str(),
                100 * b.gb_per_s / copy);
  }
}

// A bf16 tensor on the GPU, N(0, std) (as in training: no NaN or inf).
Tensor gaussian_bf16(const Shape& shape, float std, uint32_t seed) {
  Tensor h = Tensor::empty(shape, DType::kBF16, Device::cpu());
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, std);
  uint16_t* p = h.ptr<uint16_t>();
  for (int64_t i = 0; i < shape.numel(); ++i) p[i] = f32_to_bf16_rn(dist(rng));
  return Tensor::copy_of(h.view(), Device::cuda(0));
}

// The fused RMSNorm + FP8 kernels, each forced through its config, at the 124m and 1b widths
// (N = 16384, delayed scaling): the forward with rstd and the rowwise or row+col codes (no bf16
// y), and the backward as the model runs it (dx += the norm's gradient in place, dx's E5M2
// row+col codes, y's columnwise codes remade). Bytes as `lowbit bench ops` counts them, % of a
// device copy moving as many bytes.
TEST(GpuRmsNormPerf, Fp8KernelsAB) {
  using K = ops_detail::RmsNormFp8Kernel;
  struct Run {
    K kernel;
    const char* name;
  };
  const Run fwd_runs[] = {{K::kRegisters, "registers"},
                          {K::kGroupRing, "group ring"},
                          {K::kWarpRing, "warp ring"},
                          {K::kAuto, "auto"}};
  const Run bwd_runs[] = {{K::kRegisters, "registers"}, {K::kGroupRing, "group ring"}};
  const char* names[] = {"auto", "registers", "group ring", "warp ring"};
  Context ctx(Device::cuda(0));
  const int64_t n = 16384;
  for (int64_t d : {768, 2048}) {
    const Tensor x = gaussian_bf16({n, d}, 1.0f, 3), dout = gaussian_bf16({n, d}, 1e-3f, 12);
    const Tensor w = gaussian_bf16({d}, 1.0f, 4);
    Tensor dx = gaussian_bf16({n, d}, 1e-3f, 13);
    Tensor rstd = Tensor::empty({n}, DType::kF32, Device::cuda(0));
    Tensor y = Tensor::empty({n, d}, DType::kBF16, Device::cuda(0));
    Tensor dw = Tensor::zeros({d}, DType::kF32, Device::cuda(0));
    rmsnorm_fwd(ctx, y, rstd, x, w, kEps);
    DelayedScalingState fwd(DelayedScalingConfig{}, ScalingPass::kForward, 1, ctx.device());
    DelayedScalingState bwd(DelayedScalingConfig{}, ScalingPass::kBackward, 1, ctx.device());
    for (const bool both : {false, true}) {
      QuantConfig cfg = QuantConfig::fp8_delayed(fwd, 0);
      cfg.columnwise = both;
      const double bytes = 2.0 * n * d + 2.0 * d + (both ? 2.0 : 1.0) * n * d + 4.0 * n;
      const double copy = copy_gbps(ctx, int64_t(bytes / 2));
      std::string line = fmt::format("rmsnorm fwd+fp8 {} N={} D={}: copy {:.0f} GB/s",
                                     both ? "row+col" : "row", n, d, copy);
      for (const Run& r : fwd_runs) {
        ops_detail::RmsNormFp8Config kc;
        kc.kernel = r.kernel;
        K ran = K::kAuto;
        kc.ran = &ran;
        QuantizedTensor q;
        const Perf p = time_gpu(
            ctx,
            [&] {
              EXPECT_TRUE(ops_detail::rmsnorm_fwd_quantize_cuda(ctx, TensorView(), rstd, x, w, kEps,
                                                                cfg, q, &kc));
            },
            bytes);
        line += fmt::format(" | {} {:.4f} ms ({:.0f}%, ran {})", r.name, p.ms,
                            100 * p.gb_per_s / copy, names[int(ran)]);
      }
      std::printf("%s\n", line.c_str());
    }
    {
      const QuantConfig dx_cfg = QuantConfig::fp8_delayed(bwd, 0);
      QuantConfig y_cfg = QuantConfig::fp8_delayed(fwd, 0);
      y_cfg.rowwise = false;
      y_cfg.columnwise = true;
      const double bytes = 3 * 2.0 * n * d + 2.0 * d + 4.0 * n + 2.0 * n * d + 3.0 * n * d;
      const double copy = copy_gbps(ctx, int64_t(bytes / 2));
      std::string line = fmt::format("rmsnorm bwd+fp8+y N={} D={}: copy {:.0f} GB/s", n, d, copy);
      for (const Run& r : bwd_runs) {
        ops_detail::RmsNormFp8Config kc;
        kc.kernel = r.kernel;
        K ran = K::kAuto;
        kc.ran = &ran;
        QuantizedTensor dxq, yq;
        const Perf p = time_gpu(
            ctx,
            [&] {
              EXPECT_TRUE(ops_detail::rmsnorm_bwd_quantize_cuda(
                  ctx, dx, dw, dout, x, w, rstd, dx, kEps, &dx_cfg, &dxq, &y_cfg, &yq, true, &kc));
            },
            bytes);
        line += fmt::format(" | {} {:.4f} ms ({:.0f}%, ran {})", r.name, p.ms,
                            100 * p.gb_per_s / copy, names[int(ran)]);
      }
      std::printf("%s\n", line.c_str());
    }
  }
}

}  // namespace
}  // namespace lowbit::test
