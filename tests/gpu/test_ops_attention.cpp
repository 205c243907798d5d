// Causal grouped-query attention on the GPU against the CPU twin, through the op harness (poison
// outputs, guard bytes around every buffer and in the gaps of strided views).
//
// Tolerance (tests/ops/attention_ref64.h): per element, the sum of the kernel's and the twin's
// error bounds against the exact result for the same inputs. The kernel's bound has the bf16
// rounding of P before P·V (and Pᵀ·dO) and of dS before dS·K (and dSᵀ·Q): 2^-8 relative to
// Σ p·|v| (resp. Σ |dS|·|k|), plus fp32 accumulation at 2^-23 (tensor cores may truncate) and
// ex2.approx, plus one bf16 rounding (2^-8) of each stored output, for each of the two sides.
// Nothing in it is tuned to the kernel's observed error.
//
// Also: two runs give identical bits (forward and backward), long sequences (T = 8192) on
// sampled rows against float64, and a timing of the two PyTorch SDPA reference shapes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/device_attr.h"
#include "lowbit/ops.h"
#include "ops/attention_impl.h"
#include "ops/attention_ref64.h"
#include "ops/op_harness.h"

namespace lowbit {
namespace {

using test::AttnDims;
using test::AttnErrorModel;

// n gaussian values (stddev sd), rounded to bf16, as double.
std::vector<double> gaussian_bf16(int64_t n, uint64_t seed, double sd = 1.0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[i] = test::round_to(DType::kBF16, sd * test::detail::philox_gauss(seed, 3, i));
  }
  return v;
}

test::Fill from(const std::vector<double>& v, const char* name) {
  return test::Fill::custom(name, [&v](int64_t i) { return v[i]; });
}

// |got − want| ≤ bound element by element (NaN/inf fail), first mismatch with coordinates and
// the largest |diff| / bound seen. `mask` (optional): compare only where mask[i] is set.
::testing::AssertionResult within_bounds(const std::string& what, const Shape& shape,
                                         const std::vector<double>& got,
                                         const std::vector<double>& want,
                                         const std::vector<double>& bound,
                                         const std::vector<char>* mask = nullptr) {
  int64_t bad = 0, checked = 0;
  std::string first;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (mask != nullptr && !(*mask)[i]) continue;
    ++checked;
    const double d = std::fabs(got[i] - want[i]);
    if (std::isfinite(d) && bound[i] > 0) worst = std::max(worst, d / bound[i]);
    if (std::isfinite(got[i]) && std::isfinite(want[i]) && d <= bound[i]) continue;
    if (bad++ == 0) {
      first = fmt::format("{}{}: got {:.9g}, want {:.9g}, |diff| {:.3g} > bound {:.3g}", what,
                          test::detail::coords(shape, int64_t(i)), got[i], want[i], d, bound[i]);
    }
  }
  std::printf("    %-4s max |diff| / bound = %.3f over %lld elements\n", what.c_str(), worst,
              static_cast<long long>(checked));
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << first << " (" << bad << " of " << checked << " elements outside their bounds)";
}

struct GpuCase {
  int64_t B, T, H, Hkv, Dh;
  bool fused;   // q, k, v (and dq, dk, dv) strided views into a fused [B, T, (H + 2·Hkv)·Dh] row
  double q_sd;  // 3: peaked softmax (the running max moves often)
  std::string str() const {
    return fmt::format("B{} T{} H{} Hkv{} Dh{}{}{}", B, T, H, Hkv, Dh, fused ? " fused" : "",
                       q_sd != 1.0 ? " peaked" : "");
  }
};

struct CaseData {
  AttnDims dims;
  std::vector<double> q, k, v, dout;  // [B, T, H | Hkv, Dh]
};

CaseData make_data(const GpuCase& c, uint64_t seed) {
  CaseData d;
  d.dims = {c.B, c.T, c.H, c.Hkv, c.Dh, 1.0 / std::sqrt(double(c.Dh))};
  d.q = gaussian_bf16(c.B * c.T * c.H * c.Dh, seed, c.q_sd);
  d.k = gaussian_bf16(c.B * c.T * c.Hkv * c.Dh, seed + 1);
  d.v = gaussian_bf16(c.B * c.T * c.Hkv * c.Dh, seed + 2);
  d.dout = gaussian_bf16(c.B * c.T * c.H * c.Dh, seed + 3);
  return d;
}

// A contiguous device tensor of `shape` holding v rounded to t.
Tensor upload(const std::vector<double>& v, const Shape& shape, DType t) {
  Tensor h = Tensor::empty(shape, t, Device::cpu());
  for (int64_t i = 0; i < h.numel(); ++i) {
    test::detail::store_value(t, static_cast<uint8_t*>(h.data()) + i * (dtype_bits(t) / 8), v[i]);
  }
  return Tensor::copy_of(h.view(), Device::cuda(0));
}

