// CUDA quantization kernels against the CPU twin: every recipe, byte for byte (payloads,
// scales, amaxes), stochastic rounding included, over shapes and fills that reach every edge
// (zeros, subnormals, values near and above the format max, ±inf and NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/formats.h"
#include "lowbit/quant.h"

namespace lowbit {
namespace {

enum class Fill { kNormal, kZeros, kSubnormal, kNearMax, kSpecials, kHeavyTail, kWideRange };
const char* fill_name(Fill f) {
  switch (f) {
    case Fill::kNormal: return "normal";
    case Fill::kZeros: return "zeros";
    case Fill::kSubnormal: return "subnormal";
    case Fill::kNearMax: return "near_max";
    case Fill::kSpecials: return "specials";
    case Fill::kHeavyTail: return "heavy_tail";
    case Fill::kWideRange: return "wide_range";
  }
  return "?";
}

// A [m, k] bf16 source on the CPU.
Tensor make_source(int64_t m, int64_t k, Fill fill, uint64_t seed) {
  Tensor t = Tensor::empty({m, k}, DType::kBF16, Device::cpu());
  uint16_t* p = t.ptr<uint16_t>();
  for (int64_t i = 0; i < m * k; ++i) {
    const float u1 = philox_uniform(seed, 0, 2 * i) + 1e-7f;
    const float u2 = philox_uniform(seed, 0, 2 * i + 1);
    const float g = std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    float v = 0.0f;
    switch (fill) {
      case Fill::kNormal: v = g; break;
      case Fill::kZeros: v = 0.0f; break;
      case Fill::kSubnormal: v = g * 1e-39f; break;  // bf16 subnormals
      case Fill::kNearMax: v = 448.0f + 40.0f * g; break;
      case Fill::kSpecials:
        v = g;
        if (i % 97 == 5) v = INFINITY;
        if (i % 101 == 7) v = -INFINITY;
        if (i % 89 == 3) v = NAN;
        break;
      case Fill::kHeavyTail: v = g * std::exp(3.0f * g); break;
      case Fill::kWideRange:  // 2^-100 .. 2^100, signed zeros and a few inf/NaN: blocks whose
        // scale underflows to 0 (multiplier FLT_MAX) next to blocks at the tensor amax
        v = g * std::exp2(float(int64_t(philox_uint32(seed, 1, i) % 201) - 100));
        if (i % 53 == 11) v = (i & 64) ? -0.0f : 0.0f;
        if (i % 4999 == 17) v = (i & 1) ? -INFINITY : NAN;
        break;
    }
    p[i] = f32_to_bf16_rn(v);
  }
  return t;
}

// First differing byte of two tensors (one may be on the GPU), or "" when equal.
std::string compare_bytes(const char* what, const Tensor& cpu, const Tensor& gpu) {
  if (cpu.defined() != gpu.defined()) {
    return std::string(what) + ": defined on " + (cpu.defined() ? "CPU" : "GPU") + " only";
  }
  if (!cpu.defined()) return "";
  if (cpu.shape() != gpu.shape() || cpu.dtype() != gpu.dtype()) {
    return std::string(what) + ": " + cpu.view().str() + " vs " + gpu.view().str();
  }
  Tensor g = Tensor::copy_of(gpu.view(), Device::cpu());
  const uint8_t* a = cpu.ptr<const uint8_t>();
  const uint8_t* b = g.ptr<const uint8_t>();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < cpu.nbytes(); ++i) {
    if (a[i] != b[i]) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  const int64_t row_bytes = dtype_storage_bytes(cpu.dtype(), cpu.shape()[cpu.shape().ndim - 1]);
  return fmt::format(
      "{}: {} of {} bytes differ; first at byte {} (row {}, byte {} of the row): "
      "cpu 0x{:02X} gpu 0x{:02X}",
      what, bad, cpu.nbytes(), first, first / row_bytes, first % row_bytes, a[first], b[first]);
}

struct Case {
  std::string name;
  std::function<QuantConfig()> cfg;
  int64_t align;  // both dims must be multiples of this
};

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"fp8_current_e4m3", [] { return QuantConfig::fp8_current(DType::kE4M3); }, 1});
  c.push_back(
      {"fp8_current_e5m2_pow2", [] { return QuantConfig::fp8_current(DType::kE5M2, true); }, 1});
  c.push_back({"fp8_block_1x128", [] { return QuantConfig::fp8_block_1x128(); }, 1});
  c.push_back(
      {"fp8_block_1x128_e5m2", [] { return QuantConfig::fp8_block_1x128(DType::kE5M2); }, 1});
  c.push_back({"fp8_block_128x128", [] { return QuantConfig::fp8_block_128x128(); }, 1});
  c.push_back({"mxfp8_ceil", [] { return QuantConfig::mx(DType::kE4M3); }, 32});
  c.push_back({"mxfp8_e5m2_floor",
               [] { return QuantConfig::mx(DType::kE5M2, MxScaleRounding::kFloor); }, 32});
  c.push_back({"mxfp6_e3m2", [] { return QuantConfig::mx(DType::kE3M2); }, 32});
  c.push_back({"mxfp6_e2m3", [] { return QuantConfig::mx(DType::kE2M3); }, 32});
  c.push_back({"mxfp4", [] { return QuantConfig::mx(DType::kE2M1); }, 32});
  c.push_back({"nvfp4_activation", [] { return QuantConfig::nvfp4_activation(); }, 16});
  c.push_back({"nvfp4_weight", [] { return QuantConfig::nvfp4_weight(); }, 16});
  c.push_back({"nvfp4_gradient",
               [] {
                 QuantConfig q = QuantConfig::nvfp4_gradient();
                 q.sr_key = RngKey{0xABCDEF, 40};
                 return q;
               },
               16});
  return c;
}

