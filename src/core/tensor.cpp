#include "lowbit/core/tensor.h"

#include <cuda_runtime.h>

#include <cstring>

#include "core/fill_small.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/core/error.h"

namespace lowbit {

Shape::Shape(std::initializer_list<int64_t> dims) {
  LOWBIT_CHECK(dims.size() <= kMaxDims, "at most {} dims, got {}", kMaxDims, dims.size());
  for (int64_t v : dims) d[ndim++] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= d[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i) {
    if (d[i] != o.d[i]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape st;
  st.ndim = shape.ndim;
  int64_t acc = 1;
  for (int i = shape.ndim - 1; i >= 0; --i) {
    st.d[i] = acc;
    acc *= shape.d[i];
  }
  return st;
}

TensorView::TensorView(void* p, DType t, Shape s, Device dev)
    : data(p), dtype(t), shape(s), strides(contiguous_strides(s)), device(dev) {
  for (int i = 0; i < s.ndim; ++i) LOWBIT_CHECK(s.d[i] >= 0, "negative dim in {}", s.str());
}

TensorView::TensorView(void* p, DType t, Shape s, Shape st, Device dev)
    : data(p), dtype(t), shape(s), strides(st), device(dev) {
  LOWBIT_CHECK(s.ndim == st.ndim, "shape {} and strides {} differ in rank", s.str(), st.str());
}

bool TensorView::is_contiguous() const {
  const Shape c = contiguous_strides(shape);
  for (int i = 0; i < shape.ndim; ++i) {
    if (shape.d[i] != 1 && strides.d[i] != c.d[i]) return false;
  }
  return true;
}

TensorView TensorView::reshape(Shape s) const {
  LOWBIT_CHECK(is_contiguous(), "reshape of a non-contiguous view {}", str());
  LOWBIT_CHECK(s.numel() == numel(), "reshape {} -> {} changes the element count", shape.str(),
               s.str());
  return TensorView(data, dtype, s, device);
}

std::string TensorView::str() const {
  return fmt::format("{}{} {}", dtype_name(dtype), shape.str(), device.str());
}

Tensor Tensor::empty(Shape shape, DType t, Device dev, MemCategory cat) {
  Tensor out;
  const size_t bytes = static_cast<size_t>(dtype_storage_bytes(t, shape.numel()));
  void* p = mem_alloc(dev, bytes, cat);
  out.storage_ =
      std::shared_ptr<void>(p, [dev, bytes, cat](void* q) { mem_free(dev, q, bytes, cat); });
  out.view_ = TensorView(p, t, shape, dev);
  return out;
}

Tensor Tensor::zeros(Shape shape, DType t, Device dev, MemCategory cat) {
  Tensor out = empty(shape, t, dev, cat);
  fill_bytes(out.view(), 0);
  return out;
}

Tensor Tensor::copy_of(const TensorView& src, Device dev, MemCategory cat) {
  Tensor out = empty(src.shape, src.dtype, dev, cat);
  copy_tensor(out.view(), src);
  return out;
}

void copy_tensor(const TensorView& dst, const TensorView& src) {
  LOWBIT_CHECK(dst.dtype == src.dtype, "copy {} <- {}: dtypes differ", dst.str(), src.str());
  LOWBIT_CHECK(dst.numel() == src.numel(), "copy {} <- {}: sizes differ", dst.str(), src.str());
  LOWBIT_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy {} <- {}: needs contiguous views",
               dst.str(), src.str());
  const size_t bytes = static_cast<size_t>(src.nbytes());
  if (bytes == 0) return;
  if (dst.device.is_cpu() && src.device.is_cpu()) {
    std::memcpy(dst.data, src.data, bytes);
    return;
  }
  // On the legacy default stream, which context streams (blocking streams) are ordered with.
  LOWBIT_CUDA_CHECK(cudaMemcpy(dst.data, src.data, bytes, cudaMemcpyDefault));
}

void fill_bytes(const TensorView& dst, uint8_t byte) {
  LOWBIT_CHECK(dst.is_contiguous(), "fill of a non-contiguous view {}", dst.str());
  const size_t bytes = static_cast<size_t>(dst.nbytes());
  if (bytes == 0) return;
  if (dst.device.is_cpu()) {
    std::memset(dst.data, byte, bytes);
  } else {
    LOWBIT_CUDA_CHECK(cudaMemset(dst.data, byte, bytes));  // legacy stream: see copy_tensor
  }
}

void fill_bytes_on(const TensorView& dst, uint8_t byte, CUstream_st* stream) {
  LOWBIT_CHECK(dst.is_contiguous(), "fill of a non-contiguous view {}", dst.str());
  LOWBIT_CHECK(dst.device.is_cuda(), "fill_bytes_on: {} is not a device view", dst.str());
  const size_t bytes = static_cast<size_t>(dst.nbytes());
  if (bytes == 0) return;
  if (bytes <= kSmallFillBytes) return fill_small_on(dst.data, byte, bytes, stream);
  LOWBIT_CUDA_CHECK(cudaMemsetAsync(dst.data, byte, bytes, stream));
}

}  // namespace lowbit