// The arg specs of q, k, v (or dq, dk, dv): contiguous, or views at columns 0, H·Dh and
// (H + Hkv)·Dh of a fused row of width W = (H + 2·Hkv)·Dh.
Shape qkv_strides(const GpuCase& c) {
  const int64_t W = (c.H + 2 * c.Hkv) * c.Dh;
  return {c.T * W, W, c.Dh, 1};
}
test::ArgSpec head_arg(test::ArgSpec a, const GpuCase& c) {
  return c.fused ? test::strided(std::move(a), qkv_strides(c)) : a;
}

struct FwdResult {
  test::OpRun run;
  std::vector<double> out, lse;
};

FwdResult run_fwd(const GpuCase& c, const CaseData& d, Device dev) {
  const Shape qs{c.B, c.T, c.H, c.Dh}, ks{c.B, c.T, c.Hkv, c.Dh};
  test::OpCase oc;
  oc.name = "attention_fwd " + c.str();
  oc.args = {head_arg(test::in("q", DType::kBF16, qs, from(d.q, "q")), c),
             head_arg(test::in("k", DType::kBF16, ks, from(d.k, "k")), c),
             head_arg(test::in("v", DType::kBF16, ks, from(d.v, "v")), c),
             test::out("out", DType::kBF16, qs), test::out("lse", DType::kF32, {c.B, c.H, c.T})};
  const float scale = static_cast<float>(d.dims.scale);
  oc.run = [scale](Context& ctx, const test::Args& a) {
    attention_fwd(ctx, a["out"], a["lse"], a["q"], a["k"], a["v"], scale);
  };
  FwdResult r{test::run_op(oc, dev), {}, {}};
  r.out = r.run.values("out");
  r.lse = r.run.values("lse");
  return r;
}

struct BwdResult {
  test::OpRun run;
  std::vector<double> dq, dk, dv;
};

// out and lse: the forward's (the values both sides are given).
BwdResult run_bwd(const GpuCase& c, const CaseData& d, const std::vector<double>& out,
                  const std::vector<double>& lse, Device dev) {
  const Shape qs{c.B, c.T, c.H, c.Dh}, ks{c.B, c.T, c.Hkv, c.Dh};
  test::OpCase oc;
  oc.name = "attention_bwd " + c.str();
  oc.args = {head_arg(test::in("q", DType::kBF16, qs, from(d.q, "q")), c),
             head_arg(test::in("k", DType::kBF16, ks, from(d.k, "k")), c),
             head_arg(test::in("v", DType::kBF16, ks, from(d.v, "v")), c),
             test::in("out", DType::kBF16, qs, from(out, "out")),
             test::in("lse", DType::kF32, {c.B, c.H, c.T}, from(lse, "lse")),
             test::in("dout", DType::kBF16, qs, from(d.dout, "dout")),
             head_arg(test::out("dq", DType::kBF16, qs), c),
             head_arg(test::out("dk", DType::kBF16, ks), c),
             head_arg(test::out("dv", DType::kBF16, ks), c)};
  const float scale = static_cast<float>(d.dims.scale);
  oc.run = [scale](Context& ctx, const test::Args& a) {
    attention_bwd(ctx, a["dq"], a["dk"], a["dv"], a["dout"], a["q"], a["k"], a["v"], a["out"],
                  a["lse"], scale);
  };
  BwdResult r{test::run_op(oc, dev), {}, {}, {}};
  r.dq = r.run.values("dq");
  r.dk = r.run.values("dk");
  r.dv = r.run.values("dv");
  return r;
}

std::vector<GpuCase> sweep_cases() {
  std::vector<GpuCase> cases;
  for (int64_t T : {1, 17, 64, 129, 1024}) {
    for (int64_t Dh : {64, 128}) {
      for (int64_t ratio : {1, 4}) {
        const int64_t B = T >= 1024 ? 1 : 2, H = 4;
        cases.push_back({B, T, H, H / ratio, Dh, T == 17 || T == 129, T == 64 ? 3.0 : 1.0});
      }
    }
  }
  cases.push_back({3, 200, 8, 2, 64, true, 1.0});
  cases.push_back({1, 333, 6, 3, 128, true, 3.0});
  return cases;
}