void check_case(const Case& c, int64_t m, int64_t k, Fill fill) {
  SCOPED_TRACE(fmt::format("{} {}x{} {}", c.name, m, k, fill_name(fill)));
  Tensor src = make_source(m, k, fill, 17 + m + k);
  Tensor src_gpu = Tensor::copy_of(src.view(), Device::cuda(0));
  Context cpu_ctx(Device::cpu());
  Context gpu_ctx(Device::cuda(0));
  const QuantConfig cfg = c.cfg();
  QuantizedTensor want, got;
  quantize(cpu_ctx, src.view(), cfg, want);
  quantize(gpu_ctx, src_gpu.view(), cfg, got);
  gpu_ctx.synchronize();
  got.validate();
  EXPECT_EQ(got.columnwise_hadamard, want.columnwise_hadamard);
  for (const std::string& err :
       {compare_bytes("rowwise_data", want.rowwise_data, got.rowwise_data),
        compare_bytes("rowwise_scale_inv", want.rowwise_scale_inv, got.rowwise_scale_inv),
        compare_bytes("columnwise_data", want.columnwise_data, got.columnwise_data),
        compare_bytes("columnwise_scale_inv", want.columnwise_scale_inv, got.columnwise_scale_inv),
        compare_bytes("amax", want.amax, got.amax),
        compare_bytes("columnwise_amax", want.columnwise_amax, got.columnwise_amax)}) {
    EXPECT_TRUE(err.empty()) << err;
  }
  // Saturation and underflow counts of the rowwise copy: the kernel against the twin.
  if (want.has_rowwise()) {
    Tensor cw = Tensor::zeros({2}, DType::kI64, Device::cpu());
    Tensor cg = Tensor::zeros({2}, DType::kI64, Device::cuda(0));
    quant_clip_stats(cpu_ctx, src.view(), want, cw);
    quant_clip_stats(gpu_ctx, src_gpu.view(), got, cg);
    const Tensor cgh = Tensor::copy_of(cg, Device::cpu());
    EXPECT_EQ(cgh.ptr<int64_t>()[0], cw.ptr<int64_t>()[0]) << "saturated";
    EXPECT_EQ(cgh.ptr<int64_t>()[1], cw.ptr<int64_t>()[1]) << "underflow";
  }
}

class GpuQuant : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(cuda_device_count(), 0) << "the GPU tests need a CUDA GPU (run them on a GPU host)";
  }
};

