// CUDA backends of gemm() (formats.md §3–§4): cuBLASLt BF16, per-tensor FP8, FP8 block scaling
// (VEC128_32F / BLK128x128_32F) and the emulated MX / NVFP4 path of Hopper (exact dequantization
// to bf16, then the BF16 GEMM). Descriptors, heuristic candidates and the algorithm chosen among
// them (by timing, see gemm_autotune()) are cached per problem in a plan.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/current_device.h"
#include "core/device_attr.h"
#include "gemm/fused_dequant_gemm.h"
#include "gemm/gemm_cuda_kernels.h"
#include "gemm/gemm_internal.h"
#include "gemm/k_partition.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/quant/layout.h"
#include "quant/quant_cuda.h"

namespace lowbit {
namespace {

// cuBLAS's recommended workspace on Hopper (cublasSetWorkspace: 32 MiB for sm_90, 4 MiB before);
// PyTorch gives cuBLASLt the same on sm_90 and later.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kAlign = 256;

// Algorithm selection by measurement (once per plan, see gemm_autotune()). Each candidate runs
// in bursts of ≈ 1 ms (launch gaps amortised), the GPU is loaded by one untimed burst of each
// before the timed rounds, and the rounds interleave the candidates so that clock drift
// affects them alike. On an H100 the ranking of cuBLASLt's candidates depends on the GPU's
// power state (boost clock just after idle vs power-limited under sustained load; the best
// ones lie within ≈ 5 % of each other at 4096³ and 8192³), and a selection that lasts
// 50–500 ms sees mostly the former.
constexpr int kMaxCandidates = 8;     // heuristic results asked for
constexpr int kTuneRounds = 7;        // timed bursts per candidate, one per round
constexpr double kTuneBurstMs = 1.0;  // target length of one burst
constexpr int kTuneMaxBurst = 64;     // calls in a burst at most
constexpr double kTuneMargin = 0.01;  // a lower-ranked candidate must be ≥ 1 % faster to win

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(GemmCudaLastCall::algo),
              "GemmCudaLastCall::algo holds one cublasLtMatmulAlgo_t");

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
    case DType::kE2M1: return CUDA_R_4F_E2M1;
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
  // The dequant scales: FP8 modes' fp32 scale_inv (null = 1); the block-scaled MX / NVFP4 modes'
  // one-byte scales in the Blackwell swizzle.
  const void* scale = nullptr;
  int32_t scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

struct LtProblem {
  LtOperand a, b;  // cuBLASLt's A and B (see the mapping in run_lt)
  int64_t m = 0, n = 0, k = 0;
  void* d = nullptr;
  const void* c = nullptr;  // the beta term's input (GemmOptions::c); null: C = D
  DType d_dtype = DType::kBF16;
  int64_t ldd = 0;
  bool fp8 = false;
  bool fast_accum = false;
  bool device_pointers = false;  // alpha/beta are device pointers (NVFP4 alpha fold)
  const float* alpha = nullptr;
  const float* beta = nullptr;
  void* workspace = nullptr;
  // GemmOptions::bias: [m] (one value per row of D = per column of out), null = none.
  const void* bias = nullptr;
  DType bias_dtype = DType::kBF16;
};

using PlanKey = std::array<int64_t, 23>;

const void* c_ptr(const LtProblem& p) { return p.c != nullptr ? p.c : p.d; }

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, cd = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;  // cuBLASLt's order; at least one
  bool bias_epilogue = false;  // CUBLASLT_EPILOGUE_BIAS is set: the GEMM adds the bias
  bool tuned = false;          // `chosen` was decided (by timing, or for lack of a choice)
  bool timed = false;          // ... by timing the candidates
  int chosen = 0;              // the candidate used while autotuning is on
};

std::mutex g_plan_mutex;
std::map<PlanKey, Plan>& plan_cache() {
  static auto* cache = new std::map<PlanKey, Plan>();  // never destroyed: handles outlive exit
  return *cache;
}

thread_local GemmCudaLastCall g_last_call;
std::atomic<int> g_fused_max_ctas{0};  // set_gemm_fused_max_ctas (tests): grid cap, 0 = SMs
std::atomic<int> g_fused_parts{0};     // set_gemm_fused_parts (tests): 0 = model, 1 = none, n
                                       // (k_partition.h valid_parts)

std::string describe(const LtProblem& p) {
  return fmt::format(
      "cuBLASLt m={} n={} k={} A {} {} ld={} B {} {} ld={} D {} ld={} scale modes {}/{} "
      "fast_accum={} bias {}",
      p.m, p.n, p.k, dtype_name(p.a.dtype), p.a.k_contiguous ? "T" : "N", p.a.ld,
      dtype_name(p.b.dtype), p.b.k_contiguous ? "N" : "T", p.b.ld, dtype_name(p.d_dtype), p.ldd,
      p.a.scale_mode, p.b.scale_mode, p.fast_accum ? 1 : 0,
      p.bias != nullptr ? dtype_name(p.bias_dtype) : "none");
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const T& v) {
  LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)));
}

// Whether CUBLASLT_EPILOGUE_BIAS is tried for this bias: cuBLASLt's bias vector has the type of
// D, except that FP8 kernels take a bf16 bias for bf16 and for f32 outputs (the FP8 type table of
// cublasLtMatmul; cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE). Where the heuristic still
// offers no algorithm with the epilogue (e.g. a block-scaled FP8 mode without it), the plan
// is built without it and gemm_cuda() adds the bias with its own kernel.
bool bias_epilogue_wanted(const LtProblem& p) {
  if (p.bias == nullptr) return false;
  return p.fp8 ? p.bias_dtype == DType::kBF16 : p.bias_dtype == p.d_dtype;
}