TEST(AttentionGpu, MatchesCpuTwinAndIsDeterministic) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (const GpuCase& c : sweep_cases()) {
    SCOPED_TRACE(c.str());
    std::printf("  %s\n", c.str().c_str());
    const CaseData d = make_data(c, 100 + c.T + c.Dh + c.Hkv);
    FwdResult cpu = run_fwd(c, d, Device::cpu());
    FwdResult gpu = run_fwd(c, d, Device::cuda(0));
    ASSERT_TRUE(cpu.run.intact());
    ASSERT_TRUE(gpu.run.intact());
    const auto ref =
        test::attention_fwd_f64(d.dims, d.q, d.k, d.v, AttnErrorModel::gpu_vs_cpu_twin());
    const Shape qs{c.B, c.T, c.H, c.Dh}, ks{c.B, c.T, c.Hkv, c.Dh}, ls{c.B, c.H, c.T};
    // The bounds are against the exact result; the twin is within its own part of them, so
    // |gpu − cpu| ≤ bound_gpu + bound_cpu.
    EXPECT_TRUE(within_bounds("out", qs, gpu.out, cpu.out, ref.out_bound));
    EXPECT_TRUE(within_bounds("lse", ls, gpu.lse, cpu.lse, ref.lse_bound));

    BwdResult bcpu = run_bwd(c, d, cpu.out, cpu.lse, Device::cpu());
    BwdResult bgpu = run_bwd(c, d, cpu.out, cpu.lse, Device::cuda(0));
    ASSERT_TRUE(bcpu.run.intact());
    ASSERT_TRUE(bgpu.run.intact());
    const auto bref = test::attention_bwd_f64(d.dims, d.q, d.k, d.v, cpu.out, cpu.lse, d.dout,
                                              AttnErrorModel::gpu_vs_cpu_twin());
    EXPECT_TRUE(within_bounds("dq", qs, bgpu.dq, bcpu.dq, bref.dq_bound));
    EXPECT_TRUE(within_bounds("dk", ks, bgpu.dk, bcpu.dk, bref.dk_bound));
    EXPECT_TRUE(within_bounds("dv", ks, bgpu.dv, bcpu.dv, bref.dv_bound));

    // Run to run: the same bits.
    FwdResult gpu2 = run_fwd(c, d, Device::cuda(0));
    BwdResult bgpu2 = run_bwd(c, d, cpu.out, cpu.lse, Device::cuda(0));
    EXPECT_EQ(gpu.out, gpu2.out);
    EXPECT_EQ(gpu.lse, gpu2.lse);
    EXPECT_EQ(bgpu.dq, bgpu2.dq);
    EXPECT_EQ(bgpu.dk, bgpu2.dk);
    EXPECT_EQ(bgpu.dv, bgpu2.dv);
  }
}

// Every compiled tile variant (the benchmark sweeps them) computes the same function.
TEST(AttentionGpu, EveryTileVariantMatchesTheTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (int64_t Dh : {64, 128}) {
    const GpuCase c{2, 150, 4, 2, Dh, true, 1.0};
    SCOPED_TRACE(c.str());
    const CaseData d = make_data(c, 9);
    FwdResult cpu = run_fwd(c, d, Device::cpu());
    BwdResult bcpu = run_bwd(c, d, cpu.out, cpu.lse, Device::cpu());
    const auto ref =
        test::attention_fwd_f64(d.dims, d.q, d.k, d.v, AttnErrorModel::gpu_vs_cpu_twin());
    const auto bref = test::attention_bwd_f64(d.dims, d.q, d.k, d.v, cpu.out, cpu.lse, d.dout,
                                              AttnErrorModel::gpu_vs_cpu_twin());
    const Shape qs{c.B, c.T, c.H, c.Dh}, ks{c.B, c.T, c.Hkv, c.Dh}, ls{c.B, c.H, c.T};
    // Device copies of the inputs (contiguous: the strided path is covered above).
    auto down = [](const Tensor& t) {
      Tensor h = Tensor::copy_of(t.view(), Device::cpu());
      std::vector<double> v(static_cast<size_t>(h.numel()));
      for (int64_t i = 0; i < h.numel(); ++i) {
        v[i] = test::detail::load_value(
            h.dtype(), static_cast<const uint8_t*>(h.data()) + i * (dtype_bits(h.dtype()) / 8));
      }
      return v;
    };
    Context ctx(Device::cuda(0));
    Tensor q = upload(d.q, qs, DType::kBF16), k = upload(d.k, ks, DType::kBF16),
           v = upload(d.v, ks, DType::kBF16), dout = upload(d.dout, qs, DType::kBF16);
    Tensor out_in = upload(cpu.out, qs, DType::kBF16), lse_in = upload(cpu.lse, ls, DType::kF32);
    const float scale = static_cast<float>(d.dims.scale);
    for (const attn::CudaTiles& t : attn::candidate_fwd_tiles(static_cast<int>(Dh))) {
      SCOPED_TRACE(t.fwd_wgmma ? std::string(t.fwd_tma ? "fwd wgmma, TMA loads" : "fwd wgmma")
                               : fmt::format("fwd {} warps x {} m-tiles, {}-key tiles", t.fwd_warps,
                                             t.fwd_mt, t.fwd_bc));
      Tensor out = Tensor::empty(qs, DType::kBF16, Device::cuda(0));
      Tensor lse = Tensor::empty(ls, DType::kF32, Device::cuda(0));
      attn::attention_fwd_cuda(ctx, out, lse, q, k, v, scale, &t);
      ctx.synchronize();
      EXPECT_TRUE(within_bounds("out", qs, down(out), cpu.out, ref.out_bound));
      EXPECT_TRUE(within_bounds("lse", ls, down(lse), cpu.lse, ref.lse_bound));
    }
    for (const attn::CudaTiles& t : attn::candidate_bwd_tiles(static_cast<int>(Dh))) {
      SCOPED_TRACE(t.dkv_wgmma    ? std::string(t.dkv_tma    ? "bwd dkv+dq wgmma, both TMA"
                                                : t.dq_tma   ? "bwd dkv+dq wgmma, dq TMA"
                                                : t.dq_wgmma ? "bwd dkv+dq wgmma"
                                                             : "bwd dkv wgmma")
                   : t.dq_from_ds ? std::string("bwd dkv storing dS, dq from dS")
                                  : fmt::format("bwd dkv {} warps x {} m-tiles, {}-query tiles; dq "
                                                "{} warps x {} m-tiles, {}-key tiles",
                                                t.dkv_warps, t.dkv_mt, t.dkv_br, t.dq_warps,
                                                t.dq_mt, t.dq_bc));
      Tensor dq = Tensor::empty(qs, DType::kBF16, Device::cuda(0));
      Tensor dk = Tensor::empty(ks, DType::kBF16, Device::cuda(0));
      Tensor dv = Tensor::empty(ks, DType::kBF16, Device::cuda(0));
      attn::attention_bwd_cuda(ctx, dq, dk, dv, dout, q, k, v, out_in, lse_in, scale, &t);
      ctx.synchronize();
      EXPECT_TRUE(within_bounds("dq", qs, down(dq), bcpu.dq, bref.dq_bound));
      EXPECT_TRUE(within_bounds("dk", ks, down(dk), bcpu.dk, bref.dk_bound));
      EXPECT_TRUE(within_bounds("dv", ks, down(dv), bcpu.dv, bref.dv_bound));
    }
  }
}

