// `lowbit bench gemm`: TFLOP/s of gemm() for every mode on square shapes and on the fprop,
// dgrad and wgrad GEMMs of the model presets, with the same problems also run as raw cuBLASLt
// calls (bf16 and per-tensor FP8) to measure what gemm() adds.
//
// Algorithm: gemm() picks its cuBLASLt algorithm once per problem (by timing the heuristic's
// candidates unless LOWBIT_GEMM_AUTOTUNE=0, see gemm_autotune()); a first untimed gemm() call
// makes that choice, each lowbit row prints it ("algo #i of n", i = 1 is cuBLASLt's first
// heuristic choice), and the raw cuBLASLt twin runs that same algorithm, so that "vs raw" is
// what gemm() adds around one cublasLtMatmul.
//
// Every (layer, mode) prepares its operands once: X [M, K], W [N, K] and dY [M, N] bf16 from a
// Philox fill, then quantize() with exactly the copies the selected roles need (fprop: X and W
// rowwise; dgrad: dY rowwise, W columnwise; wgrad: dY and X columnwise). Nothing of the
// preparation is timed; the emulated MX / NVFP4 times include gemm()'s dequantization to bf16.
//
// Timing: CUDA events around bursts of back-to-back calls (the burst is long enough, ≈ 1 ms,
// that host launch cost is hidden whenever the host keeps ahead of the GPU, as in training);
// the median burst over the calls in it is one call's time; gemm(), its raw cuBLASLt twin and
// (for every mode but bf16) the bf16 gemm() of the same role alternate burst by burst, and the
// "x bf16" ratio divides those interleaved medians. FLOPs = 2·M·N·K for every role.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "bench/gemm_bench.h"
#include "gemm/gemm_internal.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/core/philox.h"
#include "lowbit/formats.h"
#include "lowbit/quant.h"

namespace lowbit::bench {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr size_t kRawWorkspaceBytes = size_t(32) << 20;  // as gemm_cuda.cpp

// Normal(0, 1) · scale bf16 values from Philox (Box–Muller).
__global__ void fill_normal_bf16_kernel(uint16_t* x, int64_t n, uint64_t seed, float scale) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float u1 = philox_uniform(seed, 0, 2 * i) + 1e-7f;
  const float u2 = philox_uniform(seed, 0, 2 * i + 1);
  const float v = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  x[i] = f32_to_bf16_rn(v * scale);
}

Tensor random_bf16(int64_t rows, int64_t cols, uint64_t seed, float scale, cudaStream_t stream) {
  Tensor t = Tensor::empty(Shape{rows, cols}, DType::kBF16, Device::cuda(0));
  const int64_t n = rows * cols;
  fill_normal_bf16_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(t.ptr<uint16_t>(), n, seed,
                                                                         scale);
  LOWBIT_CUDA_CHECK_LAUNCH();
  return t;
}

// Median milliseconds of one call of each fns[f]: a first call and `warmup` calls each, then
// `iters` rounds in which every function runs one burst of back-to-back calls between two
// events (the functions alternate, in an order that rotates each round, so that clock and thermal
// drift affect them alike; the burst length comes from the warm-up speed of fns[0], aiming at
// ≈ 1 ms).
std::vector<double> time_median_ms(cudaStream_t stream, int warmup, int iters,
                                   const std::vector<std::function<void()>>& fns) {
  cudaEvent_t a, b;
  LOWBIT_CUDA_CHECK(cudaEventCreate(&a));
  LOWBIT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<std::vector<double>> ms(fns.size());
  try {
    for (const auto& fn : fns) fn();  // first calls: plan building, workspace growth
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int w = std::max(warmup, 1);
    float t = 0;
    for (size_t f = 0; f < fns.size(); ++f) {
      LOWBIT_CUDA_CHECK(cudaEventRecord(a, stream));
      for (int i = 0; i < w; ++i) fns[f]();
      LOWBIT_CUDA_CHECK(cudaEventRecord(b, stream));
      LOWBIT_CUDA_CHECK(cudaEventSynchronize(b));
      if (f == 0) LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    }
    const double est = std::max(double(t) / w, 1e-4);
    const int burst = std::clamp(int(std::ceil(1.0 / est)), 1, 64);
    for (int i = 0; i < iters; ++i) {
      // The order rotates round by round, so that every function takes every place in the
      // round equally often (the clocks after an FP8 burst are not those after a bf16 burst).
      for (size_t q = 0; q < fns.size(); ++q) {
        const size_t f = (q + size_t(i)) % fns.size();
        LOWBIT_CUDA_CHECK(cudaEventRecord(a, stream));
        for (int j = 0; j < burst; ++j) fns[f]();
        LOWBIT_CUDA_CHECK(cudaEventRecord(b, stream));
        LOWBIT_CUDA_CHECK(cudaEventSynchronize(b));
        LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms[f].push_back(double(t) / burst);
      }
    }
  } catch (...) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    throw;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::vector<double> med;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

cudaDataType_t raw_type(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kE4M3: return CUDA_R_8F_E4M3;
    case DType::kE5M2: return CUDA_R_8F_E5M2;
    default: break;
  }
  throw UserError(fmt::format("bench gemm: no raw cuBLASLt type for {}", dtype_name(t)));
}