void destroy_plan(Plan& plan) {
  if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.cd != nullptr) cublasLtMatrixLayoutDestroy(plan.cd);
  if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
  plan = Plan();
}

// Descriptors and up to kMaxCandidates heuristic algorithms, with or without the bias
// epilogue; returns the heuristic's status (and an empty candidate list when it found none).
cublasStatus_t make_plan(cublasLtHandle_t lt, const LtProblem& p, bool bias_epilogue, Plan* out) {
  Plan plan;
  try {
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
    if (bias_epilogue) {
      // Bias per row of D (m = C rows): D = outᵀ, so one value per column of out, added to
      // every row of out. The heuristic reads the pointer's alignment; reset on every call.
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const int32_t bias_type = lt_type(p.bias_dtype);
      set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
      set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
      set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    }
    // Layouts (column-major): a K-contiguous operand is [k, rows], a transposed one [rows, k].
    auto layout = [](const LtOperand& o, int64_t k, cublasLtMatrixLayout_t* l) {
      const uint64_t r = o.k_contiguous ? k : o.rows, c = o.k_contiguous ? o.rows : k;
      LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, lt_type(o.dtype), r, c, o.ld));
    };
    layout(p.a, p.k, &plan.a);
    layout(p.b, p.k, &plan.b);
    // C and D share one layout (C = out, or GemmOptions::c laid out like out).
    LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.cd, lt_type(p.d_dtype), p.m, p.n, p.ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    std::vector<cublasLtMatmulHeuristicResult_t> found(kMaxCandidates);
    int count = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    try {
      const uint64_t ws = kLtWorkspaceBytes;
      set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
      // The real pointer alignments (capped at 256), as TE passes them (formats.md §4.3); the
      // plan key holds them, so a less aligned call gets its own plan.
      const uint32_t al_a = ptr_alignment(p.a.ptr), al_b = ptr_alignment(p.b.ptr),
                     al_d = ptr_alignment(p.d), al_c = ptr_alignment(c_ptr(p));
      set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a);
      set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b);
      set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c);
      set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d);
      if (p.d_dtype == DType::kBF16) {
        // A bf16 out is rounded once: split-K only with partial sums kept in fp32 (no in-place
        // or output-type reduction, which would round every partial sum to bf16).
        const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        set_pref(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes);
      }
      st = cublasLtMatmulAlgoGetHeuristic(lt, plan.desc, plan.a, plan.b, plan.cd, plan.cd, pref,
                                          kMaxCandidates, found.data(), &count);
    } catch (...) {
      cublasLtMatmulPreferenceDestroy(pref);
      throw;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS) {
      for (int i = 0; i < count; ++i) {
        if (found[i].state == CUBLAS_STATUS_SUCCESS &&
            found[i].workspaceSize <= kLtWorkspaceBytes) {
          plan.candidates.push_back(found[i]);
        }
      }
    }
    plan.bias_epilogue = bias_epilogue;
    if (st != CUBLAS_STATUS_SUCCESS || plan.candidates.empty()) {
      destroy_plan(plan);
      return st == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : st;
    }
  } catch (...) {
    destroy_plan(plan);
    throw;
  }
  *out = plan;
  return CUBLAS_STATUS_SUCCESS;
}

Plan build_plan(cublasLtHandle_t lt, const LtProblem& p) {
  Plan plan;
  if (bias_epilogue_wanted(p) && make_plan(lt, p, true, &plan) == CUBLAS_STATUS_SUCCESS) {
    return plan;
  }
  const cublasStatus_t st = make_plan(lt, p, false, &plan);
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw UserError(fmt::format(
        "gemm: cuBLASLt offers no algorithm for this problem on this GPU ({}; status {}). FP8 "
        "operands need the contracted dimension and leading dimensions padded to a multiple "
        "of 16 (E2M1: 32) and 16-byte aligned data; the block-scaled MX / NVFP4 modes need "
        "sm_100+",
        describe(p), static_cast<int>(st)));
  }
  return plan;
}

// CUDA events, destroyed with the object (also when an exception leaves the timing).
struct Events {
  std::vector<cudaEvent_t> ev;
  void create(size_t n) {
    ev.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      cudaEvent_t e = nullptr;
      LOWBIT_CUDA_CHECK(cudaEventCreate(&e));
      ev.push_back(e);
    }
  }
  ~Events() {
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
  }
};

// Waits for the stream before the scratch output is released (also on an exception).
struct SyncOnExit {
  cudaStream_t stream;
  ~SyncOnExit() { cudaStreamSynchronize(stream); }
};