// The TMA passes (the default) and the cp.async wgmma passes do the same arithmetic on the same
// tiles, so they give the same bits, forward and backward: over lengths that end inside a tile,
// grouped heads, views into a fused qkv row, and a [B, H, T, Dh] buffer seen as [B, T, H, Dh],
// for which no tensor map is made and the cp.async kernels run.
TEST(AttentionGpu, TmaPassesGiveTheCpAsyncBits) {
  int dev = 0;
  cudaGetDevice(&dev);
  if (!is_sm90(dev)) GTEST_SKIP() << "the wgmma passes are sm_90a code";
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  Context ctx(Device::cuda(0));
  for (int64_t Dh : {64, 128}) {
    for (int layout = 0; layout < 3; ++layout) {  // contiguous, fused qkv row, head-major
      for (int64_t T : {1, 17, 64, 129, 300}) {
        const int64_t B = 2, H = 4, Hkv = layout == 2 ? 4 : 2;
        SCOPED_TRACE(fmt::format("Dh {} layout {} T {}", Dh, layout, T));
        const int64_t W = (H + 2 * Hkv) * Dh;
        // One buffer holds q, k, v: [B, T, W] (fused) or three [B, heads, T, Dh] / [B, T, heads,
        // Dh] blocks one after another.
        const int64_t q_elems = B * T * H * Dh, k_elems = B * T * Hkv * Dh;
        std::vector<double> vals(static_cast<size_t>(q_elems + 2 * k_elems));
        for (size_t i = 0; i < vals.size(); ++i) {
          vals[i] = test::detail::philox_gauss(uint64_t(17 + T + Dh), 2, int64_t(i));
        }
        Tensor buf = upload(vals, {int64_t(vals.size())}, DType::kBF16);
        auto* base = static_cast<uint16_t*>(buf.data());
        auto view = [&](int64_t offset, int64_t heads) -> TensorView {
          const Shape shape{B, T, heads, Dh};
          if (layout == 1) {
            return TensorView(base + offset, DType::kBF16, shape, {T * W, W, Dh, 1},
                              Device::cuda(0));
          }
          if (layout == 2) {
            return TensorView(base + offset * B * T, DType::kBF16, shape,
                              {heads * T * Dh, Dh, T * Dh, 1}, Device::cuda(0));
          }
          return TensorView(base + offset * B * T, DType::kBF16, shape, Device::cuda(0));
        };
        // Column offsets in the fused row; block offsets (× B·T) otherwise.
        const TensorView q = view(0, H), k = view(H * Dh, Hkv), v = view((H + Hkv) * Dh, Hkv);
        const float scale = static_cast<float>(1.0 / std::sqrt(double(Dh)));
        std::vector<double> dout_vals(static_cast<size_t>(q_elems));
        for (size_t i = 0; i < dout_vals.size(); ++i) {
          dout_vals[i] = test::detail::philox_gauss(uint64_t(29 + T + Dh), 3, int64_t(i));
        }
        const Tensor dout = upload(dout_vals, {B, T, H, Dh}, DType::kBF16);
        auto bits16 = [](const Tensor& t) {
          const Tensor h = Tensor::copy_of(t.view(), Device::cpu());
          return std::vector<uint16_t>(h.ptr<uint16_t>(), h.ptr<uint16_t>() + h.numel());
        };
        std::vector<uint16_t> got[2][4];  // [cp.async, TMA][out, dq, dk, dv]
        std::vector<float> lse_vals[2];
        for (int tma = 0; tma < 2; ++tma) {
          attn::CudaTiles t = attn::default_tiles(static_cast<int>(Dh));
          t.fwd_wgmma = t.dkv_wgmma = t.dq_wgmma = true;
          t.fwd_tma = t.dkv_tma = t.dq_tma = tma == 1;
          Tensor out = Tensor::empty({B, T, H, Dh}, DType::kBF16, Device::cuda(0));
          Tensor lse = Tensor::empty({B, H, T}, DType::kF32, Device::cuda(0));
          attn::attention_fwd_cuda(ctx, out, lse, q, k, v, scale, &t);
          Tensor dq = Tensor::empty({B, T, H, Dh}, DType::kBF16, Device::cuda(0));
          Tensor dk = Tensor::empty({B, T, Hkv, Dh}, DType::kBF16, Device::cuda(0));
          Tensor dv = Tensor::empty({B, T, Hkv, Dh}, DType::kBF16, Device::cuda(0));
          attn::attention_bwd_cuda(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale, &t);
          ctx.synchronize();
          const Tensor hl = Tensor::copy_of(lse.view(), Device::cpu());
          lse_vals[tma].assign(hl.ptr<float>(), hl.ptr<float>() + hl.numel());
          got[tma][0] = bits16(out), got[tma][1] = bits16(dq);
          got[tma][2] = bits16(dk), got[tma][3] = bits16(dv);
        }
        EXPECT_EQ(got[0][0], got[1][0]) << "out";
        EXPECT_EQ(lse_vals[0], lse_vals[1]) << "lse";
        EXPECT_EQ(got[0][1], got[1][1]) << "dq";
        EXPECT_EQ(got[0][2], got[1][2]) << "dk";
        EXPECT_EQ(got[0][3], got[1][3]) << "dv";
      }
    }
  }
}

