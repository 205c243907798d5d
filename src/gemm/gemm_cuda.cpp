// CUDA backends of gemm() (formats.md §3–§4): cuBLASLt BF16, per-tensor FP8, FP8 block scaling
// (VEC128_32F / BLK128x128_32F) and the emulated MX / NVFP4 path of Hopper (exact dequantization
// to bf16, then the BF16 GEMM). Descriptors and heuristic choices are cached per problem.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "gemm/gemm_cuda_kernels.h"
#include "gemm/gemm_internal.h"
#include "lowbit/core/cuda_check.h"

namespace lowbit {
namespace {

constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Largest power of two (≤ 256) dividing the address: cuBLASLt's MIN_ALIGNMENT preferences.
int64_t ptr_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 1;
  while (al < 256 && (a % (2 * al)) == 0) al *= 2;
  return al;
}

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    case DType::kE4M3: return CUDA_R_8F_E4M3;
    case DType::kE5M2: return CUDA_R_8F_E5M2;
    default: break;
  }
  throw_internal(__FILE__, __LINE__,
                 fmt::format("gemm_cuda: no cuBLASLt type for {}", dtype_name(t)));
}

// One cuBLASLt operand in cuBLASLt's column-major terms.
//
// A canonical operand (A' [R, Kc] or B' [C, Kc], row-major) is stored either K-contiguous
// (`k_contiguous`: row-major [rows, Kc] with row stride ld == column-major [Kc, rows]) or
// transposed (row-major [Kc, rows] with row stride ld == column-major [rows, Kc]).
struct LtOperand {
  const void* ptr = nullptr;
  DType dtype = DType::kBF16;
  bool k_contiguous = true;
  int64_t rows = 0;  // R or C: the operand's non-contracted extent
  int64_t ld = 0;
  const float* scale = nullptr;  // dequant scale_inv (FP8 modes), null = 1
  int32_t scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

struct LtProblem {
  LtOperand a, b;  // cuBLASLt's A and B (see the mapping in run_lt)
  int64_t m = 0, n = 0, k = 0;
  void* d = nullptr;
  DType d_dtype = DType::kBF16;
  int64_t ldd = 0;
  bool fp8 = false;
  bool fast_accum = false;
  bool device_pointers = false;  // alpha/beta are device pointers (NVFP4 alpha fold)
  const float* alpha = nullptr;
  const float* beta = nullptr;
  void* workspace = nullptr;
};

using PlanKey = std::array<int64_t, 22>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, cd = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

std::mutex g_plan_mutex;
std::map<PlanKey, Plan>& plan_cache() {
  static auto* cache = new std::map<PlanKey, Plan>();  // never destroyed: handles outlive exit
  return *cache;
}

std::string describe(const LtProblem& p) {
  return fmt::format(
      "cuBLASLt m={} n={} k={} A {} {} ld={} B {} {} ld={} D {} ld={} scale modes {}/{} "
      "fast_accum={}",
      p.m, p.n, p.k, dtype_name(p.a.dtype), p.a.k_contiguous ? "T" : "N", p.a.ld,
      dtype_name(p.b.dtype), p.b.k_contiguous ? "N" : "T", p.b.ld, dtype_name(p.d_dtype), p.ldd,
      p.a.scale_mode, p.b.scale_mode, p.fast_accum ? 1 : 0);
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

Plan build_plan(cublasLtHandle_t lt, const LtProblem& p) {
  Plan plan;
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = p.a.k_contiguous ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.b.k_contiguous ? CUBLAS_OP_N : CUBLAS_OP_T;
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  const cublasLtPointerMode_t pm =
      p.device_pointers ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, pm);
  if (p.fp8) {
    const int8_t fast = p.fast_accum ? 1 : 0;
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, p.a.scale_mode);
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, p.b.scale_mode);
    // The heuristic sees the real (non-null) scale pointers; they are reset on every call.
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.a.scale);
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.b.scale);
  }
  // Layouts (column-major): a K-contiguous operand is [k, rows], a transposed one [rows, k].
  auto layout = [](const LtOperand& o, int64_t k, cublasLtMatrixLayout_t* out) {
    const uint64_t r = o.k_contiguous ? k : o.rows, c = o.k_contiguous ? o.rows : k;
    LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(out, lt_type(o.dtype), r, c, o.ld));
  };
  layout(p.a, p.k, &plan.a);
  layout(p.b, p.k, &plan.b);
  // C and D share one layout (C = D = out; beta · out reads it).
  LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.cd, lt_type(p.d_dtype), p.m, p.n, p.ldd));

  cublasLtMatmulPreference_t pref;
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kLtWorkspaceBytes;
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al_a = ptr_alignment(p.a.ptr), al_b = ptr_alignment(p.b.ptr),
                 al_d = ptr_alignment(p.d);
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
  cublasLtMatmulHeuristicResult_t h{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, plan.desc, plan.a, plan.b, plan.cd,
                                                           plan.cd, pref, 1, &h, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.cd);
    cublasLtMatmulDescDestroy(plan.desc);
    throw UserError(fmt::format(
        "gemm: cuBLASLt offers no algorithm for this problem on this GPU ({}; status {}). FP8 "
        "operands need the contracted dimension and leading dimensions padded to a multiple "
        "of 16 and 16-byte aligned data",
        describe(p), static_cast<int>(st)));
  }
  plan.algo = h.algo;
  return plan;
}

