// Launchers of the quantization kernels (src/quant/*.cu). Raw device pointers, row-major
// contiguous sources; `T` is uint16_t (bf16 bits) or float. Every launcher is asynchronous on
// `stream`. Output scale tensors must be zeroed by the caller where the layout has padding.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lowbit/quant.h"

namespace lowbit {
struct QuantStreams;
// CUDA path of quantize(): `x` is a CUDA tensor and `cfg` has passed check_quant_config.
void quantize_cuda(Context& ctx, const TensorView& x, const QuantConfig& cfg,
                   const QuantStreams& streams, QuantizedTensor& out);
}  // namespace lowbit

namespace lowbit::quant_cuda {

// Kernel generation, chosen once per process for A/B runs on hardware (bench/NOTES-quant.md):
// LOWBIT_QUANT_KERNELS=v8 selects the v8 kernels (FP8 block scaling, the NVFP4 amax and quantize
// passes, MX), =v9 the v9 ones (v10's MXFP8 kernel off), =v10 the v10 ones (v11's NVFP4 quantize
// pass off: NVFP4 on the v9 kernels, v10's own NVFP4 pass having been removed), =v11 the v11 ones
// (FP8 current scaling by an amax kernel, a scale kernel and the cast instead of v12's amax_scale
// and the cast; the NVFP4 amax pass folding into zeroed outputs instead of the reduction words),
// =v12 the v12 ones (NVFP4 16×16 blocks on the generic tile kernel instead of v13's full-tile
// kernel), =v13 the v13 ones (FP8 1×128 blocks by v9's kernel instead of v14's lean variant), =v14
// the v14 ones (MXFP8 blocks walking M fastest instead of v15's K fastest), =v15 or unset the
// current ones; any other value is a UserError listing these. Results are byte-identical either
// way.
int quant_kernels_version();  // 8 .. 15 (15 when unset)
bool legacy_kernels();        // quant_kernels_version() == 8

// *amax_out = max(*amax_out, max |x|) over n elements (NaN skipped).
template <typename T>
void amax(const T* x, int64_t n, float* amax_out, cudaStream_t stream);

// An f32 source read as RN_bf16(x) (defined in cuda_common.cuh): amax and fp8_cast_transpose
// take it; the other quantizers read a bf16 copy made by round_to_bf16.
struct Bf16RoundedF32;
// y [n] bf16 = RN_bf16(x [n] f32).
void round_to_bf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream);

// FP8 current scaling's first pass over x [M, K] (M, K > 0): *amax_out = max |x| (NaN skipped),
// *scale = compute_scale_from_amax(amax, fmax, pow2, eps), *scale_inv = RN(1/scale), all
// written by the kernel's last block (no zeroing needed). `acc` [2]: Context::reduction_words()
// (zero on entry, left zero). Reads x in the reverse of fp8_cast_transpose's tile order, so the
// cast that follows finds its first tiles in the L2.
template <typename T>
void amax_scale(const T* x, int64_t M, int64_t K, float fmax, bool pow2, float eps, uint32_t* acc,
                float* amax_out, float* scale, float* scale_inv, cudaStream_t stream);

// FP8 current scaling: scale = compute_scale_from_amax(*amax), scale_inv = RN(1/scale).
void current_scale(const float* amax, float fmax, bool pow2, float eps, float* scale,
                   float* scale_inv, cudaStream_t stream);

// FP8 per-tensor: q [M, K] and/or qt [K, M] = cvt_sat(x · *scale); writes *scale_inv and folds
// max |x| into *amax_out and *amax_fold (e.g. a delayed-scaling history slot; each may be null).
template <typename T>
void fp8_cast_transpose(const T* x, int64_t M, int64_t K, const float* scale, bool e5m2, uint8_t* q,
                        uint8_t* qt, float* scale_inv, float* amax_out, float* amax_fold,
                        cudaStream_t stream);

// FP8 block scaling. two_d = false: 1×128 blocks, rowwise scales in VEC128 layout
// [ceil(K/128), pad4(M)], columnwise (qt [K, M], blocks along M) [ceil(M/128), pad4(K)].
// two_d = true: 128×128 tiles, BLK128 layouts [ceil(M/128), pad4(ceil(K/128))] and the
// transposed grid [ceil(K/128), pad4(ceil(M/128))].
template <typename T>
void fp8_block(const T* x, int64_t M, int64_t K, bool two_d, bool e5m2, float fmax, bool pow2,
               float eps, float value_for_inf, uint8_t* q, float* q_scale, uint8_t* qt,
               float* qt_scale, float* amax_out, cudaStream_t stream);

// FP8 delayed scaling on the device: *row0_slot = fmaxf(*row0_slot, amax), and the history roll
// + scale update of every slot (delayed_update_slot, one thread per slot). A null stream is the
// default stream.
void delayed_record_amax(float* row0_slot, float amax, cudaStream_t stream);
void delayed_update(float* history, int64_t len, int64_t n_slots, bool algo_max, float scaled_max,
                    float* scale, float* scale_inv, cudaStream_t stream);
void device_synchronize();

// NVFP4 (E2M1 + UE4M3 per 16 + fp32 global amax): rowwise q [M, K/2 bytes] with scales
// [M, K/16]; columnwise qt [K, M/2 bytes] (transposed, RHT'd when `rht`) with scales [K, M/16].
// two_d: one scale per 16×16 tile, columnwise = exact transpose. Unless `amax_ready`, amax_row /
// amax_col receive the global amaxes from an amax pass over x (no zeroing needed: the launcher
// zeroes them where its kernel folds into them); with `amax_ready` they already hold them
// (computed by the producer of x, e.g. in its epilogue) and the source is read once. `acc`:
// Context::reduction_words() or null (then the amax pass costs two small memsets more).
template <typename T>
void nvfp4(const T* x, int64_t M, int64_t K, bool rowwise, bool columnwise, bool rht, bool sr,
           bool two_d, RngKey row_key, RngKey col_key, uint8_t* q, uint8_t* q_scale, uint8_t* qt,
           uint8_t* qt_scale, float* amax_row, float* amax_col, bool amax_ready, uint32_t* acc,
           cudaStream_t stream);

// The Blackwell block-scale swizzle (block_scale_swizzle.cu): compact one-byte scales [R, C] →
// out [pad128(R), pad4(C)] (every byte written, padding zero).
void swizzle_block_scales(const uint8_t* compact, int64_t R, int64_t C, uint8_t* out,
                          cudaStream_t stream);

// MX (E8M0 per 32): rowwise q [M, K] with scales [M, K/32]; columnwise qc [K, M] (transposed:
// the rowwise blocks of x^T) with scales [K, M/32]. E2M1 payloads are packed two per byte.
template <typename T>
void mx(const T* x, int64_t M, int64_t K, DType t, MxScaleRounding rounding, bool rowwise,
        bool columnwise, bool sr, RngKey row_key, RngKey col_key, uint8_t* q, uint8_t* q_scale,
        uint8_t* qc, uint8_t* qc_scale, cudaStream_t stream);

}  // namespace lowbit::quant_cuda