// The backward whose dQ pass reads the dSᵀ tiles of the dK/dV pass runs the batch in chunks
// that fit its dS budget: one sequence per chunk gives the bits of the whole batch at once, and
// dK, dV equal those of the separate-dQ backward bit for bit (same dK/dV arithmetic).
TEST(AttentionGpu, StoredDsChunksGiveTheWholeBatchBits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (int64_t Dh : {64, 128}) {
    const GpuCase c{3, 300, 4, 2, Dh, false, 1.0};
    SCOPED_TRACE(c.str());
    const CaseData d = make_data(c, 21);
    FwdResult cpu = run_fwd(c, d, Device::cpu());
    const Shape qs{c.B, c.T, c.H, c.Dh}, ks{c.B, c.T, c.Hkv, c.Dh}, ls{c.B, c.H, c.T};
    auto bits = [](const Tensor& t) {
      Tensor h = Tensor::copy_of(t.view(), Device::cpu());
      const auto* p = static_cast<const uint16_t*>(h.data());
      return std::vector<uint16_t>(p, p + h.numel());
    };
    Context ctx(Device::cuda(0));
    Tensor q = upload(d.q, qs, DType::kBF16), k = upload(d.k, ks, DType::kBF16),
           v = upload(d.v, ks, DType::kBF16), dout = upload(d.dout, qs, DType::kBF16);
    Tensor out = upload(cpu.out, qs, DType::kBF16), lse = upload(cpu.lse, ls, DType::kF32);
    const float scale = static_cast<float>(d.dims.scale);
    const int64_t tiles = (c.T + 63) / 64;
    const int64_t ds_per_seq = c.H * tiles * (tiles + 1) / 2 * 64 * 64 * 2;
    std::vector<uint16_t> got[3]
                             [3];  // [whole batch, one sequence per chunk, separate dQ][dq, dk, dv]
    for (int run = 0; run < 3; ++run) {
      attn::CudaTiles t = attn::default_tiles(static_cast<int>(Dh));
      t.dq_from_ds = true;
      t.dkv_wgmma = false;  // the mma.sync dK/dV kernel on both sides of the comparison
      t.dq_wgmma = false;
      t.dkv_warps = 4, t.dkv_br = 64, t.dkv_mt = 1;
      t.ds_min_chunk_blocks = 0;  // chunks of this small case have a few blocks only
      if (run == 1) t.ds_budget_bytes = ds_per_seq;
      if (run == 2) t.dq_from_ds = false;
      Tensor dq = Tensor::empty(qs, DType::kBF16, Device::cuda(0));
      Tensor dk = Tensor::empty(ks, DType::kBF16, Device::cuda(0));
      Tensor dv = Tensor::empty(ks, DType::kBF16, Device::cuda(0));
      attn::attention_bwd_cuda(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale, &t);
      ctx.synchronize();
      got[run][0] = bits(dq), got[run][1] = bits(dk), got[run][2] = bits(dv);
    }
    EXPECT_EQ(got[0][0], got[1][0]) << "dq, chunked";
    EXPECT_EQ(got[0][1], got[1][1]) << "dk, chunked";
    EXPECT_EQ(got[0][2], got[1][2]) << "dv, chunked";
    EXPECT_EQ(got[0][1], got[2][1]) << "dk, against the separate dQ pass";
    EXPECT_EQ(got[0][2], got[2][2]) << "dv, against the separate dQ pass";
  }
}