TEST_F(GpuQuant, EveryRecipeMatchesCpuTwinOnOddShapesAndFills) {
  // 384×640 and 1024×1024: several full 128×128 tiles (the FP8 block kernels' fast path).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 16}, {65, 80}, {993, 512}, {96, 160}, {992, 512}, {128, 256}, {384, 640}, {1024, 1024}};
  for (const Case& c : cases()) {
    for (auto [m, k] : shapes) {
      if (m % c.align != 0 || k % c.align != 0) continue;
      for (Fill f : {Fill::kNormal, Fill::kZeros, Fill::kSubnormal, Fill::kNearMax, Fill::kSpecials,
                     Fill::kHeavyTail}) {
        check_case(c, m, k, f);
      }
    }
  }
}

TEST_F(GpuQuant, EveryRecipeMatchesCpuTwinAt8192Squared) {
  for (const Case& c : cases()) check_case(c, 8192, 8192, Fill::kNormal);
}

// The NVFP4 quantize pass for bf16 full 128×64 tiles (v11: persistent grid, table multipliers,
// fast encoders, NaN blocks through the codec) in every combination of copies, Hadamard
// transform and stochastic rounding, and with 16×16 blocks (v13: the block scale from the column
// task's shuffles) for either copy alone and both. 4096×1024 has more tiles than one wave of
// blocks, so blocks quantize several tiles (the prefetch path).
TEST_F(GpuQuant, Nvfp4FullTileKernelMatchesCpuTwin) {
  auto variant = [](bool rowwise, bool columnwise, bool rht, bool sr) {
    return [=] {
      QuantConfig q = QuantConfig::nvfp4_activation();
      q.rowwise = rowwise;
      q.columnwise = columnwise;
      q.hadamard_columnwise = rht;
      q.stochastic_rounding = sr;
      q.sr_key = RngKey{0x5EED, 3};
      return q;
    };
  };
  auto weight = [](bool rowwise, bool columnwise) {
    return [=] {
      QuantConfig q = QuantConfig::nvfp4_weight();
      q.rowwise = rowwise;
      q.columnwise = columnwise;
      return q;
    };
  };
  const std::vector<Case> nv = {
      {"nvfp4_both_rht", variant(true, true, true, false), 16},
      {"nvfp4_both_plain", variant(true, true, false, false), 16},
      {"nvfp4_both_rht_sr", variant(true, true, true, true), 16},
      {"nvfp4_both_plain_sr", variant(true, true, false, true), 16},
      {"nvfp4_rowwise_sr", variant(true, false, false, true), 16},
      {"nvfp4_columnwise_rht", variant(false, true, true, false), 16},
      {"nvfp4_columnwise_rht_sr", variant(false, true, true, true), 16},
      {"nvfp4_weight_both", weight(true, true), 16},
      {"nvfp4_weight_rowwise", weight(true, false), 16},
      {"nvfp4_weight_columnwise", weight(false, true), 16},
  };
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{128, 64}, {256, 512}, {384, 1024}};
  for (const Case& c : nv) {
    for (auto [m, k] : shapes) {
      for (Fill f : {Fill::kNormal, Fill::kZeros, Fill::kSubnormal, Fill::kNearMax, Fill::kSpecials,
                     Fill::kHeavyTail, Fill::kWideRange}) {
        check_case(c, m, k, f);
      }
    }
    for (Fill f : {Fill::kNormal, Fill::kSpecials, Fill::kWideRange}) check_case(c, 4096, 1024, f);
  }
}

// From 64 M elements the NVFP4 quantize pass without stochastic rounding walks its tiles in
// groups of 16 M-tiles (nvfp4_kernels.cu): 8320 × 8192 has 65 M-tiles, so four full groups and a
// one-tile last group; 1024 × 65536 has 8, a single group narrower than 16. Every tile is checked
// against the CPU twin (and the SR pass, which keeps the M-fastest walk, at those shapes), with
// 1×16 blocks and with 16×16 ones.
TEST_F(GpuQuant, Nvfp4TileGroupsWithAPartialLastGroupMatchCpuTwin) {
  auto variant = [](bool sr) {
    return [=] {
      QuantConfig q = QuantConfig::nvfp4_activation();
      q.hadamard_columnwise = true;
      q.stochastic_rounding = sr;
      q.sr_key = RngKey{0x5EED, 7};
      return q;
    };
  };
  const std::vector<Case> nv = {{"nvfp4_both_rht", variant(false), 16},
                                {"nvfp4_both_rht_sr", variant(true), 16},
                                {"nvfp4_weight", [] { return QuantConfig::nvfp4_weight(); }, 16}};
  for (const Case& c : nv) {
    check_case(c, 8320, 8192, Fill::kNormal);
    check_case(c, 1024, 65536, Fill::kNormal);
  }
}

