// Private interface of causal attention (include/lowbit/ops.h: attention_fwd / attention_bwd):
// the CPU twin (attention_ref.cpp) and the CUDA launchers (attention.cu). attention.cpp
// validates every argument and then calls one of them, so these functions trust their inputs.
#pragma once

#include <vector>

#include "lowbit/core.h"
#include "lowbit/quant.h"

namespace lowbit::attn {

// ---- CPU twin -----------------------------------------------------------------------------
// q [B, T, H, Dh], k and v [B, T, Hkv, Dh], each bf16 or f32 (strided, last dim contiguous);
// out [B, T, H, Dh] bf16 or f32; lse [B, H, T] f32 contiguous. Plain fp32 arithmetic.
void attention_fwd_ref(const TensorView& out, const TensorView& lse, const TensorView& q,
                       const TensorView& k, const TensorView& v, float scale);
// dq [B, T, H, Dh], dk and dv [B, T, Hkv, Dh] (bf16 or f32, overwritten) from dout
// [B, T, H, Dh] and the forward's q, k, v, out and lse [B, H, T] f32.
void attention_bwd_ref(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                       const TensorView& dout, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& out, const TensorView& lse,
                       float scale);

// ---- CUDA ---------------------------------------------------------------------------------
// The order in which a pass's blocks run, each starting from its heaviest causal tile:
// kHeadByHead runs each (batch, head)'s tiles together (the blocks running at once share that
// head's tiles in L2); kAllHeads runs the heaviest tile of every head first (no heavy block is
// left to run alone at the end); kAuto picks one per shape: for the query-tile passes (forward,
// dQ) `query_order` takes kAllHeads for long sequences whose K/V all fit in the L2, for the dK/dV
// pass `dkv_order` where the heaviest block is a large share of the work (long or grouped
// sequences, few heads); else kHeadByHead.
enum class BlockOrder { kHeadByHead, kAllHeads, kAuto };

// Tile shapes of the three kernel families. Each kernel gives every warp `mt` m-tiles of 16
// rows of the block's tile (queries in the forward and the dQ pass, keys in the dK/dV pass), so
// a block of `warps` warps owns 16·mt·warps rows and streams tiles of the other side.
struct CudaTiles {
  int fwd_warps = 4, fwd_bc = 64, fwd_mt = 1;  // fwd_bc: keys per streamed tile
  int dkv_warps = 4, dkv_br = 64, dkv_mt = 1;  // dkv_br: queries per streamed tile
  int dq_warps = 4, dq_bc = 64, dq_mt = 1;     // dq_bc: keys per streamed tile
  // The dK/dV pass (4 warps, 64×64 tiles) also writes the bf16 dSᵀ tiles, and dQ = dS·K is one
  // product over them (the dq_* fields are unused); else the dQ pass recomputes S and dP.
  bool dq_from_ds = false;
  // The forward on warpgroup MMAs (attn_fwd_wgmma_kernel); the fwd_* fields are unused.
  bool fwd_wgmma = false;
  // With fwd_wgmma: its tiles loaded by the TMA unit (attn_fwd_wgmma_tma_kernel) where the
  // tensors allow a tensor map.
  bool fwd_tma = false;
  // Dh 64: the dK/dV pass on warpgroup MMAs (attn_bwd_dkv_wgmma_kernel); dkv_* fields unused.
  bool dkv_wgmma = false;
  // With dkv_wgmma: its K, V, Q and dO tiles loaded by the TMA unit where the tensors allow a
  // tensor map.
  bool dkv_tma = false;
  // Dh 64: the dQ pass on warpgroup MMAs (attn_bwd_dq_wgmma_kernel); dq_* fields unused.
  bool dq_wgmma = false;
  // With dq_wgmma: its tiles loaded by the TMA unit (attn_bwd_dq_wgmma_tma_kernel) where the
  // tensors allow a tensor map.
  bool dq_tma = false;
  // The order of the blocks (heavy_first in attention.cu), for the query-tile passes (forward,
  // dQ) and for the dK/dV pass; kAuto picks one per shape (query_order, dkv_order).
  BlockOrder q_order = BlockOrder::kAuto;
  BlockOrder kv_order = BlockOrder::kAuto;
  // Bytes of dSᵀ tiles held at once (the batch runs in chunks that fit); 0: 512 MiB.
  int64_t ds_budget_bytes = 0;
  // Fewest dK/dV blocks a chunk may have, else the separate dQ pass runs: one wave of key tiles
  // leaves the SMs waiting on key tile 0 (at 256 blocks the stored-dS pass measured 23 % slower
  // than the separate one, at 900+ faster; H200, Dh 128).
  int64_t ds_min_chunk_blocks = 512;
};

// The tiles attention_fwd / attention_bwd use for head dim `dh` (64 or 128) on an sm_90a GPU
// (elsewhere the same tiles on the mma.sync kernels: the wgmma ones are sm_90a code).
CudaTiles default_tiles(int dh);
// Every combination the current GPU runs for `dh` (the wgmma ones on compute capability 9.0
// only), for the benchmark sweep and the tests (the default is among them).
std::vector<CudaTiles> candidate_fwd_tiles(int dh);
std::vector<CudaTiles> candidate_bwd_tiles(int dh);

// bf16 tensors on ctx's GPU, 16-byte aligned rows (checked by the caller). `tiles` overrides
// default_tiles() (must be one of the candidates).
void attention_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& lse,
                        const TensorView& q, const TensorView& k, const TensorView& v, float scale,
                        const CudaTiles* tiles = nullptr);
void attention_bwd_cuda(Context& ctx, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const TensorView& dout, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& lse, float scale, const CudaTiles* tiles = nullptr);
// attention_bwd_cuda whose first pass also quantizes out ([B·T, H·Dh], contiguous) under cfg
// (which passed fp8_delayed_fusable) into out_q. False, with nothing launched, when the fused
// pass does not apply (T % 32 != 0, out not contiguous, Dh not 64 or 128): the caller then runs
// the composition.
bool attention_bwd_quantize_out_cuda(Context& ctx, const TensorView& dq, const TensorView& dk,
                                     const TensorView& dv, const TensorView& dout,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& lse, float scale,
                                     const QuantConfig& cfg, QuantizedTensor& out_q);

}  // namespace lowbit::attn