// Times every candidate of `plan` on ctx's stream and returns the index of the fastest
// (cuBLASLt's order breaks near-ties: a later candidate must be kTuneMargin faster), or -1 when
// the stream is being captured into a CUDA graph (no synchronisation there; decide later).
//
// With a zero host beta the candidates write the caller's D itself: nothing reads its old
// values and the call writes it again after the selection. Otherwise (the beta term reads D,
// or beta lives on the device) they write a scratch D, allocated here and freed before
// returning; C is then the caller's out (read, never written). Writing in place keeps a
// plan's first call from holding a second output-sized buffer (a 1 GB logits chunk at 1b)
// next to the step's activations. The operands, scales, bias, alpha/beta and workspace are the
// call's own. A candidate whose cublasLtMatmul fails is skipped; if none runs, or no memory is
// left for the scratch output, the first heuristic choice is kept (0). `timed` tells whether
// the answer comes from timing. Synchronises the stream.
int time_candidates(Context& ctx, cublasLtHandle_t lt, const Plan& plan, const LtProblem& p,
                    bool* timed) {
  *timed = false;
  cudaStream_t stream = ctx.stream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LOWBIT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return -1;
  // The timing's events and scratch buffer belong to the context's device.
  const CurrentDevice device(ctx.device().index);

  const bool in_place = !p.device_pointers && *p.beta == 0.0f;
  Tensor scratch;
  void* d_out = p.d;
  if (!in_place) {
    const size_t esz = p.d_dtype == DType::kBF16 ? 2 : 4;
    const size_t bytes = (size_t(p.ldd) * size_t(p.n - 1) + size_t(p.m)) * esz;
    try {
      scratch = Tensor::empty(Shape{static_cast<int64_t>(bytes)}, DType::kU8, ctx.device(),
                              MemCategory::kWorkspace);
    } catch (const UserError&) {
      return 0;  // out of device memory: keep the heuristic's first choice
    }
    d_out = scratch.data();
  }
  const SyncOnExit sync{stream};  // destroyed before `scratch`
  auto launch = [&](int i) {
    return cublasLtMatmul(lt, plan.desc, p.alpha, p.a.ptr, plan.a, p.b.ptr, plan.b, p.beta,
                          c_ptr(p), plan.cd, d_out, plan.cd, &plan.candidates[i].algo, p.workspace,
                          kLtWorkspaceBytes, stream);
  };
  // One call of each candidate (module loading), then one more timed alone to size the bursts.
  const int n = static_cast<int>(plan.candidates.size());
  std::vector<char> ok(n, 1);
  auto run = [&](int i) {
    if (ok[i] && launch(i) != CUBLAS_STATUS_SUCCESS) {
      ok[i] = 0;
      (void)cudaGetLastError();  // a failed launch is this candidate's, not the caller's
    }
  };
  Events first;
  first.create(2 * size_t(n));
  for (int i = 0; i < n; ++i) {
    run(i);
    LOWBIT_CUDA_CHECK(cudaEventRecord(first.ev[2 * i], stream));
    run(i);
    LOWBIT_CUDA_CHECK(cudaEventRecord(first.ev[2 * i + 1], stream));
  }
  LOWBIT_CUDA_CHECK(cudaEventSynchronize(first.ev.back()));
  std::vector<int> live;
  std::vector<float> est;
  for (int i = 0; i < n; ++i) {
    if (!ok[i]) continue;
    live.push_back(i);
    float t = 0.0f;
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&t, first.ev[2 * i], first.ev[2 * i + 1]));
    est.push_back(t);
  }
  if (live.size() <= 1) return live.empty() ? 0 : live[0];
  std::nth_element(est.begin(), est.begin() + est.size() / 2, est.end());
  const double call_ms = std::max<double>(est[est.size() / 2], 1e-3);
  const int burst = static_cast<int>(
      std::clamp<double>(std::ceil(kTuneBurstMs / call_ms), 1.0, double(kTuneMaxBurst)));

  // A short wait lets the host queue ahead of the GPU (≈ 5 µs of host time per call, capped at
  // 1 ms); one untimed burst of each candidate loads the GPU; then `kTuneRounds` rounds of one
  // timed burst per candidate.
  const size_t segments = live.size() * kTuneRounds;
  gemm_kernels::gpu_spin(std::min<uint64_t>(100'000 + 5'000 * segments * burst, 1'000'000), stream);
  for (int i : live) {
    for (int c = 0; c < burst; ++c) run(i);
  }
  Events events;
  events.create(segments + 1);
  LOWBIT_CUDA_CHECK(cudaEventRecord(events.ev[0], stream));
  size_t e = 1;
  for (int r = 0; r < kTuneRounds; ++r) {
    for (int i : live) {
      for (int c = 0; c < burst; ++c) run(i);
      LOWBIT_CUDA_CHECK(cudaEventRecord(events.ev[e++], stream));
    }
  }
  LOWBIT_CUDA_CHECK(cudaEventSynchronize(events.ev.back()));

  int best = -1;
  float best_ms = 0.0f;
  for (size_t j = 0; j < live.size(); ++j) {
    const int i = live[j];
    if (!ok[i]) continue;
    std::vector<float> ms(kTuneRounds);
    for (int r = 0; r < kTuneRounds; ++r) {
      const size_t start = size_t(r) * live.size() + j;
      LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms[r], events.ev[start], events.ev[start + 1]));
    }
    std::nth_element(ms.begin(), ms.begin() + kTuneRounds / 2, ms.end());
    const float median = ms[kTuneRounds / 2] / burst;
    if (best < 0 || median < best_ms * (1.0 - kTuneMargin)) {
      best = i;
      best_ms = median;
    }
  }
  *timed = best >= 0;
  return best < 0 ? 0 : best;
}