// T = 8192 (the longest sequence lowbit trains): forward and backward against float64 on
// sampled positions (the twin would take minutes), kernel bound only.
TEST(AttentionGpu, LongSequenceOnSampledRows) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const GpuCase c{1, 8192, 4, 2, 128, false, 1.0};
  const CaseData d = make_data(c, 8);
  std::vector<char> rows(static_cast<size_t>(c.T), 0);
  for (int64_t t : {0, 1, 63, 64, 127, 128, 1000, 4095, 4096, 8000, 8190, 8191}) rows[t] = 1;
  FwdResult gpu = run_fwd(c, d, Device::cuda(0));
  ASSERT_TRUE(gpu.run.intact());
  const auto em = AttnErrorModel::gpu_kernel();
  const auto ref = test::attention_fwd_f64(d.dims, d.q, d.k, d.v, em, &rows);
  // Masks over [B, T, heads, Dh] and [B, H, T] for the sampled positions.
  auto mask_btxd = [&](int64_t heads) {
    std::vector<char> m(static_cast<size_t>(c.B * c.T * heads * c.Dh), 0);
    for (int64_t i = 0; i < int64_t(m.size()); ++i) m[i] = rows[(i / (heads * c.Dh)) % c.T];
    return m;
  };
  std::vector<char> mq = mask_btxd(c.H), mk = mask_btxd(c.Hkv);
  std::vector<char> ml(static_cast<size_t>(c.B * c.H * c.T));
  for (int64_t i = 0; i < int64_t(ml.size()); ++i) ml[i] = rows[i % c.T];
  const Shape qs{c.B, c.T, c.H, c.Dh}, ks{c.B, c.T, c.Hkv, c.Dh}, ls{c.B, c.H, c.T};
  EXPECT_TRUE(within_bounds("out", qs, gpu.out, ref.out, ref.out_bound, &mq));
  EXPECT_TRUE(within_bounds("lse", ls, gpu.lse, ref.lse, ref.lse_bound, &ml));
  BwdResult bgpu = run_bwd(c, d, gpu.out, gpu.lse, Device::cuda(0));
  ASSERT_TRUE(bgpu.run.intact());
  const auto bref =
      test::attention_bwd_f64(d.dims, d.q, d.k, d.v, gpu.out, gpu.lse, d.dout, em, &rows);
  EXPECT_TRUE(within_bounds("dq", qs, bgpu.dq, bref.dq, bref.dq_bound, &mq));
  EXPECT_TRUE(within_bounds("dk", ks, bgpu.dk, bref.dk, bref.dk_bound, &mk));
  EXPECT_TRUE(within_bounds("dv", ks, bgpu.dv, bref.dv, bref.dv_bound, &mk));
}

// ---- performance: the PyTorch SDPA reference shapes --------------------------------------------

// A bf16 tensor of standard normal values (seeded), on the GPU.
Tensor random_dev(const Shape& sh, uint64_t seed) {
  Tensor h = Tensor::empty(sh, DType::kBF16, Device::cpu());
  for (int64_t i = 0; i < h.numel(); ++i) {
    h.ptr<uint16_t>()[i] =
        f32_to_bf16_rn(static_cast<float>(test::detail::philox_gauss(seed, 1, i)));
  }
  return Tensor::copy_of(h.view(), Device::cuda(0));
}

// The inputs (random q, k, v [B, T, heads, Dh] and dout) and outputs of a timed attention run.
struct PerfTensors {
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
  float scale;
  PerfTensors(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t Dh)
      : q(random_dev({B, T, H, Dh}, 1)),
        k(random_dev({B, T, Hkv, Dh}, 2)),
        v(random_dev({B, T, Hkv, Dh}, 3)),
        dout(random_dev({B, T, H, Dh}, 4)),
        out(Tensor::empty({B, T, H, Dh}, DType::kBF16, Device::cuda(0))),
        lse(Tensor::empty({B, H, T}, DType::kF32, Device::cuda(0))),
        dq(Tensor::empty({B, T, H, Dh}, DType::kBF16, Device::cuda(0))),
        dk(Tensor::empty({B, T, Hkv, Dh}, DType::kBF16, Device::cuda(0))),
        dv(Tensor::empty({B, T, Hkv, Dh}, DType::kBF16, Device::cuda(0))),
        scale(static_cast<float>(1.0 / std::sqrt(double(Dh)))) {}
};

struct PerfShape {
  int64_t B, T, H, Hkv, Dh;
  double sdpa_ms;  // PyTorch SDPA fwd + bwd, H100, as given in the task that set the target
};

