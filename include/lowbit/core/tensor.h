// Tensor (owning) and TensorView (non-owning). Shapes and strides are in elements; byte
// offsets of packed types (E2M1, two per byte) are computed from element offsets.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "lowbit/core/allocator.h"
#include "lowbit/core/device.h"
#include "lowbit/core/dtype.h"

struct CUstream_st;  // cudaStream_t

namespace lowbit {

inline constexpr int kMaxDims = 6;

struct Shape {
  int ndim = 0;
  int64_t d[kMaxDims] = {};

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int64_t operator[](int i) const { return d[i < 0 ? i + ndim : i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[65, 80]"
};

// Row-major contiguous strides of `shape`, in elements.
Shape contiguous_strides(const Shape& shape);

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;  // in elements
  Device device;

  TensorView() = default;
  TensorView(void* p, DType t, Shape s, Device dev);                 // contiguous
  TensorView(void* p, DType t, Shape s, Shape strides, Device dev);  // strided

  int ndim() const { return shape.ndim; }
  int64_t numel() const { return shape.numel(); }
  int64_t size(int i) const { return shape[i]; }
  bool is_contiguous() const;
  // Bytes spanned by a contiguous view (packed types round up).
  int64_t nbytes() const { return dtype_storage_bytes(dtype, numel()); }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Same storage, new shape; requires a contiguous view and the same element count.
  TensorView reshape(Shape s) const;
  std::string str() const;  // "bf16[65, 80] cuda:0"
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage. The category is what the allocator accounts it under.
  static Tensor empty(Shape shape, DType t, Device dev, MemCategory cat = MemCategory::kOther);
  static Tensor zeros(Shape shape, DType t, Device dev, MemCategory cat = MemCategory::kOther);
  // A contiguous copy of `src` on `dev`.
  static Tensor copy_of(const TensorView& src, Device dev, MemCategory cat = MemCategory::kOther);

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  bool defined() const { return storage_ != nullptr || view_.ndim() > 0; }
  void* data() const { return view_.data; }
  template <typename T>
  T* ptr() const {
    return view_.ptr<T>();
  }
  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  Device device() const { return view_.device; }
  int64_t numel() const { return view_.numel(); }
  int64_t nbytes() const { return view_.nbytes(); }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Copies between two contiguous views of the same dtype and element count, any devices.
void copy_tensor(const TensorView& dst, const TensorView& src);
// Sets every byte of a contiguous view.
void fill_bytes(const TensorView& dst, uint8_t byte);
// The same, ordered on `stream` (a Context's stream) instead of the legacy default stream: for
// the small per-op fills inside a step (an amax to accumulate into), where a legacy-stream
// memset would put a cross-stream dependency between two kernels. Device views only; fills of at
// most 4 KiB (kSmallFillBytes) run as a kernel with programmatic dependent launch
// (src/core/fill_small.cu).
void fill_bytes_on(const TensorView& dst, uint8_t byte, CUstream_st* stream);

}  // namespace lowbit