// Runs D = alpha · op(A)·op(B) + beta · C (+ bias) with C = D through the plan cache; returns
// whether the bias was added by the GEMM's epilogue (else the caller adds it).
//
// The row-major → column-major mapping, done here once for every backend:
//   out[r, c] = Σ_j A'[r, j] · B'[c, j]          (r < R, c < C, j < Kc; out row-major, ld)
//   for (r) for (c) { acc = 0; for (j) acc += A'[r*Kc + j] * B'[c*Kc + j];
//                     out[r*ld + c] = alpha * acc + beta * out[r*ld + c] + bias[c]; }
// A row-major [R, C] buffer is the column-major [C, R] matrix D = outᵀ, and
//   D = B' · A'ᵀ  →  cuBLASLt A = B' (stored column-major [Kc, C], transa = T),
//                    cuBLASLt B = A' (stored column-major [Kc, R], transb = N),
//                    m = C, n = R, k = Kc, lda = ldb = Kc, ldd = ld (= C when contiguous);
//   bias[c] is per row of D: CUBLASLT_EPILOGUE_BIAS's vector of length m.
// Transposed dense operands flip the op instead of being copied (see LtOperand); the scale of
// each operand travels with it, so B'’s scale is cuBLASLt's A scale and A'’s is the B scale.
// For bf16 operands in their natural layout this gives fprop TN, dgrad NN (dX = dY·W) and
// wgrad NT (dW = dYᵀ·X): the forms PyTorch hands cuBLAS for the same products.
bool run_lt(Context& ctx, const LtProblem& p) {
  const bool bias_wanted = bias_epilogue_wanted(p);
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
                 bias_wanted ? 1 + static_cast<int64_t>(p.bias_dtype) : 0,  // epilogue
                 ptr_alignment(p.a.ptr),
                 ptr_alignment(p.b.ptr),
                 ptr_alignment(p.d),
                 bias_wanted ? ptr_alignment(p.bias) : 0,
                 ptr_alignment(c_ptr(p))};
  auto lt = reinterpret_cast<cublasLtHandle_t>(ctx.cublaslt());
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  auto& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build_plan(lt, p)).first;
  Plan& plan = it->second;
  // Per-call pointers on the shared descriptor: set and used under the lock.
  if (p.fp8) {
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.a.scale);
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.b.scale);
  }
  if (plan.bias_epilogue) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
  const bool autotune = gemm_autotune();
  if (autotune && !plan.tuned) {
    bool timed = false;
    const int best = plan.candidates.size() == 1 ? 0 : time_candidates(ctx, lt, plan, p, &timed);
    if (best >= 0) {
      plan.chosen = best;
      plan.tuned = true;
      plan.timed = timed;
    }
  }
  const int index = autotune && plan.tuned ? plan.chosen : 0;
  const cublasLtMatmulAlgo_t& algo = plan.candidates[index].algo;
  LOWBIT_CUBLAS_CHECK(cublasLtMatmul(lt, plan.desc, p.alpha, p.a.ptr, plan.a, p.b.ptr, plan.b,
                                     p.beta, c_ptr(p), plan.cd, p.d, plan.cd, &algo, p.workspace,
                                     kLtWorkspaceBytes, ctx.stream()));
  GemmCudaLastCall& last = g_last_call;
  last.valid = true;
  last.candidates = static_cast<int>(plan.candidates.size());
  last.algo_index = index;
  last.autotuned = autotune && plan.timed;
  last.bias_epilogue = plan.bias_epilogue;
  last.fused_dequant = false;
  std::memcpy(last.algo, &algo, sizeof(last.algo));
  return plan.bias_epilogue;
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

// Bytes of the swizzled scales of a block-scaled (sm_100+) operand: [pad128(rows),
// pad4(kc / block)] one-byte scales (0 for dense operands).
size_t swizzled_scale_bytes(const CanonOperand& o) {
  if (o.q == nullptr) return 0;
  const int64_t block = o.q->mode == ScalingMode::kMX1x32 ? 32 : 16;
  return align_up(size_t(pad128(o.rows)) * size_t(pad4((o.kc + block - 1) / block)));
}

// An MXFP8 or NVFP4 copy for cuBLASLt's block-scaled modes (sm_100+; not yet run on hardware):
// the payload as stored ([rows, kc], K-contiguous: rowwise, or the transposed columnwise copy),
// its compact scales swizzled into `swizzled` (swizzled_scale_bytes) on `stream`, and the
// copy's NVFP4 global amax for the alpha fold.
LtOperand block_scaled_operand(const CanonOperand& o, uint8_t* swizzled, const float** nvfp4_amax,
                               cudaStream_t stream) {
  const QuantizedTensor& q = *o.q;
  const Tensor& data = copy_data(o);
  const Tensor& scale = copy_scale(o);
  LOWBIT_CHECK(data.defined() && scale.defined(), "gemm_cuda: the {} copy of {} is missing",
               o.usage == Usage::kRowwise ? "rowwise" : "columnwise", q.str());
  const bool mx = q.mode == ScalingMode::kMX1x32;
  const bool fp8 = q.dtype == DType::kE4M3 || q.dtype == DType::kE5M2;
  LOWBIT_CHECK(mx ? fp8 : (is_nvfp4_mode(q.mode) && q.dtype == DType::kE2M1),
               "gemm_cuda: the block-scaled backend takes MXFP8 or NVFP4 copies, got {}", q.str());
  const int64_t block = mx ? 32 : 16;
  LOWBIT_CHECK(scale.shape()[0] == o.rows && scale.shape()[1] == (o.kc + block - 1) / block,
               "gemm_cuda: scales {} of {} are not [rows {}, ceil(kc {} / {})]", scale.view().str(),
               q.str(), o.rows, o.kc, block);
  quant_cuda::swizzle_block_scales(scale.ptr<const uint8_t>(), o.rows, scale.shape()[1], swizzled,
                                   stream);
  if (!mx) {
    const Tensor& amax = copy_amax(o);
    LOWBIT_CHECK(amax.defined(), "gemm_cuda: NVFP4 {} has no global amax for its copy", q.str());
    *nvfp4_amax = amax.ptr<const float>();
  }
  LtOperand l;
  l.ptr = data.data();
  l.dtype = q.dtype;
  l.k_contiguous = true;
  l.rows = o.rows;
  l.ld = o.kc;  // in elements (E2M1: two per byte)
  l.scale = swizzled;
  l.scale_mode =
      mx ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
  return l;
}

// Bytes of the bf16 buffer an emulated operand dequantizes into (0 for dense operands).
size_t emulated_bytes(const CanonOperand& o) {
  return o.q != nullptr ? align_up(size_t(o.rows) * size_t(o.kc) * 2) : 0;
}