// The Blackwell scale swizzle's kernel (block_scale_swizzle.cu) against its CPU twin, byte for
// byte with the zero padding, on shapes that end mid-tile in both directions.
TEST_F(GpuQuant, BlockScaleSwizzleKernelMatchesCpuTwin) {
  for (const auto& [r, c] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {65, 3}, {128, 4}, {200, 33}, {993, 32}, {4096, 17}}) {
    SCOPED_TRACE(testing::Message() << r << "x" << c);
    Tensor host = Tensor::empty({r, c}, DType::kE8M0, Device::cpu());
    uint8_t* h = host.ptr<uint8_t>();
    for (int64_t i = 0; i < r * c; ++i) h[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    const Tensor want = swizzle_block_scales(host.view());
    const Tensor dev = Tensor::copy_of(host.view(), Device::cuda(0));
    const Tensor got = Tensor::copy_of(swizzle_block_scales(dev.view()).view(), Device::cpu());
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), size_t(want.numel())), 0);
  }
}

// An f32 source quantized with round_source_to_bf16 (a weight from its f32 master): the GPU
// (per-tensor: the cast rounds on load; other modes: through a rounded copy) against the CPU
// twin, which rounds first. The source's low mantissa bits are set, so that skipping the
// rounding, or rounding differently, changes codes and amaxes.
TEST_F(GpuQuant, RoundedF32SourceMatchesCpuTwin) {
  const std::vector<Case> rounded = {
      {"fp8_current_e4m3", [] { return QuantConfig::fp8_current(DType::kE4M3); }, 1},
      {"fp8_current_e5m2_pow2", [] { return QuantConfig::fp8_current(DType::kE5M2, true); }, 1},
      {"fp8_current_e4m3_rowwise",
       [] {
         QuantConfig q = QuantConfig::fp8_current(DType::kE4M3);
         q.columnwise = false;
         return q;
       },
       1},
      {"fp8_block_128x128", [] { return QuantConfig::fp8_block_128x128(); }, 1},
      {"nvfp4_weight", [] { return QuantConfig::nvfp4_weight(); }, 16},
  };
  Context cpu_ctx(Device::cpu());
  Context gpu_ctx(Device::cuda(0));
  for (const Case& c : rounded) {
    for (auto [m, k] :
         std::vector<std::pair<int64_t, int64_t>>{{65, 80}, {96, 160}, {1024, 1024}}) {
      if (m % c.align != 0 || k % c.align != 0) continue;
      for (Fill f : {Fill::kNormal, Fill::kNearMax, Fill::kSpecials}) {
        SCOPED_TRACE(fmt::format("{} {}x{} {} (f32 source)", c.name, m, k, fill_name(f)));
        const Tensor b = make_source(m, k, f, 5 + m);
        Tensor src = Tensor::empty({m, k}, DType::kF32, Device::cpu());
        for (int64_t i = 0; i < m * k; ++i) {
          // bf16 value · (1 + u·2^-8), u in [-1, 1): most elements leave the bf16 grid.
          const float u = 2.0f * philox_uniform(77, 2, i) - 1.0f;
          src.ptr<float>()[i] = bf16_to_f32(b.ptr<uint16_t>()[i]) * (1.0f + u * 0.00390625f);
        }
        const Tensor src_gpu = Tensor::copy_of(src.view(), Device::cuda(0));
        QuantConfig cfg = c.cfg();
        cfg.round_source_to_bf16 = true;
        QuantizedTensor want, got;
        quantize(cpu_ctx, src.view(), cfg, want);
        quantize(gpu_ctx, src_gpu.view(), cfg, got);
        gpu_ctx.synchronize();
        got.validate();
        for (const std::string& err :
             {compare_bytes("rowwise_data", want.rowwise_data, got.rowwise_data),
              compare_bytes("rowwise_scale_inv", want.rowwise_scale_inv, got.rowwise_scale_inv),
              compare_bytes("columnwise_data", want.columnwise_data, got.columnwise_data),
              compare_bytes("columnwise_scale_inv", want.columnwise_scale_inv,
                            got.columnwise_scale_inv),
              compare_bytes("amax", want.amax, got.amax)}) {
          EXPECT_TRUE(err.empty()) << err;
        }
      }
    }
  }
}

