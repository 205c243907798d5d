// Private to the ops layer: the two implementations behind add / convert
// (include/lowbit/ops.h). Arguments have been validated by the dispatcher (elementwise.cpp):
// contiguous, same element count, dtypes bf16 or f32.
#pragma once

#include "lowbit/core.h"

namespace lowbit::ops_detail {

// CPU twin (elementwise_ref.cpp). out = a + b (one fp32 add, rounded once to bf16 for bf16
// tensors); out may be a or b. dst = src converted (f32 → bf16 RN, bf16 → f32 exact, same dtype
// copied). The GPU computes the same single operations, so the two agree bit for bit.
void add_cpu(const TensorView& out, const TensorView& a, const TensorView& b);
void convert_cpu(const TensorView& dst, const TensorView& src);
// CUDA (elementwise.cu), on ctx.stream().
void add_cuda(Context& ctx, const TensorView& out, const TensorView& a, const TensorView& b);
void convert_cuda(Context& ctx, const TensorView& dst, const TensorView& src);

}  // namespace lowbit::ops_detail