// The dequantization of an MX / NVFP4 copy into `buf` (bf16, the copy's stored orientation,
// [rows, kc] for every copy), set up in *job for the caller to launch, and the dense operand
// over buf.
LtOperand emulated_operand(const CanonOperand& o, uint16_t* buf, const float** nvfp4_amax,
                           gemm_kernels::DequantJob* job) {
  const QuantizedTensor& q = *o.q;
  const Tensor& data = copy_data(o);
  const Tensor& scale = copy_scale(o);
  LOWBIT_CHECK(data.defined() && scale.defined(), "gemm_cuda: the {} copy of {} is missing",
               o.usage == Usage::kRowwise ? "rowwise" : "columnwise", q.str());
  const int64_t sr = data.shape()[0], sc = data.shape()[1];
  gemm_kernels::DequantScales layout;
  if (q.mode == ScalingMode::kMX1x32) {
    layout = gemm_kernels::DequantScales::kMxRowwise;
  } else if (is_nvfp4_mode(q.mode)) {
    layout = gemm_kernels::DequantScales::kNvfp4;
    const Tensor& amax = copy_amax(o);
    LOWBIT_CHECK(amax.defined(), "gemm_cuda: NVFP4 {} has no global amax for its copy", q.str());
    *nvfp4_amax = amax.ptr<const float>();
  } else {
    throw_internal(__FILE__, __LINE__, fmt::format("gemm_cuda: emulated backend got {}", q.str()));
  }
  LOWBIT_CHECK(sr == o.rows && sc == o.kc, "gemm_cuda: copy {} does not match rows {} kc {}",
               data.view().str(), o.rows, o.kc);
  *job = gemm_kernels::DequantJob{data.ptr<const uint8_t>(),  q.dtype, sr, sc,
                                  scale.ptr<const uint8_t>(), layout,  buf};
  LtOperand l;
  l.ptr = buf;
  l.dtype = DType::kBF16;
  l.k_contiguous = true;
  l.rows = o.rows;
  l.ld = sc;
  return l;
}

// The fused-dequantization kernel's operand kind for A' (and B'), or none when the pair does not
// qualify: two NVFP4 operands, or two MX operands with FP8 codes (every copy is K-contiguous).
std::optional<gemm_kernels::FusedKind> fused_kind(const CanonGemm& g) {
  if (g.a.q == nullptr || g.b.q == nullptr) return std::nullopt;
  const QuantizedTensor& a = *g.a.q;
  const QuantizedTensor& b = *g.b.q;
  if (is_nvfp4_mode(a.mode) && is_nvfp4_mode(b.mode)) return gemm_kernels::FusedKind::kNvfp4;
  const auto fp8 = [](DType t) { return t == DType::kE4M3 || t == DType::kE5M2; };
  if (a.mode == ScalingMode::kMX1x32 && b.mode == ScalingMode::kMX1x32 && fp8(a.dtype) &&
      fp8(b.dtype)) {
    return a.dtype == DType::kE4M3 ? gemm_kernels::FusedKind::kE4M3
                                   : gemm_kernels::FusedKind::kE5M2;
  }
  return std::nullopt;
}