// Runs D = alpha · op(A)·op(B) + beta · C with C = D through the plan cache.
//
// The row-major → column-major mapping, done here once for every backend:
//   out[r, c] = Σ_j A'[r, j] · B'[c, j]          (r < R, c < C, j < Kc; out row-major, ld)
//   for (r) for (c) { acc = 0; for (j) acc += A'[r*Kc + j] * B'[c*Kc + j];
//                     out[r*ld + c] = alpha * acc + beta * out[r*ld + c]; }
// A row-major [R, C] buffer is the column-major [C, R] matrix D = outᵀ, and
//   D = B' · A'ᵀ  →  cuBLASLt A = B' (stored column-major [Kc, C], transa = T),
//                    cuBLASLt B = A' (stored column-major [Kc, R], transb = N),
//                    m = C, n = R, k = Kc, lda = ldb = Kc, ldd = ld (= C when contiguous).
// Transposed dense operands flip the op instead of being copied (see LtOperand); the scale of
// each operand travels with it, so B'’s scale is cuBLASLt's A scale and A'’s is the B scale.
void run_lt(Context& ctx, const LtProblem& p) {
  PlanKey key = {ctx.device().index,
                 static_cast<int64_t>(p.a.dtype),
                 static_cast<int64_t>(p.b.dtype),
                 static_cast<int64_t>(p.d_dtype),
                 p.a.k_contiguous,
                 p.b.k_contiguous,
                 p.m,
                 p.n,
                 p.k,
                 p.a.ld,
                 p.b.ld,
                 p.ldd,
                 p.a.scale_mode,
                 p.b.scale_mode,
                 p.fp8,
                 p.fast_accum,
                 p.device_pointers,
                 0,  // epilogue: none (bias is a separate kernel)
                 ptr_alignment(p.a.ptr),
                 ptr_alignment(p.b.ptr),
                 ptr_alignment(p.d),
                 0};
  auto lt = reinterpret_cast<cublasLtHandle_t>(ctx.cublaslt());
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  auto& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build_plan(lt, p)).first;
  const Plan& plan = it->second;
  if (p.fp8) {
    // Per-call pointers on the shared descriptor: set and used under the lock.
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.a.scale);
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.b.scale);
  }
  LOWBIT_CUBLAS_CHECK(cublasLtMatmul(lt, plan.desc, p.alpha, p.a.ptr, plan.a, p.b.ptr, plan.b,
                                     p.beta, p.d, plan.cd, p.d, plan.cd, &plan.algo, p.workspace,
                                     kLtWorkspaceBytes, ctx.stream()));
}

const Tensor& copy_data(const CanonOperand& o) {
  return o.usage == Usage::kRowwise ? o.q->rowwise_data : o.q->columnwise_data;
}
const Tensor& copy_scale(const CanonOperand& o) {
  return o.usage == Usage::kRowwise ? o.q->rowwise_scale_inv : o.q->columnwise_scale_inv;
}
const Tensor& copy_amax(const CanonOperand& o) {
  return o.usage == Usage::kRowwise ? o.q->amax : o.q->columnwise_amax;
}