TEST(AttentionGpu, PerfSdpaShapes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  // The two reference shapes, then the 1b preset's attention and a long Dh 128 GQA sequence (no
  // reference time).
  const PerfShape shapes[] = {{16, 1024, 12, 12, 64, 0.46},
                              {8, 2048, 16, 16, 128, 1.38},
                              {8, 2048, 32, 8, 64, 0.0},
                              {4, 4096, 16, 4, 128, 0.0}};
  Context ctx(Device::cuda(0));
  for (const PerfShape& s : shapes) {
    PerfTensors t(s.B, s.T, s.H, s.Hkv, s.Dh);
    Tensor &q = t.q, &k = t.k, &v = t.v, &dout = t.dout, &out = t.out, &lse = t.lse, &dq = t.dq,
           &dk = t.dk, &dv = t.dv;
    const float scale = t.scale;
    // Causal FLOPs: fwd 4·B·H·T²·Dh / 2, bwd 2.5× that.
    const double fwd_flops = 4.0 * s.B * s.H * double(s.T) * s.T * s.Dh / 2;
    const double bwd_flops = 2.5 * fwd_flops;
    const test::Perf pf = test::time_gpu(
        ctx, [&] { attention_fwd(ctx, out, lse, q, k, v, scale); }, 0, fwd_flops, 3, 20);
    const test::Perf pb = test::time_gpu(
        ctx, [&] { attention_bwd(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale); }, 0, bwd_flops,
        3, 20);
    const double total = pf.ms + pb.ms;
    std::printf(
        "attention B%lld T%lld H%lld Dh%lld: fwd %.3f ms (%.1f TFLOP/s), bwd %.3f ms (%.1f "
        "TFLOP/s), fwd+bwd %.3f ms (%.1f TFLOP/s); SDPA reference %.2f ms, ratio %.2f\n",
        static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(s.H),
        static_cast<long long>(s.Dh), pf.ms, pf.tflop_per_s, pb.ms, pb.tflop_per_s, total,
        (fwd_flops + bwd_flops) / (total * 1e9), s.sdpa_ms,
        s.sdpa_ms > 0 ? total / s.sdpa_ms : 0.0);
    // q, k, v as views into one fused [B, T, H + 2·Hkv, Dh] activation (as the model and
    // `lowbit bench ops` have them), with contiguous gradients or gradient views into a fused
    // buffer too: what the row stride of the views costs.
    {
      const int64_t W = s.H + 2 * s.Hkv;
      Tensor fused = random_dev({s.B, s.T, W, s.Dh}, 5);
      Tensor dfused = Tensor::empty({s.B, s.T, W, s.Dh}, DType::kBF16, Device::cuda(0));
      auto heads = [&](const Tensor& t, int64_t h0, int64_t n) {
        return TensorView(static_cast<uint16_t*>(const_cast<void*>(t.data())) + h0 * s.Dh,
                          DType::kBF16, {s.B, s.T, n, s.Dh}, {s.T * W * s.Dh, W * s.Dh, s.Dh, 1},
                          Device::cuda(0));
      };
      const TensorView fq = heads(fused, 0, s.H), fk = heads(fused, s.H, s.Hkv),
                       fv = heads(fused, s.H + s.Hkv, s.Hkv);
      const TensorView fdq = heads(dfused, 0, s.H), fdk = heads(dfused, s.H, s.Hkv),
                       fdv = heads(dfused, s.H + s.Hkv, s.Hkv);
      const test::Perf ff = test::time_gpu(
          ctx, [&] { attention_fwd(ctx, out, lse, fq, fk, fv, scale); }, 0, fwd_flops, 2, 10);
      const test::Perf fb = test::time_gpu(
          ctx, [&] { attention_bwd(ctx, dq, dk, dv, dout, fq, fk, fv, out, lse, scale); }, 0,
          bwd_flops, 2, 10);
      const test::Perf fbf = test::time_gpu(
          ctx, [&] { attention_bwd(ctx, fdq, fdk, fdv, dout, fq, fk, fv, out, lse, scale); }, 0,
          bwd_flops, 2, 10);
      std::printf(
          "    fused qkv views: fwd %.3f ms; bwd %.3f ms (contiguous gradients), %.3f ms "
          "(gradient views into a fused buffer)\n",
          ff.ms, fb.ms, fbf.ms);
    }
    // The order of the blocks (attn::BlockOrder) for the query-tile passes and for the dK/dV
    // pass (whose default, kAuto, picks one of the two per shape).
    using attn::BlockOrder;
    for (BlockOrder qo : {BlockOrder::kHeadByHead, BlockOrder::kAllHeads}) {
      for (BlockOrder kvo : {BlockOrder::kHeadByHead, BlockOrder::kAllHeads}) {
        attn::CudaTiles t = attn::default_tiles(static_cast<int>(s.Dh));
        t.q_order = qo, t.kv_order = kvo;
        const test::Perf f = test::time_gpu(
            ctx, [&] { attn::attention_fwd_cuda(ctx, out, lse, q, k, v, scale, &t); }, 0, fwd_flops,
            2, 10);
        const test::Perf bw = test::time_gpu(
            ctx,
            [&] { attn::attention_bwd_cuda(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale, &t); },
            0, bwd_flops, 2, 10);
        auto name = [](BlockOrder o) {
          return o == BlockOrder::kHeadByHead ? "head by head" : "all heads";
        };
        std::printf("    order q %-13s kv %-13s fwd %.3f ms, bwd %.3f ms\n", name(qo), name(kvo),
                    f.ms, bw.ms);
      }
    }
    // Every compiled tile variant, for choosing default_tiles().
    for (const attn::CudaTiles& t : attn::candidate_fwd_tiles(static_cast<int>(s.Dh))) {
      const test::Perf p = test::time_gpu(
          ctx, [&] { attn::attention_fwd_cuda(ctx, out, lse, q, k, v, scale, &t); }, 0, fwd_flops,
          2, 10);
      if (t.fwd_wgmma && t.fwd_tma) {
        std::printf(
            "    fwd  wgmma, TMA loads (1 warpgroup, 64 queries x 64-key tiles): %.3f ms "
            "(%.1f TFLOP/s)\n",
            p.ms, p.tflop_per_s);
        continue;
      }
      if (t.fwd_wgmma) {
        std::printf(
            "    fwd  wgmma (1 warpgroup, 64 queries x 64-key tiles): %.3f ms (%.1f "
            "TFLOP/s)\n",
            p.ms, p.tflop_per_s);
        continue;
      }
      std::printf("    fwd  %d warps x %d m-tiles, %3d-key tiles: %.3f ms (%.1f TFLOP/s)\n",
                  t.fwd_warps, t.fwd_mt, t.fwd_bc, p.ms, p.tflop_per_s);
    }
    for (const attn::CudaTiles& t : attn::candidate_bwd_tiles(static_cast<int>(s.Dh))) {
      const test::Perf p = test::time_gpu(
          ctx,
          [&] { attn::attention_bwd_cuda(ctx, dq, dk, dv, dout, q, k, v, out, lse, scale, &t); }, 0,
          bwd_flops, 2, 10);
      if (t.dq_from_ds || t.dkv_wgmma) {
        std::printf("    bwd  %s: %.3f ms (%.1f TFLOP/s)\n",
                    t.dkv_wgmma ? (t.dkv_tma    ? "dkv wgmma + dq wgmma, both TMA"
                                   : t.dq_tma   ? "dkv wgmma + dq wgmma, dq TMA"
                                   : t.dq_wgmma ? "dkv wgmma + dq wgmma"
                                                : "dkv wgmma + dq")
                                : "dkv storing dS + dq from dS",
                    p.ms, p.tflop_per_s);
        continue;
      }
      std::printf(
          "    bwd  dkv %d warps x %d m-tiles, %3d-query tiles; dq %d warps x %d m-tiles, "
          "%3d-key tiles: %.3f ms (%.1f TFLOP/s)\n",
          t.dkv_warps, t.dkv_mt, t.dkv_br, t.dq_warps, t.dq_mt, t.dq_bc, p.ms, p.tflop_per_s);
    }
  }
}