// The emulated GEMM through fused_dequant_gemm.cu where it applies (see fused_kind and
// fused_gemm_shape_ok; out, c and the codes aligned for its stores and TMA): B' is dequantized
// into the permuted 16-bit copy (with the NVFP4 alpha' in the same launch), then one kernel
// converts A' in its mainloop and adds beta · c and the bias in its epilogue. False when it does
// not apply (then nothing ran and the caller takes the unfused path).
//
// A wgrad output wider than it is tall whose GEMM is cut along k (few tiles: 124m fc2's, 768 ×
// 3072 over 16384 tokens) runs as its transpose when that qualifies too (the rules below then
// judge the transposed problem; fprop / dgrad keep the measured rules as they are): the
// operands swap roles, so that the 16-bit copy of B' (read by every row tile) is of the narrower
// operand (25 MB instead of 100 MB at fc2), and the k-partition's reduction writes the result
// transposed (the kernel itself only writes partial tiles).
bool try_fused_emulated(Context& ctx, const CanonGemm& g_in, const TensorView& out,
                        const GemmOptions& opt, const void* c_data, int64_t ldd) {
  const FusedDequant mode = gemm_fused_dequant();
  if (mode == FusedDequant::kOff) return false;
  // The fused kernel is sm_90a code (wgmma): elsewhere (Blackwell falling back to the emulation)
  // the unfused path runs.
  if (!is_sm90(ctx.device().index)) return false;
  const auto qualifies = [](const CanonGemm& p) {
    const std::optional<gemm_kernels::FusedKind> k = fused_kind(p);
    return k && gemm_kernels::fused_gemm_shape_ok(*k, p.R, p.C, p.Kc);
  };
  if (!qualifies(g_in)) return false;
  // The k-partition of a problem: forced (tests, the bench's --fused-parts: 1 = none; n > 1 made
  // valid by valid_parts) or the model's.
  const auto parts_of = [](const CanonGemm& p) {
    const int forced = g_fused_parts.load();
    return forced == 1  ? 0
           : forced > 1 ? int(gemm_kernels::valid_parts(forced, p.R / gemm_kernels::kFusedTileR,
                                                        p.C / gemm_kernels::kFusedTileC, p.Kc / 64))
                        : gemm_kernels::fused_gemm_parts(p.R, p.C, p.Kc);
  };
  CanonGemm g = g_in;
  bool transposed = false;
  if (g_in.role == GemmRole::kWgrad && g_in.C > g_in.R) {
    CanonGemm s = g_in;
    std::swap(s.a, s.b);
    std::swap(s.R, s.C);
    if (qualifies(s) && parts_of(s) > 0) {
      g = s;
      transposed = true;
    }
  }
  const std::optional<gemm_kernels::FusedKind> kind = fused_kind(g);
  // The default takes NVFP4 pairs where the fused kernel was measured faster than
  // dequantization + cuBLASLt (bench/results/h100-2026-11-27/fused-gemm-final-0440/): outputs up
  // to 2048 wide (the bf16 copy of A' that the unfused path writes and re-reads costs more than
  // the fused kernel gives up to cuBLASLt), and up to 4096 wide when the contraction is long
  // (K ≥ 4096) and the tiles fill the GPU, so that there is no split-K (4096³, the 8b wgrads:
  // 0.90–1.00× BF16 against 0.86–0.94×; 8b proj fprop / dgrad 0.92 against 0.93, within the
  // noise). Wider outputs, or 3072 wide over K = 768 (124m fc1 fprop, fc2 dgrad: 0.83–0.84
  // against 0.88–0.91), stay unfused; 124m fc2 wgrad (3072 wide, k-partitioned: 0.45 against
  // 0.69) runs transposed instead, 768 wide: 0.89 (h100-2026-11-27/wgrad-parts-1010).
  //
  // MX pairs (bench/results/h100-2026-11-27/mx-fused-rule-0756/): fused where the output is at
  // most 2048 wide and the contraction longer than the output is wide (124m qkv / fc1 / head
  // dgrad, fc2 fprop: 0.80–0.90× BF16 against 0.64–0.69× unfused; 1b alike, +0.02–0.11), or as
  // long (124m proj fprop 0.74 against 0.69; its dgrad 44 against 46 µs in
  // h100-2026-11-27/wgrad-parts-1010/ncu_kernel_times.txt). Wider outputs over shorter
  // contractions run faster unfused (124m qkv / fc1 / head fprop 0.72–0.74 against 0.85–0.98).
  const bool nv = *kind == gemm_kernels::FusedKind::kNvfp4;
  const bool fills = (g.R / gemm_kernels::kFusedTileR) * (g.C / gemm_kernels::kFusedTileC) >=
                     gemm_kernels::fused_gemm_sm_count();
  const bool worth =
      nv ? g.C <= 2048 || (g.C <= 4096 && g.Kc >= 4096 && fills) : g.C <= 2048 && g.Kc >= g.C;
  if (mode == FusedDequant::kAuto && !worth) return false;
  const Tensor& a_data = copy_data(g.a);
  const Tensor& a_scale = copy_scale(g.a);
  const Tensor& b_data = copy_data(g.b);
  const Tensor& b_scale = copy_scale(g.b);
  if (!a_data.defined() || !a_scale.defined() || !b_data.defined() || !b_scale.defined()) {
    return false;  // the general path reports the missing copy
  }
  const auto aligned = [](const void* p, uintptr_t n) {
    return reinterpret_cast<uintptr_t>(p) % n == 0;
  };
  if (ldd % 8 != 0 || !aligned(out.data, 16) || (c_data != nullptr && !aligned(c_data, 16)) ||
      !aligned(a_data.data(), 16) || !aligned(a_scale.data(), 4) || !aligned(b_data.data(), 16) ||
      !aligned(b_scale.data(), 4)) {
    return false;
  }
  const int64_t br = b_data.shape()[0], bc = b_data.shape()[1];
  LOWBIT_CHECK(br == g.C && bc == g.Kc, "gemm_cuda: copy {} does not match rows {} kc {}",
               b_data.view().str(), g.C, g.Kc);
  // A' is K-contiguous (fused_kind) with the compact scale layout the kernel reads: one scale per
  // 16 (NVFP4) or 32 (MX) elements of a row.
  LOWBIT_CHECK(a_data.shape()[0] == g.R && a_data.shape()[1] == g.Kc,
               "gemm_cuda: copy {} does not match rows {} kc {}", a_data.view().str(), g.R, g.Kc);
  LOWBIT_CHECK(a_scale.numel() == g.R * (g.Kc / (nv ? 16 : 32)),
               "gemm_cuda: scales {} of {} are not [{}, {}]", a_scale.view().str(),
               a_data.view().str(), g.R, g.Kc / (nv ? 16 : 32));

  cudaStream_t stream = ctx.stream();
  const int parts = parts_of(g);
  // Workspace: B' permuted (16-bit), the k-partition's partial tiles (f32), alpha'/beta.
  const size_t buf_bytes = align_up(size_t(g.C) * size_t(g.Kc) * 2);
  const size_t part_bytes =
      align_up(size_t(gemm_kernels::fused_gemm_partial_tiles(g.R, g.C, parts)) *
               gemm_kernels::kFusedTileR * gemm_kernels::kFusedTileC * 4);
  auto* ws = static_cast<char*>(ctx.workspace(buf_bytes + part_bytes + kAlign));
  auto* b_perm = reinterpret_cast<uint16_t*>(ws);
  auto* partial = reinterpret_cast<float*>(ws + buf_bytes);
  auto* scalars = reinterpret_cast<float*>(ws + buf_bytes + part_bytes);

  gemm_kernels::DequantJob job;
  job.codes = b_data.ptr<const uint8_t>();
  job.t = g.b.q->dtype;
  job.rows = g.C;
  job.cols = g.Kc;
  job.scales = b_scale.ptr<const uint8_t>();
  job.layout = nv ? gemm_kernels::DequantScales::kNvfp4 : gemm_kernels::DequantScales::kMxRowwise;
  job.out = b_perm;
  gemm_kernels::Nvfp4Alpha alpha;
  if (nv) {
    // alpha' rounds RN(RN(alpha · amax_a) · amax_b): the caller's A and B in that order on every
    // path (the transposed one included), so that they all give the same bits.
    const Tensor& amax_a = copy_amax(g_in.a);
    const Tensor& amax_b = copy_amax(g_in.b);
    LOWBIT_CHECK(amax_a.defined() && amax_b.defined(),
                 "gemm_cuda: an NVFP4 operand has no global amax for its copy");
    alpha = gemm_kernels::Nvfp4Alpha{opt.alpha, opt.beta, amax_a.ptr<const float>(),
                                     amax_b.ptr<const float>(), scalars};
  }
  // fused_gemm must follow this launch directly (it may read A' before it waits for it).
  gemm_kernels::dequant_b_permuted(job, *kind, nv ? &alpha : nullptr, stream);

  gemm_kernels::FusedGemmArgs fa;
  fa.kind = *kind;
  fa.a_codes = a_data.ptr<const uint8_t>();
  fa.a_scales = a_scale.ptr<const uint8_t>();
  fa.b_perm = b_perm;
  fa.R = g.R;
  fa.C = g.C;
  fa.K = g.Kc;
  fa.alpha_dev = nv ? scalars : nullptr;
  fa.alpha = opt.alpha;
  fa.beta = opt.beta;
  fa.c = c_data;
  fa.out = out.data;
  fa.out_f32 = out.dtype == DType::kF32;
  fa.ldd = ldd;
  if (opt.bias != nullptr) {
    fa.bias = opt.bias->data;
    fa.bias_bf16 = opt.bias->dtype == DType::kBF16;
  }
  fa.max_ctas = g_fused_max_ctas.load();
  fa.parts = parts;
  fa.partial = parts > 0 ? partial : nullptr;
  fa.out_transposed = transposed;
  const gemm_kernels::FusedGemmRun run = gemm_kernels::fused_gemm(fa, stream);

  GemmCudaLastCall& last = g_last_call;
  last = GemmCudaLastCall{};
  last.valid = true;
  last.candidates = 1;
  last.bias_epilogue = opt.bias != nullptr;
  last.fused_dequant = true;
  last.fused_transposed = transposed;
  last.fused_a_first = run.a_first;
  return true;
}

}  // namespace