bool is_nvfp4_mode(ScalingMode m) {
  return m == ScalingMode::kNVFP4_1x16 || m == ScalingMode::kNVFP4_16x16;
}

// A dense bf16 operand: K-contiguous unless `transposed`, row stride from the view.
LtOperand dense_operand(const CanonOperand& o, const char* which) {
  const TensorView& v = o.dense;
  LOWBIT_CHECK(v.dtype == DType::kBF16, "gemm_cuda: dense operand {} must be bf16, got {}", which,
               v.str());
  LOWBIT_CHECK(v.ndim() == 2 && (v.strides[1] == 1 || v.shape[1] == 1),
               "gemm_cuda: dense operand {} must be row-major with unit inner stride, got {}",
               which, v.str());
  LtOperand l;
  l.ptr = v.data;
  l.dtype = DType::kBF16;
  l.k_contiguous = !o.transposed;
  l.rows = o.rows;
  l.ld = v.shape[0] == 1 ? std::max<int64_t>(v.shape[1], 1) : v.strides[0];
  return l;
}

// A per-tensor or block-scaled FP8 copy: stored [rows, kc] (rowwise, or the transposed
// columnwise copy), K-contiguous, with its scale_inv as the dequant scale.
LtOperand fp8_operand(const CanonOperand& o, bool block) {
  const Tensor& data = copy_data(o);
  const Tensor& scale = copy_scale(o);
  LOWBIT_CHECK(data.defined() && scale.defined(), "gemm_cuda: the {} copy of {} is missing",
               o.usage == Usage::kRowwise ? "rowwise" : "columnwise", o.q->str());
  LOWBIT_CHECK(data.shape()[0] == o.rows && data.shape()[1] == o.kc,
               "gemm_cuda: copy {} is not [rows {}, kc {}]", data.view().str(), o.rows, o.kc);
  LtOperand l;
  l.ptr = data.data();
  l.dtype = o.q->dtype;
  l.k_contiguous = true;
  l.rows = o.rows;
  l.ld = o.kc;
  l.scale = scale.ptr<const float>();
  if (block) {
    LOWBIT_CHECK(o.q->mode == ScalingMode::kBlock1x128 || o.q->mode == ScalingMode::kBlock128x128,
                 "gemm_cuda: FP8 block backend got {}", o.q->str());
    l.scale_mode = o.q->mode == ScalingMode::kBlock1x128
                       ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                       : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  } else {
    LOWBIT_CHECK(o.q->mode == ScalingMode::kPerTensor, "gemm_cuda: FP8 backend got {}", o.q->str());
    l.scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
  return l;
}

// Bytes of the bf16 buffer an emulated operand dequantizes into (0 for dense operands).
size_t emulated_bytes(const CanonOperand& o) {
  return o.q != nullptr ? align_up(size_t(o.rows) * size_t(o.kc) * 2) : 0;
}

// Dequantizes an MX / NVFP4 copy into `buf` (bf16, the copy's stored orientation) and returns
// the dense operand over it. MX columnwise copies are stored [kc, rows] (not transposed).
LtOperand emulated_operand(Context& ctx, const CanonOperand& o, uint16_t* buf,
                           const float** nvfp4_amax) {
  const QuantizedTensor& q = *o.q;
  const Tensor& data = copy_data(o);
  const Tensor& scale = copy_scale(o);
  LOWBIT_CHECK(data.defined() && scale.defined(), "gemm_cuda: the {} copy of {} is missing",
               o.usage == Usage::kRowwise ? "rowwise" : "columnwise", q.str());
  const int64_t sr = data.shape()[0], sc = data.shape()[1];
  gemm_kernels::DequantScales layout;
  bool k_contiguous = true;
  if (q.mode == ScalingMode::kMX1x32) {
    layout = o.usage == Usage::kRowwise ? gemm_kernels::DequantScales::kMxRowwise
                                        : gemm_kernels::DequantScales::kMxColumnwise;
    k_contiguous = o.usage == Usage::kRowwise;
  } else if (is_nvfp4_mode(q.mode)) {
    layout = gemm_kernels::DequantScales::kNvfp4;
    const Tensor& amax = copy_amax(o);
    LOWBIT_CHECK(amax.defined(), "gemm_cuda: NVFP4 {} has no global amax for its copy", q.str());
    *nvfp4_amax = amax.ptr<const float>();
  } else {
    throw_internal(__FILE__, __LINE__, fmt::format("gemm_cuda: emulated backend got {}", q.str()));
  }
  LOWBIT_CHECK(k_contiguous ? (sr == o.rows && sc == o.kc) : (sr == o.kc && sc == o.rows),
               "gemm_cuda: copy {} does not match rows {} kc {}", data.view().str(), o.rows, o.kc);
  gemm_kernels::dequant_to_bf16(data.ptr<const uint8_t>(), q.dtype, sr, sc,
                                scale.ptr<const uint8_t>(), layout, buf, ctx.stream());
  LtOperand l;
  l.ptr = buf;
  l.dtype = DType::kBF16;
  l.k_contiguous = k_contiguous;
  l.rows = o.rows;
  l.ld = sc;
  return l;
}

}  // namespace