// One conversion of a queue run on one Context (check_queued).
struct Queued {
  int64_t m, k;
  Fill fill;
  bool f32;  // an f32 source off the bf16 grid (value · 1.001), else bf16
  QuantConfig cfg;
};

// Uploads every source first, then quantizes them all on one Context back to back (no
// synchronisation in between, so the conversions follow each other on the stream as in a
// training step) and compares each with the CPU twin byte for byte. Every configuration is
// meant to be valid: the CPU twin refusing one is a failure.
void check_queued(const std::vector<Queued>& items) {
  Context cpu_ctx(Device::cpu());
  Context gpu_ctx(Device::cuda(0));
  std::vector<Tensor> src_gpu;
  std::vector<QuantizedTensor> got(items.size()), want(items.size());
  std::vector<bool> refused(items.size(), false);  // by the CPU twin
  for (size_t i = 0; i < items.size(); ++i) {
    const Queued& it = items[i];
    Tensor src = make_source(it.m, it.k, it.fill, 40 + i);
    if (it.f32) {
      Tensor f = Tensor::empty({it.m, it.k}, DType::kF32, Device::cpu());
      for (int64_t j = 0; j < it.m * it.k; ++j) {
        f.ptr<float>()[j] = bf16_to_f32(src.ptr<uint16_t>()[j]) * 1.001f;
      }
      src = std::move(f);
    }
    try {
      quantize(cpu_ctx, src.view(), it.cfg, want[i]);
    } catch (const UserError& e) {
      refused[i] = true;
      ADD_FAILURE() << "item " << i << ": the CPU twin refused it: " << e.what();
    }
    src_gpu.push_back(Tensor::copy_of(src.view(), Device::cuda(0)));
  }
  gpu_ctx.synchronize();
  for (size_t i = 0; i < items.size(); ++i) {
    if (!refused[i]) quantize(gpu_ctx, src_gpu[i].view(), items[i].cfg, got[i]);
  }
  gpu_ctx.synchronize();
  for (size_t i = 0; i < items.size(); ++i) {
    if (refused[i]) continue;
    SCOPED_TRACE(fmt::format("item {}: {} {} {}x{} {}{}", i, scaling_mode_name(items[i].cfg.mode),
                             dtype_name(items[i].cfg.dtype), items[i].m, items[i].k,
                             fill_name(items[i].fill), items[i].f32 ? " f32" : ""));
    got[i].validate();
    for (const std::string& err :
         {compare_bytes("rowwise_data", want[i].rowwise_data, got[i].rowwise_data),
          compare_bytes("rowwise_scale_inv", want[i].rowwise_scale_inv, got[i].rowwise_scale_inv),
          compare_bytes("columnwise_data", want[i].columnwise_data, got[i].columnwise_data),
          compare_bytes("columnwise_scale_inv", want[i].columnwise_scale_inv,
                        got[i].columnwise_scale_inv),
          compare_bytes("amax", want[i].amax, got[i].amax),
          compare_bytes("columnwise_amax", want[i].columnwise_amax, got[i].columnwise_amax)}) {
      EXPECT_TRUE(err.empty()) << err;
    }
  }
}