// The canonical problem of gemm() issued directly to cuBLASLt: descriptor and layouts built
// once here, with the algorithm gemm() ran for the same problem (`algo`, checked against these
// descriptors with cublasLtMatmulAlgoCheck), so that run() is one cublasLtMatmul. The row-major
// → column-major mapping is gemm_cuda.cpp's: cuBLASLt A = B' (op T when K-contiguous), B = A'
// (op N when K-contiguous), m = C, n = R, k = Kc, D = out (row-major [R, C] = column-major
// [C, R]).
class RawLt {
 public:
  struct Operand {
    const void* ptr = nullptr;
    DType dtype = DType::kBF16;
    bool k_contiguous = true;
    int64_t rows = 0, ld = 0;
    const float* scale = nullptr;
  };

  RawLt(Context& ctx, const CanonGemm& g, const TensorView& out, const GemmCudaLastCall& algo)
      : lt_(reinterpret_cast<cublasLtHandle_t>(ctx.cublaslt())), stream_(ctx.stream()) {
    LOWBIT_USER_CHECK(algo.valid, "raw cuBLASLt: gemm() ran no cuBLASLt algorithm to reuse");
    a_ = operand(g.b);
    b_ = operand(g.a);
    d_ = out.data;
    m_ = g.C;
    n_ = g.R;
    k_ = g.Kc;
    const bool fp8 = a_.dtype != DType::kBF16;
    workspace_ = Tensor::empty(Shape{int64_t(kRawWorkspaceBytes)}, DType::kU8, Device::cuda(0));
    LOWBIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = a_.k_contiguous ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = b_.k_contiguous ? CUBLAS_OP_N : CUBLAS_OP_T;
    set(CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    if (fp8) {
      const int8_t fast = g.fast_accum ? 1 : 0;
      const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
      set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode);
      set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode);
      set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_.scale);
      set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_.scale);
    }
    auto layout = [this](const Operand& o, cublasLtMatrixLayout_t* l) {
      const uint64_t r = o.k_contiguous ? k_ : o.rows, c = o.k_contiguous ? o.rows : k_;
      LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, raw_type(o.dtype), r, c, o.ld));
    };
    layout(a_, &la_);
    layout(b_, &lb_);
    LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld_, CUDA_R_16BF, m_, n_, m_));

    static_assert(sizeof(algo_) == sizeof(algo.algo), "one cublasLtMatmulAlgo_t");
    std::memcpy(&algo_, algo.algo, sizeof(algo_));
    cublasLtMatmulHeuristicResult_t check{};
    const cublasStatus_t st =
        cublasLtMatmulAlgoCheck(lt_, desc_, la_, lb_, ld_, ld_, &algo_, &check);
    if (st != CUBLAS_STATUS_SUCCESS || check.workspaceSize > kRawWorkspaceBytes) {
      release();
      throw UserError(
          fmt::format("raw cuBLASLt: gemm()'s algorithm does not fit the raw descriptors "
                      "(status {}, workspace {} bytes)",
                      int(st), check.workspaceSize));
    }
  }
  ~RawLt() { release(); }
  RawLt(const RawLt&) = delete;
  RawLt& operator=(const RawLt&) = delete;

  void run() {
    LOWBIT_CUBLAS_CHECK(cublasLtMatmul(lt_, desc_, &alpha_, a_.ptr, la_, b_.ptr, lb_, &beta_, d_,
                                       ld_, d_, ld_, &algo_, workspace_.data(), kRawWorkspaceBytes,
                                       stream_));
  }

 private:
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    LOWBIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attr, &v, sizeof(v)));
  }

  // Dense bf16 operands in their natural layout (transposed ones flip the op); per-tensor FP8
  // copies stored [rows, kc].
  static Operand operand(const CanonOperand& o) {
    Operand r;
    r.rows = o.rows;
    if (o.q == nullptr) {
      r.ptr = o.dense.data;
      r.dtype = DType::kBF16;
      r.k_contiguous = !o.transposed;
      r.ld = o.dense.strides[0];
      return r;
    }
    LOWBIT_USER_CHECK(o.q->mode == ScalingMode::kPerTensor,
                      "raw cuBLASLt is measured for bf16 and per-tensor FP8 only");
    const bool row = o.usage == Usage::kRowwise;
    const Tensor& data = row ? o.q->rowwise_data : o.q->columnwise_data;
    const Tensor& scale = row ? o.q->rowwise_scale_inv : o.q->columnwise_scale_inv;
    r.ptr = data.data();
    r.dtype = o.q->dtype;
    r.k_contiguous = true;
    r.ld = o.kc;
    r.scale = scale.ptr<const float>();
    return r;
  }

  void release() {
    if (la_ != nullptr) cublasLtMatrixLayoutDestroy(la_);
    if (lb_ != nullptr) cublasLtMatrixLayoutDestroy(lb_);
    if (ld_ != nullptr) cublasLtMatrixLayoutDestroy(ld_);
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
    la_ = lb_ = ld_ = nullptr;
    desc_ = nullptr;
  }

  cublasLtHandle_t lt_;
  cudaStream_t stream_;
  Operand a_, b_;
  void* d_ = nullptr;
  int64_t m_ = 0, n_ = 0, k_ = 0;
  Tensor workspace_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, ld_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  const float alpha_ = 1.0f, beta_ = 0.0f;
};

