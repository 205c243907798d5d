// Argument checks shared by the op dispatchers (src/ops/<op>.cpp): each throws a UserError that
// names the op, the argument, what was expected and what was given. Also row loads/stores
// between bf16/f32 tensors and fp32 buffers for the CPU twins.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "lowbit/core.h"
#include "lowbit/formats.h"

namespace lowbit::ops_detail {

// Every tensor lives on ctx's device and has storage when it has elements.
inline void check_devices(const char* op, const Context& ctx,
                          std::initializer_list<std::pair<const char*, const TensorView*>> ts) {
  for (const auto& [name, t] : ts) {
    LOWBIT_USER_CHECK(t->device == ctx.device(),
                      "{}: {} is on {} but the context runs on {}; move it to {}", op, name,
                      t->device.str(), ctx.device().str(), ctx.device().str());
    LOWBIT_USER_CHECK(t->data != nullptr || t->numel() == 0, "{}: {} ({}) has no storage", op, name,
                      t->str());
  }
}

inline void check_rank(const char* op, const char* name, const char* dims, const TensorView& t,
                       int ndim) {
  LOWBIT_USER_CHECK(t.ndim() == ndim, "{}: {} {} must be {}-D, got {}", op, name, dims, ndim,
                    t.str());
}

// dtype: `t` must be `want`; on the CPU f32 is also accepted where `cpu_f32` (the CPU twin
// computes in fp32 either way; f32 tensors serve the finite-difference checks).
inline void check_float(const char* op, const char* name, const TensorView& t, DType want,
                        bool cpu_f32 = true) {
  const bool ok = t.dtype == want || (cpu_f32 && t.device.is_cpu() && t.dtype == DType::kF32);
  LOWBIT_USER_CHECK(ok, "{}: {} must be {}{}, got {}", op, name, dtype_name(want),
                    cpu_f32 && want != DType::kF32 ? " (or f32 on the CPU)" : "", t.str());
}

inline void check_dtype(const char* op, const char* name, const TensorView& t, DType want) {
  LOWBIT_USER_CHECK(t.dtype == want, "{}: {} must be {}, got {}", op, name, dtype_name(want),
                    t.str());
}

inline void check_contiguous(const char* op, const char* name, const TensorView& t) {
  LOWBIT_USER_CHECK(t.is_contiguous(), "{}: {} must be contiguous, got {} with strides {}", op,
                    name, t.str(), t.strides.str());
}

inline void check_same_shape(const char* op, const char* name, const TensorView& t,
                             const char* ref_name, const TensorView& ref) {
  LOWBIT_USER_CHECK(t.shape == ref.shape, "{}: {} has shape {} but {} has {}; they must match", op,
                    name, t.shape.str(), ref_name, ref.shape.str());
}

// The layout the attention kernels read a 4-D [B, T, heads, Dh] view in: last dim contiguous,
// non-negative strides and, on the GPU, 16-byte aligned rows (Dh and the strides multiples of 8
// elements: the kernels move rows in 16-byte pieces).
inline void check_heads_layout(const Context& ctx, const char* op, const char* name,
                               const TensorView& t) {
  LOWBIT_USER_CHECK(t.strides[3] == 1 || t.size(3) <= 1,
                    "{}: {} must be contiguous along its last dim (Dh), but its strides are {}; "
                    "pass a view whose rows are contiguous",
                    op, name, t.strides.str());
  for (int i = 0; i < 3; ++i) {
    LOWBIT_USER_CHECK(t.strides[i] >= 0, "{}: {} has a negative stride ({})", op, name,
                      t.strides.str());
  }
  if (ctx.on_gpu()) {
    const bool aligned = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.strides[0] % 8 == 0 &&
                         t.strides[1] % 8 == 0 && t.strides[2] % 8 == 0 && t.size(3) % 8 == 0;
    LOWBIT_USER_CHECK(aligned,
                      "{}: {} must start on a 16-byte boundary with Dh and strides that are "
                      "multiples of 8 elements on the GPU (shape {}, strides {}); pad the buffer "
                      "it views",
                      op, name, t.shape.str(), t.strides.str());
  }
}

// ---- CPU twin helpers: rows of bf16 / f32 tensors as fp32 --------------------------------------

// n elements starting at element offset `off` of t (contiguous run), widened to fp32.
inline void load_row(const TensorView& t, int64_t off, int64_t n, float* dst) {
  if (t.dtype == DType::kF32) {
    const float* p = t.ptr<const float>() + off;
    for (int64_t i = 0; i < n; ++i) dst[i] = p[i];
  } else {
    const uint16_t* p = t.ptr<const uint16_t>() + off;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
  }
}

// Stores n fp32 values at element offset `off` of t, rounding once (RN) when t is bf16.
inline void store_row(const TensorView& t, int64_t off, int64_t n, const float* src) {
  if (t.dtype == DType::kF32) {
    float* p = t.ptr<float>() + off;
    for (int64_t i = 0; i < n; ++i) p[i] = src[i];
  } else {
    uint16_t* p = t.ptr<uint16_t>() + off;
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16_rn(src[i]);
  }
}

}  // namespace lowbit::ops_detail