// The block orders of the query-tile passes (forward, dQ) against each other at the benchmark's
// shapes (`lowbit bench ops`) and the 1b preset's: rounds interleaved, median of the rounds, so
// that clock drift during the run falls on both orders alike.
TEST(AttentionGpu, PerfQueryBlockOrders) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  struct OrderShape {
    int64_t B, T, H, Hkv, Dh;
  };
  const OrderShape shapes[] = {{16, 1024, 12, 12, 64}, {8, 2048, 12, 12, 64}, {4, 4096, 12, 12, 64},
                               {16, 1024, 16, 4, 128}, {8, 2048, 16, 4, 128}, {4, 4096, 16, 4, 128},
                               {8, 2048, 32, 8, 64},   {8, 2048, 16, 16, 128}};
  Context ctx(Device::cuda(0));
  using attn::BlockOrder;
  for (const OrderShape& s : shapes) {
    PerfTensors t(s.B, s.T, s.H, s.Hkv, s.Dh);
    Tensor &q = t.q, &k = t.k, &v = t.v, &dout = t.dout, &out = t.out, &lse = t.lse, &dq = t.dq,
           &dk = t.dk, &dv = t.dv;
    const float scale = t.scale;
    const double fwd_flops = 4.0 * s.B * s.H * double(s.T) * s.T * s.Dh / 2;
    const BlockOrder orders[] = {BlockOrder::kHeadByHead, BlockOrder::kAllHeads, BlockOrder::kAuto};
    std::vector<double> f_ms[3], b_ms[3];
    for (int round = 0; round < 5; ++round) {
      for (int o = 0; o < 3; ++o) {
        attn::CudaTiles t = attn::default_tiles(static_cast<int>(s.Dh));
        t.q_order = orders[o];
        f_ms[o].push_back(test::time_gpu(
                              ctx,
                              [&] { attn::attention_fwd_cuda(ctx, out, lse, q, k, v, scale, &t); },
                              0, fwd_flops, 1, 10)
                              .ms);
        b_ms[o].push_back(test::time_gpu(
                              ctx,
                              [&] {
                                attn::attention_bwd_cuda(ctx, dq, dk, dv, dout, q, k, v, out, lse,
                                                         scale, &t);
                              },
                              0, 2.5 * fwd_flops, 1, 10)
                              .ms);
      }
    }
    auto median = [](std::vector<double> x) {
      std::sort(x.begin(), x.end());
      return x[x.size() / 2];
    };
    std::printf("attention B%lld T%lld H%lld Hkv%lld Dh%lld, q order (median of 5 rounds):",
                static_cast<long long>(s.B), static_cast<long long>(s.T),
                static_cast<long long>(s.H), static_cast<long long>(s.Hkv),
                static_cast<long long>(s.Dh));
    const char* names[] = {"head by head", "all heads", "auto"};
    for (int o = 0; o < 3; ++o) {
      std::printf("  %s fwd %.3f bwd %.3f ms", names[o], median(f_ms[o]), median(b_ms[o]));
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace lowbit