// Quantization of X, W and dY in one mode (std::nullopt: bf16).
struct ModeConfigs {
  QuantConfig x, w, dy;
};
std::optional<ModeConfigs> mode_configs(const std::string& mode) {
  if (mode == "bf16") return std::nullopt;
  if (mode == "fp8") {
    // HYBRID: forward tensors E4M3, gradients E5M2; current scaling (the GEMM is the same as
    // with delayed scaling).
    return ModeConfigs{QuantConfig::fp8_current(DType::kE4M3),
                       QuantConfig::fp8_current(DType::kE4M3),
                       QuantConfig::fp8_current(DType::kE5M2)};
  }
  if (mode == "fp8-block") {
    return ModeConfigs{QuantConfig::fp8_block_1x128(), QuantConfig::fp8_block_128x128(),
                       QuantConfig::fp8_block_1x128()};
  }
  if (mode == "mxfp8") return ModeConfigs{QuantConfig::mx(), QuantConfig::mx(), QuantConfig::mx()};
  if (mode == "nvfp4") {
    return ModeConfigs{QuantConfig::nvfp4_activation(), QuantConfig::nvfp4_weight(),
                       QuantConfig::nvfp4_gradient()};
  }
  throw UserError(fmt::format("bench gemm: unknown mode '{}'", mode));
}

std::string short_error(const std::exception& e) {
  std::string s = e.what();
  const size_t nl = s.find('\n');
  if (nl != std::string::npos) s = s.substr(0, nl);
  return s.size() > 300 ? s.substr(0, 297) + "..." : s;
}

GemmBenchRow make_row(const GemmBenchShape& s, GemmRole role, const std::string& mode,
                      const std::string& error) {
  GemmBenchRow r;
  r.shape = s.name;
  r.m = s.m;
  r.n = s.n;
  r.k = s.k;
  r.role = std::string(gemm_role_name(role));
  r.mode = mode;
  r.flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
  r.error = error;
  return r;
}