void set_gemm_fused_max_ctas(int n) { g_fused_max_ctas.store(n); }
void set_gemm_fused_parts(int n) { g_fused_parts.store(n); }

void gemm_cuda(Context& ctx, const CanonGemm& g, const TensorView& out, const GemmOptions& opt) {
  LOWBIT_CHECK(ctx.on_gpu(), "gemm_cuda on a CPU context");
  LOWBIT_CHECK(out.dtype == DType::kBF16 || out.dtype == DType::kF32,
               "gemm_cuda: out must be bf16 or f32, got {}", out.str());
  LOWBIT_CHECK(out.ndim() == 2 && out.shape[0] == g.R && out.shape[1] == g.C,
               "gemm_cuda: out {} is not [{}, {}]", out.str(), g.R, g.C);
  LOWBIT_CHECK(out.strides[1] == 1 || g.C <= 1, "gemm_cuda: out {} needs a unit inner stride",
               out.str());
  LOWBIT_USER_CHECK(opt.beta == 0.0f || out.dtype == DType::kF32 || opt.c != nullptr,
                    "gemm: beta = {} needs an f32 output (got {}) or a separate c; accumulate "
                    "into an f32 buffer",
                    opt.beta, out.str());
  // The beta term reads c (when given, with out's layout) instead of out; unused for beta = 0.
  const void* c_data = opt.c != nullptr && opt.beta != 0.0f ? opt.c->data : nullptr;
  LOWBIT_CHECK(c_data == nullptr || (opt.c->dtype == out.dtype && opt.c->shape == out.shape &&
                                     opt.c->strides == out.strides),
               "gemm_cuda: c {} is not laid out like out {}", opt.c->str(), out.str());
  if (opt.bias != nullptr) {
    const TensorView& b = *opt.bias;
    LOWBIT_CHECK(b.dtype == DType::kBF16 || b.dtype == DType::kF32,
                 "gemm_cuda: bias must be bf16 or f32, got {}", b.str());
    LOWBIT_CHECK(b.numel() == g.C && b.is_contiguous(), "gemm_cuda: bias {} is not [{}]", b.str(),
                 g.C);
  }
  if (g.R == 0 || g.C == 0) return;
  const int64_t ldd = g.R == 1 ? std::max<int64_t>(g.C, 1) : out.strides[0];
  cudaStream_t stream = ctx.stream();
  bool bias_done = false;  // added by cuBLASLt's epilogue

  if (g.Kc == 0) {
    // No products: out = beta · out (+ bias); only beta ∈ {0, 1} is meaningful here.
    LOWBIT_USER_CHECK(opt.beta == 0.0f || opt.beta == 1.0f,
                      "gemm: an empty contraction (K = 0) with beta = {} is not supported on the "
                      "GPU; use beta 0 or 1",
                      opt.beta);
    const size_t esz = out.dtype == DType::kBF16 ? 2 : 4;
    if (opt.beta == 0.0f) {
      LOWBIT_CUDA_CHECK(cudaMemset2DAsync(out.data, ldd * esz, 0, g.C * esz, g.R, stream));
    } else if (c_data != nullptr && c_data != out.data) {
      LOWBIT_CUDA_CHECK(cudaMemcpy2DAsync(out.data, ldd * esz, c_data, ldd * esz, g.C * esz, g.R,
                                          cudaMemcpyDeviceToDevice, stream));
    }
  } else if (g.backend == GemmBackend::kEmulatedBf16 &&
             try_fused_emulated(ctx, g, out, opt, c_data, ldd)) {
    bias_done = true;  // in the fused kernel's epilogue
  } else {
    LtProblem p;
    p.m = g.C;
    p.n = g.R;
    p.k = g.Kc;
    p.d = out.data;
    p.c = c_data;
    p.d_dtype = out.dtype;
    p.ldd = ldd;

    // One workspace request per call: cuBLASLt's 32 MiB, then the bf16 buffers of the
    // emulated path, then alpha/beta for device pointer mode.
    const bool emulated = g.backend == GemmBackend::kEmulatedBf16;
    const bool block_scaled = g.backend == GemmBackend::kCublasLtBlockScaled;
    const size_t buf_a = emulated       ? emulated_bytes(g.a)
                         : block_scaled ? swizzled_scale_bytes(g.a)
                                        : 0;
    const size_t buf_b = emulated       ? emulated_bytes(g.b)
                         : block_scaled ? swizzled_scale_bytes(g.b)
                                        : 0;
    auto* ws = static_cast<char*>(ctx.workspace(kLtWorkspaceBytes + buf_a + buf_b + kAlign));
    p.workspace = ws;
    auto* dq_a = reinterpret_cast<uint16_t*>(ws + kLtWorkspaceBytes);
    auto* dq_b = reinterpret_cast<uint16_t*>(ws + kLtWorkspaceBytes + buf_a);
    auto* scalars = reinterpret_cast<float*>(ws + kLtWorkspaceBytes + buf_a + buf_b);
    p.alpha = &opt.alpha;
    p.beta = &opt.beta;
    if (opt.bias != nullptr) {
      p.bias = opt.bias->data;
      p.bias_dtype = opt.bias->dtype;
    }

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
      case GemmBackend::kCublasLtBlockScaled: {
        // sm_100+ (not yet run on hardware): the MXFP8 / NVFP4 payloads go to cuBLASLt as they
        // are, with their scales swizzled into the workspace (formats.md §4.6); NVFP4's global
        // factors are folded into alpha on the device as on the emulated path.
        LOWBIT_CHECK(g.a.q != nullptr && g.b.q != nullptr,
                     "gemm_cuda: the block-scaled backend needs two quantized operands");
        LOWBIT_USER_CHECK(!(g.a.q->dtype == DType::kE5M2 && g.b.q->dtype == DType::kE5M2),
                          "gemm: E5M2 × E5M2 is not supported by cuBLASLt (formats.md §4.2); "
                          "quantize one operand as E4M3 (the HYBRID format)");
        const float* amax_a = nullptr;
        const float* amax_b = nullptr;
        p.b = block_scaled_operand(g.a, reinterpret_cast<uint8_t*>(dq_a), &amax_a, stream);
        p.a = block_scaled_operand(g.b, reinterpret_cast<uint8_t*>(dq_b), &amax_b, stream);
        p.fp8 = true;  // the scale-mode attributes
        p.fast_accum = false;
        if (amax_a != nullptr || amax_b != nullptr) {
          const gemm_kernels::Nvfp4Alpha alpha{opt.alpha, opt.beta, amax_a, amax_b, scalars};
          gemm_kernels::dequant_pair_to_bf16(gemm_kernels::DequantJob{}, gemm_kernels::DequantJob{},
                                             &alpha, stream);  // alpha' only
          p.device_pointers = true;
          p.alpha = scalars;
          p.beta = scalars + 1;
        }
        break;
      }
      case GemmBackend::kEmulatedBf16: {
        const float* amax_a = nullptr;
        const float* amax_b = nullptr;
        gemm_kernels::DequantJob job_a, job_b;
        p.b = g.a.q != nullptr ? emulated_operand(g.a, dq_a, &amax_a, &job_a)
                               : dense_operand(g.a, "A'");
        p.a = g.b.q != nullptr ? emulated_operand(g.b, dq_b, &amax_b, &job_b)
                               : dense_operand(g.b, "B'");
        // NVFP4 global factors folded into alpha on the device (no host sync):
        // alpha' = RN(RN(RN(alpha·A_a)·A_b)·RN(1/(36·448²))), in the dequantization's launch.
        const bool fold = amax_a != nullptr || amax_b != nullptr;
        const gemm_kernels::Nvfp4Alpha alpha{opt.alpha, opt.beta, amax_a, amax_b, scalars};
        gemm_kernels::dequant_pair_to_bf16(job_a, job_b, fold ? &alpha : nullptr, stream);
        if (fold) {
          // beta lives on the device too (cuBLASLt takes both scalars from one pointer mode;
          // an alpha vector with a host beta is not offered for bf16 operands). A zero beta
          // still skips C on the device, as with a host beta: the GPU tests hand every backend
          // an out full of NaN for beta = 0 (test_gemm_gpu.cpp, check_role), and a probe ran all
          // eight heuristic candidates of a bf16 m2304 n16384 k768 GEMM on an H100 with NaN in C
          // and a device beta of 0 (none read C). The output memset this used to issue cost a
          // full write of out (124m qkv fprop 0.1334 → 0.1117 ms, consecutive calls on an H100).
          // Not documented by cuBLASLt: if a future version reads C here, check_role's NaN garbage
          // turns the NVFP4 rows NaN.
          p.device_pointers = true;
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
    bias_done = run_lt(ctx, p);
  }

  if (opt.bias != nullptr && !bias_done) {
    const TensorView& b = *opt.bias;
    gemm_kernels::add_bias(out.data, out.dtype == DType::kBF16, g.R, g.C, ldd, b.data,
                           b.dtype == DType::kBF16, stream);
  }
}

GemmCudaLastCall gemm_cuda_last_call() { return g_last_call; }

}  // namespace lowbit