void gemm_cuda(Context& ctx, const CanonGemm& g, const TensorView& out, const GemmOptions& opt) {
  LOWBIT_CHECK(ctx.on_gpu(), "gemm_cuda on a CPU context");
  if (g.backend == GemmBackend::kCublasLtBlockScaled) {
    throw UserError(
        "gemm: block-scaled MX / NVFP4 tensor-core GEMMs (cuBLASLt VEC32_UE8M0 / VEC16_UE4M3, "
        "sm_100+) are not yet supported on this GPU in this build; on Hopper MX and NVFP4 "
        "operands run through the emulated BF16 path");
  }
  LOWBIT_CHECK(out.dtype == DType::kBF16 || out.dtype == DType::kF32,
               "gemm_cuda: out must be bf16 or f32, got {}", out.str());
  LOWBIT_CHECK(out.ndim() == 2 && out.shape[0] == g.R && out.shape[1] == g.C,
               "gemm_cuda: out {} is not [{}, {}]", out.str(), g.R, g.C);
  LOWBIT_CHECK(out.strides[1] == 1 || g.C <= 1, "gemm_cuda: out {} needs a unit inner stride",
               out.str());
  LOWBIT_USER_CHECK(opt.beta == 0.0f || out.dtype == DType::kF32,
                    "gemm: beta = {} needs an f32 output (got {}); accumulate into an f32 buffer",
                    opt.beta, out.str());
  if (g.R == 0 || g.C == 0) return;
  const int64_t ldd = g.R == 1 ? std::max<int64_t>(g.C, 1) : out.strides[0];
  cudaStream_t stream = ctx.stream();

  if (g.Kc == 0) {
    // No products: out = beta · out (+ bias); only beta ∈ {0, 1} is meaningful here.
    LOWBIT_USER_CHECK(opt.beta == 0.0f || opt.beta == 1.0f,
                      "gemm: an empty contraction (K = 0) with beta = {} is not supported on the "
                      "GPU; use beta 0 or 1",
                      opt.beta);
    if (opt.beta == 0.0f) {
      const size_t esz = out.dtype == DType::kBF16 ? 2 : 4;
      LOWBIT_CUDA_CHECK(cudaMemset2DAsync(out.data, ldd * esz, 0, g.C * esz, g.R, stream));
    }
  } else {
    LtProblem p;
    p.m = g.C;
    p.n = g.R;
    p.k = g.Kc;
    p.d = out.data;
    p.d_dtype = out.dtype;
    p.ldd = ldd;

    // One workspace request per call: cuBLASLt's 32 MiB, then the bf16 buffers of the
    // emulated path, then alpha/beta for device pointer mode.
    const bool emulated = g.backend == GemmBackend::kEmulatedBf16;
    const size_t buf_a = emulated ? emulated_bytes(g.a) : 0;
    const size_t buf_b = emulated ? emulated_bytes(g.b) : 0;
    auto* ws = static_cast<char*>(ctx.workspace(kLtWorkspaceBytes + buf_a + buf_b + kAlign));
    p.workspace = ws;
    auto* dq_a = reinterpret_cast<uint16_t*>(ws + kLtWorkspaceBytes);
    auto* dq_b = reinterpret_cast<uint16_t*>(ws + kLtWorkspaceBytes + buf_a);
    auto* scalars = reinterpret_cast<float*>(ws + kLtWorkspaceBytes + buf_a + buf_b);
    p.alpha = &opt.alpha;
    p.beta = &opt.beta;

    switch (g.backend) {
      case GemmBackend::kCublasLtBf16:
        p.a = dense_operand(g.b, "B'");
        p.b = dense_operand(g.a, "A'");
        break;
      case GemmBackend::kCublasLtFp8:
      case GemmBackend::kCublasLtFp8Block: {
        const bool block = g.backend == GemmBackend::kCublasLtFp8Block;
        LOWBIT_CHECK(g.a.q != nullptr && g.b.q != nullptr,
                     "gemm_cuda: FP8 backends need two quantized operands");
        LOWBIT_USER_CHECK(!(g.a.q->dtype == DType::kE5M2 && g.b.q->dtype == DType::kE5M2),
                          "gemm: E5M2 × E5M2 is not supported by cuBLASLt (formats.md §4.2); "
                          "quantize one operand as E4M3 (the HYBRID format)");
        p.a = fp8_operand(g.b, block);
        p.b = fp8_operand(g.a, block);
        if (block) {
          LOWBIT_USER_CHECK(!(p.a.scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
                              p.b.scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F),
                            "gemm: two 128×128-block operands are not supported; quantize one "
                            "of them with 1×128 blocks");
        }
        p.fp8 = true;
        // Block-scaled modes reject fast accumulation.
        p.fast_accum = block ? false : g.fast_accum;
        break;
      }
      case GemmBackend::kEmulatedBf16: {
        const float* amax_a = nullptr;
        const float* amax_b = nullptr;
        p.b =
            g.a.q != nullptr ? emulated_operand(ctx, g.a, dq_a, &amax_a) : dense_operand(g.a, "A'");
        p.a =
            g.b.q != nullptr ? emulated_operand(ctx, g.b, dq_b, &amax_b) : dense_operand(g.b, "B'");
        if (amax_a != nullptr || amax_b != nullptr) {
          // NVFP4 global factors folded into alpha on the device (no host sync):
          // alpha' = RN(RN(RN(alpha·A_a)·A_b)·RN(1/(36·448²))).
          gemm_kernels::nvfp4_alpha(opt.alpha, opt.beta, amax_a, amax_b, scalars, stream);
          p.device_pointers = true;
          if (opt.beta == 0.0f) {
            // beta lives on the device: do not rely on C being skipped for a zero beta.
            const size_t esz = out.dtype == DType::kBF16 ? 2 : 4;
            LOWBIT_CUDA_CHECK(cudaMemset2DAsync(out.data, ldd * esz, 0, g.C * esz, g.R, stream));
          }
          p.alpha = scalars;
          p.beta = scalars + 1;
        }
        break;
      }
      default:
        throw_internal(__FILE__, __LINE__,
                       fmt::format("gemm_cuda: backend {} is not a CUDA backend",
                                   gemm_backend_name(g.backend)));
    }
    run_lt(ctx, p);
  }

  if (opt.bias != nullptr) {
    const TensorView& b = *opt.bias;
    LOWBIT_CHECK(b.dtype == DType::kBF16 || b.dtype == DType::kF32,
                 "gemm_cuda: bias must be bf16 or f32, got {}", b.str());
    LOWBIT_CHECK(b.numel() == g.C && b.is_contiguous(), "gemm_cuda: bias {} is not [{}]", b.str(),
                 g.C);
    gemm_kernels::add_bias(out.data, out.dtype == DType::kBF16, g.R, g.C, ldd, b.data,
                           b.dtype == DType::kBF16, stream);
  }
}

}  // namespace lowbit