// `note`: printed at the end of the line (which algorithm gemm() runs).
void print_row(const GemmBenchRow& r, const std::string& note = "") {
  const std::string label = fmt::format("{} {}", r.shape, r.role);
  const std::string impl = r.impl == "lowbit" ? r.mode : r.mode + " (raw)";
  if (!r.error.empty()) {
    std::printf("%-22s %-16s error: %s\n", label.c_str(), impl.c_str(), r.error.c_str());
  } else {
    const std::string ratio =
        std::isnan(r.ratio_bf16) ? "" : fmt::format("{:.2f}x bf16", r.ratio_bf16);
    const std::string over =
        std::isnan(r.overhead_pct) ? "" : fmt::format("{:+.1f}% vs raw", r.overhead_pct);
    std::printf("%-22s %-16s %9.4f ms %7.1f TFLOP/s %12s %14s%s%s\n", label.c_str(), impl.c_str(),
                r.ms, r.tflops, ratio.c_str(), over.c_str(), note.empty() ? "" : "   ",
                note.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

std::vector<GemmBenchShape> gemm_bench_preset(const std::string& name) {
  // Linear layers per transformer block (M = tokens of one micro-batch):
  //   124m: d 768, GELU MLP ffn 3072, vocab 32000, 16×1024 tokens (the LM head is a GEMM too).
  //   1b:   d 2048, GELU MLP ffn 8192, 8×2048 tokens.
  //   8b:   d 4096, Llama-3-8B layout: GQA 32 query / 8 KV heads of 128 (qkv out 6144), SwiGLU
  //         ffn 14336 with gate and up fused (out 28672), 8×2048 tokens.
  if (name == "124m") {
    const int64_t m = 16 * 1024;
    return {{"124m.qkv", m, 2304, 768},
            {"124m.proj", m, 768, 768},
            {"124m.fc1", m, 3072, 768},
            {"124m.fc2", m, 768, 3072},
            {"124m.head", m, 32000, 768}};
  }
  if (name == "1b") {
    const int64_t m = 8 * 2048;
    return {{"1b.qkv", m, 6144, 2048},
            {"1b.proj", m, 2048, 2048},
            {"1b.fc1", m, 8192, 2048},
            {"1b.fc2", m, 2048, 8192}};
  }
  if (name == "8b") {
    const int64_t m = 8 * 2048;
    return {{"8b.qkv", m, 6144, 4096},
            {"8b.proj", m, 4096, 4096},
            {"8b.gate_up", m, 28672, 4096},
            {"8b.down", m, 4096, 14336}};
  }
  if (name == "square") {
    return {{"4096x4096x4096", 4096, 4096, 4096}, {"8192x8192x8192", 8192, 8192, 8192}};
  }
  return {};
}

const std::vector<std::string>& gemm_bench_modes() {
  static const std::vector<std::string> modes = {"bf16", "fp8", "fp8-block", "mxfp8", "nvfp4"};
  return modes;
}

std::vector<GemmBenchRow> run_gemm_bench(const GemmBenchOptions& opt) {
  LOWBIT_USER_CHECK(cuda_device_count() > 0, "bench gemm needs a CUDA GPU; none was found");
  Context ctx(Device::cuda(0));
  cudaStream_t stream = ctx.stream();
  set_gemm_fused_parts(opt.fused_parts);
  struct PartsReset {
    ~PartsReset() { set_gemm_fused_parts(0); }
  } parts_reset;
  const auto has_role = [&](GemmRole r) {
    return std::find(opt.roles.begin(), opt.roles.end(), r) != opt.roles.end();
  };
  const bool fprop = has_role(GemmRole::kFprop), dgrad = has_role(GemmRole::kDgrad),
             wgrad = has_role(GemmRole::kWgrad);
  std::vector<GemmBenchRow> rows;

  for (const GemmBenchShape& s : opt.shapes) {
    const int64_t M = s.m, N = s.n, K = s.k;
    const double flops = 2.0 * double(M) * double(N) * double(K);
    // The bf16 sources, made once per layer (dY only when a backward role is measured).
    Tensor x, w, dy;
    try {
      x = random_bf16(M, K, 11, 1.0f, stream);
      w = random_bf16(N, K, 12, 0.02f, stream);
      if (dgrad || wgrad) dy = random_bf16(M, N, 13, 1e-3f, stream);
      LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    } catch (const std::exception& e) {
      for (const std::string& mode : opt.modes) {
        for (GemmRole role : opt.roles) {
          GemmBenchRow r = make_row(s, role, mode, short_error(e));
          print_row(r);
          rows.push_back(r);
        }
      }
      continue;
    }

    for (const std::string& mode : opt.modes) {
      const std::optional<ModeConfigs> cfgs = mode_configs(mode);
      // Quantized operands with the copies the selected roles need.
      QuantizedTensor qx, qw, qdy;
      std::string prep_error;
      try {
        if (cfgs) {
          auto quant = [&](const Tensor& src, QuantConfig cfg, bool row, bool col,
                           QuantizedTensor& out) {
            if (!row && !col) return;
            cfg.rowwise = row;
            cfg.columnwise = col;
            quantize(ctx, src, cfg, out);
          };
          quant(x, cfgs->x, fprop, wgrad, qx);
          quant(w, cfgs->w, fprop, dgrad, qw);
          quant(dy, cfgs->dy, dgrad, wgrad, qdy);
          LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
        }
      } catch (const std::exception& e) {
        prep_error = "quantize: " + short_error(e);
      }

      for (GemmRole role : opt.roles) {
        GemmBenchRow row = make_row(s, role, mode, prep_error);
        auto op = [&](const Tensor& dense, const QuantizedTensor& q) {
          return cfgs ? GemmOperand::of(q) : GemmOperand::of(dense.view());
        };
        GemmOperand a, b;
        Shape out_shape;
        switch (role) {
          case GemmRole::kFprop: a = op(x, qx), b = op(w, qw), out_shape = Shape{M, N}; break;
          case GemmRole::kDgrad: a = op(dy, qdy), b = op(w, qw), out_shape = Shape{M, K}; break;
          case GemmRole::kWgrad: a = op(dy, qdy), b = op(x, qx), out_shape = Shape{N, K}; break;
        }
        std::optional<GemmBenchRow> raw_row;
        std::string algo_note;
        if (prep_error.empty()) {
          try {
            GemmOptions gopt;
            gopt.role = role;  // accumulation: the TE default policy
            Tensor out = Tensor::empty(out_shape, DType::kBF16, Device::cuda(0));
            const CanonGemm g = canonicalize(ctx, a, b, out, gopt);
            row.backend = std::string(gemm_backend_name(g.backend));
            row.r = g.R;
            row.c = g.C;
            row.kc = g.Kc;
            // A first call picks gemm()'s algorithm (timing the candidates when autotuning).
            gemm(ctx, a, b, out, gopt);
            LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
            const GemmCudaLastCall algo = gemm_cuda_last_call();
            if (algo.valid && algo.fused_dequant) {
              algo_note = "fused dequantization kernel";
            } else if (algo.valid) {
              algo_note = fmt::format("algo #{} of {}{}", algo.algo_index + 1, algo.candidates,
                                      algo.autotuned ? " (timed)" : "");
            }
            // Raw cuBLASLt of the same problem and algorithm (bf16 and per-tensor FP8), timed
            // interleaved with gemm().
            std::unique_ptr<RawLt> raw;
            std::string raw_error;
            if (g.backend == GemmBackend::kCublasLtBf16 || g.backend == GemmBackend::kCublasLtFp8) {
              try {
                raw = std::make_unique<RawLt>(ctx, g, out, algo);
              } catch (const std::exception& e) {
                raw_error = short_error(e);
              }
            }
            // The bf16 GEMM of the same role runs interleaved with every other mode, so that
            // the ratio compares calls made under the same clocks (an H100 at FP8 rates is
            // power-limited: rows measured minutes apart differ by several percent).
            const GemmOperand bf_a =
                GemmOperand::of(role == GemmRole::kFprop ? x.view() : dy.view());
            const GemmOperand bf_b =
                GemmOperand::of(role == GemmRole::kWgrad ? x.view() : w.view());
            std::vector<std::function<void()>> fns = {[&] { gemm(ctx, a, b, out, gopt); }};
            int raw_i = -1, bf16_i = -1;
            if (raw) {
              raw_i = static_cast<int>(fns.size());
              fns.push_back([&] { raw->run(); });
            }
            if (cfgs) {
              bf16_i = static_cast<int>(fns.size());
              fns.push_back([&] { gemm(ctx, bf_a, bf_b, out, gopt); });
            }
            const std::vector<double> ms = time_median_ms(stream, opt.warmup, opt.iters, fns);
            row.ms = ms[0];
            row.tflops = flops / row.ms / 1e9;
            row.bf16_ms = bf16_i >= 0 ? ms[bf16_i] : row.ms;
            row.ratio_bf16 = row.bf16_ms / row.ms;
            if (raw || !raw_error.empty()) {
              GemmBenchRow rr = row;
              rr.impl = "cublaslt";
              rr.ratio_bf16 = rr.bf16_ms = kNaN;
              if (raw) {
                rr.ms = ms[raw_i];
                rr.tflops = flops / rr.ms / 1e9;
                row.overhead_pct = 100.0 * (row.ms / rr.ms - 1.0);
              } else {
                rr.ms = rr.tflops = kNaN;
                rr.error = raw_error;
              }
              raw_row = rr;
            }
            LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
          } catch (const std::exception& e) {
            row.ms = row.tflops = row.ratio_bf16 = row.bf16_ms = kNaN;
            row.error = short_error(e);
          }
        }
        print_row(row, algo_note);
        rows.push_back(row);
        if (raw_row) {
          print_row(*raw_row);
          rows.push_back(*raw_row);
        }
      }
    }
  }
  return rows;
}

}  // namespace lowbit::bench
