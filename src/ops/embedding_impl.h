// Private to the ops layer: the two implementations behind embedding_fwd / embedding_bwd
// (include/lowbit/ops.h). Arguments have been validated by the dispatcher (embedding.cpp).
#pragma once

#include "lowbit/core.h"

namespace lowbit::ops_detail {

// CPU twin (embedding_ref.cpp). out [N, D] bf16|f32, tokens [N] i32, table [V, D] bf16|f32.
// Throws UserError for a token outside [0, V) (before writing anything).
void embedding_fwd_cpu(const TensorView& out, const TensorView& tokens, const TensorView& table);
// dtable [V, D] f32 += Σ over the tokens equal to v of dout [N, D] bf16|f32 rows: per vocab row,
// the rows are summed in increasing token position into a zeroed fp32 row, which is then added
// to dtable once. The GPU follows the same order, so the two agree bit for bit.
void embedding_bwd_cpu(const TensorView& dtable, const TensorView& tokens, const TensorView& dout);

// CUDA (embedding.cu), bf16 only, on ctx.stream(). Out-of-range tokens give NaN rows in the
// forward and are skipped by the backward.
void embedding_fwd_cuda(Context& ctx, const TensorView& out, const TensorView& tokens,
                        const TensorView& table);
void embedding_bwd_cuda(Context& ctx, const TensorView& dtable, const TensorView& tokens,
                        const TensorView& dout);

}  // namespace lowbit::ops_detail