// FP8 current scaling keeps its grid-wide max and block count in the Context's reduction words
// and sets them back to zero in its last block (so does the NVFP4 amax pass): many conversions
// queued back to back on one context — all-zero, NaN/inf, subnormal and huge sources, f32 and
// bf16, partial tiles, amax epsilon and power-of-two scales, NVFP4 in between — must each match
// the CPU twin; a word left non-zero would leak one tensor's amax into the next.
TEST_F(GpuQuant, CurrentScalingBackToBackOnOneContextMatchesCpuTwin) {
  QuantConfig eps = QuantConfig::fp8_current(DType::kE4M3);
  eps.amax_epsilon = 1e-30f;
  QuantConfig e5 = QuantConfig::fp8_current(DType::kE5M2, true);
  QuantConfig rowwise_only = QuantConfig::fp8_current(DType::kE4M3);
  rowwise_only.columnwise = false;
  const QuantConfig e4 = QuantConfig::fp8_current(DType::kE4M3);
  const QuantConfig nv = QuantConfig::nvfp4_activation();
  check_queued({
      {4096, 2048, Fill::kHeavyTail, false, e4},
      {1, 16, Fill::kNormal, false, e4},
      {65, 80, Fill::kZeros, false, e4},
      {256, 512, Fill::kSpecials, false, nv},
      {65, 80, Fill::kZeros, false, eps},
      {993, 512, Fill::kSpecials, false, e5},
      {128, 256, Fill::kSubnormal, false, e4},
      {128, 256, Fill::kZeros, false, nv},
      {192, 384, Fill::kNearMax, true, e4},
      {4096, 2048, Fill::kNormal, false, e4},
      {96, 160, Fill::kNormal, true, rowwise_only},
      {64, 128, Fill::kWideRange, false, e5},
      {1024, 1024, Fill::kSpecials, true, eps},
  });
}

// MX and NVFP4 scale tensors and the NVFP4 global amaxes are no longer zero-filled before their
// kernels run (compact layouts: every entry is written). Under LOWBIT_POISON_ALLOC=1 (how the GPU
// tests run) an entry left unwritten reads as 0xA5 and differs from the CPU twin. Covers the
// copies and sources the other tests leave out: one copy only, partial tiles (M % 16 != 0 for
// NVFP4 rowwise, K % 32 != 0 for MX columnwise), 16×16 weights columnwise only, f32 sources
// without rounding, and empty tensors.
TEST_F(GpuQuant, UnzeroedScalesAndAmaxesAreAllWritten) {
  auto copies = [](QuantConfig q, bool rowwise, bool columnwise) {
    q.rowwise = rowwise;
    q.columnwise = columnwise;
    return q;
  };
  QuantConfig nv_plain = QuantConfig::nvfp4_activation();
  nv_plain.hadamard_columnwise = false;  // f32 sources take no Hadamard transform
  QuantConfig nv_sr = QuantConfig::nvfp4_gradient();
  nv_sr.sr_key = RngKey{0x5EED, 11};
  const QuantConfig mx8 = QuantConfig::mx(DType::kE4M3);
  const QuantConfig mx4 = QuantConfig::mx(DType::kE2M1);
  const QuantConfig w2d = QuantConfig::nvfp4_weight();
  std::vector<Queued> items;
  for (Fill f : {Fill::kNormal, Fill::kSpecials}) {
    for (bool f32 : {false, true}) {
      items.push_back({40, 64, f, f32, copies(nv_plain, true, false)});
      items.push_back({48, 80, f, f32, copies(w2d, false, true)});
      items.push_back({48, 80, f, f32, copies(w2d, true, false)});
      items.push_back({40, 64, f, f32, copies(mx8, true, false)});
      items.push_back({64, 40, f, f32, copies(mx8, false, true)});
      items.push_back({96, 128, f, f32, mx4});
      items.push_back({64, 96, f, f32, copies(nv_plain, false, true)});
    }
    items.push_back({40, 64, f, false, copies(nv_sr, true, false)});
    items.push_back({256, 128, f, false, copies(QuantConfig::nvfp4_activation(), false, true)});
  }
  for (const QuantConfig& c :
       {QuantConfig::fp8_current(DType::kE4M3), QuantConfig::nvfp4_activation(), mx8, w2d}) {
    items.push_back({0, 64, Fill::kNormal, false, c});
  }
  check_queued(items);
}

TEST_F(GpuQuant, InvalidShapesAreRejectedLikeOnTheCpu) {
  Tensor src = make_source(65, 80, Fill::kNormal, 1);
  Tensor src_gpu = Tensor::copy_of(src.view(), Device::cuda(0));
  Context gpu_ctx(Device::cuda(0));
  QuantizedTensor out;
  EXPECT_THROW(quantize(gpu_ctx, src_gpu.view(), QuantConfig::mx(), out), UserError);
  EXPECT_THROW(quantize(gpu_ctx, src_gpu.view(), QuantConfig::nvfp4_activation(), out), UserError);
}

}  // namespace
}  // namespace lowbit
