// Private to the ops layer: the two implementations behind embedding_fwd / embedding_bwd
// (include/lowbit/ops.h). Arguments have been validated by the dispatcher (embedding.cpp).
#pragma once

#include "lowbit/core.h"

namespace lowbit::ops_detail {

// CPU twin (embedding_ref.cpp). out [N, D] bf16|f32, tokens [N] i32, table [V, D] bf16|f32.
// Throws UserError for a token outside [0, V) (before writing anything).
void embedding_fwd_cpu(const TensorView& out, const TensorView& tokens, const TensorView& table);
// The backward's summation order, shared by both twins so that they agree bit for bit:
// positions are sorted by token (stably, so each token's positions stay increasing) and the
// sorted list is cut into chunks of kEmbeddingBwdChunk entries. A token's run of positions is
// split by the chunk boundaries into pieces; each piece is summed from a zeroed fp32 row in
// position order, the pieces are added in order (total = piece0, total += piece1, ...), and the
// total is added to the dtable row once. (Chunks bound the serial work of a GPU block when one
// token occurs many times.)
inline constexpr int64_t kEmbeddingBwdChunk = 16;
// dtable [V, D] f32 += Σ over the positions n with tokens[n] = v of dout [N, D] bf16|f32 rows.
// A sort plan, when given, must be the one these tokens give (UserError otherwise: it would come
// from other tokens).
void embedding_bwd_cpu(const TensorView& dtable, const TensorView& tokens, const TensorView& dout,
                       const TensorView& sort_plan = TensorView());

// The sort plan [2, N] i32 (embedding_fwd's optional output, embedding_bwd's optional input):
// row 0 the tokens' keys sorted stably — the token, or V for one outside [0, V) (sorted last,
// skipped) — and row 1 their positions. The CPU twin writes and checks the same contents.
void embedding_sort_plan_cpu(const TensorView& plan, const TensorView& tokens, int64_t vocab);

// CUDA (embedding.cu), bf16 only, on ctx.stream() (the forward's sort: on its side stream,
// joined before returning). Out-of-range tokens give NaN rows in the forward and are skipped by
// the backward.
// How the (token, position) pairs are sorted on the GPU. Both sorts are stable, so they give
// the same sequence and the same output bits; kAuto takes the merge-rank sort up to
// kEmbeddingBwdMergeRankMaxRows tokens and the radix sort beyond. Tests force one or the other.
enum class EmbeddingSort { kAuto, kMergeRank, kRadix };
// With a sort plan, the forward also sorts, on the context's side stream beside the gather
// (joined before it returns).
void embedding_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& tokens,
                        const TensorView& table, const TensorView& sort_plan = TensorView(),
                        EmbeddingSort sort = EmbeddingSort::kAuto);
// The most tokens the merge-rank sort takes: its rank kernel holds all N keys in one block's
// shared memory (4·N bytes, 128 KiB here). Below it the merge-rank sort is faster (a few µs,
// on many SMs); the radix sort's passes run on only a few blocks at these sizes.
inline constexpr int64_t kEmbeddingBwdMergeRankMaxRows = 32768;
// With a sort plan (from embedding_fwd with the same tokens) the backward does not sort.
void embedding_bwd_cuda(Context& ctx, const TensorView& dtable, const TensorView& tokens,
                        const TensorView& dout, EmbeddingSort sort = EmbeddingSort::kAuto,
                        const TensorView& sort_plan = TensorView());

}  // namespace lowbit::ops_detail
