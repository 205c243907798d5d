// HostUpload (host_upload.h).
#include "model/host_upload.h"

#include <cstring>

#include "lowbit/core/cuda_check.h"

namespace lowbit {

HostUpload::~HostUpload() {
  for (Slot& s : slots_) {
    // Destructors do not throw: a failed wait leaves the buffer to the process's teardown.
    if (s.pending && cudaEventSynchronize(s.done) != cudaSuccess) continue;
    if (s.done != nullptr) cudaEventDestroy(s.done);
    if (s.pinned != nullptr) cudaFreeHost(s.pinned);
  }
}

void HostUpload::copy(Context& ctx, const TensorView& src, const TensorView& dst) {
  LOWBIT_CHECK((src.device.is_cpu() || src.device == ctx.device()) && src.is_contiguous() &&
                   dst.is_contiguous() && dst.device == ctx.device() &&
                   src.nbytes() == dst.nbytes(),
               "HostUpload: {} → {} must be contiguous host or {} memory → {}, of one size",
               src.str(), dst.str(), ctx.device().str(), ctx.device().str());
  const size_t bytes = static_cast<size_t>(src.nbytes());
  if (bytes == 0) return;
  if (!src.device.is_cpu()) {
    LOWBIT_CUDA_CHECK(
        cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, ctx.stream()));
    return;
  }
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  if (s.pending) LOWBIT_CUDA_CHECK(cudaEventSynchronize(s.done));  // its last copy has read it
  s.pending = false;
  if (s.bytes < bytes) {
    if (s.pinned != nullptr) LOWBIT_CUDA_CHECK(cudaFreeHost(s.pinned));
    s.pinned = nullptr;
    s.bytes = 0;
    LOWBIT_CUDA_CHECK(cudaMallocHost(&s.pinned, bytes));
    s.bytes = bytes;
  }
  if (s.done == nullptr)
    LOWBIT_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  std::memcpy(s.pinned, src.data, bytes);
  LOWBIT_CUDA_CHECK(
      cudaMemcpyAsync(dst.data, s.pinned, bytes, cudaMemcpyHostToDevice, ctx.stream()));
  LOWBIT_CUDA_CHECK(cudaEventRecord(s.done, ctx.stream()));
  s.pending = true;
}

}  // namespace lowbit
