#include "lowbit/core/context.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "core/env_switch.h"
#include "lowbit/core/allocator.h"
#include "lowbit/core/cuda_check.h"

namespace lowbit {

Context Context::create_default() {
  return Context(cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu());
}

Context::Context(Device dev) : device_(dev) {
  validate_env_switches();  // a mistyped switch fails here, before any work is queued
  if (dev.is_cuda()) {
    LOWBIT_USER_CHECK(dev.index < cuda_device_count(),
                      "GPU {} requested but {} GPU(s) found; pick an index below the count",
                      dev.index, cuda_device_count());
    LOWBIT_CUDA_CHECK(cudaSetDevice(dev.index));
    // A blocking stream: work on the legacy default stream (cudaMemcpy, cudaMemset of
    // Tensor::zeros, copy_tensor) is ordered with it in both directions, so host-side copies and
    // fills need no device-wide synchronisation, and a device block the allocator's cache hands
    // out again is never written while queued kernels still read it.
    cudaStream_t s = nullptr;
    LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
    stream_ = s;
  }
}

Context::~Context() { release(); }

Context::Context(Context&& o) noexcept { *this = std::move(o); }

Context& Context::operator=(Context&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    stream_ = std::exchange(o.stream_, nullptr);
    side_ = std::exchange(o.side_, nullptr);
    fork_event_ = std::exchange(o.fork_event_, nullptr);
    join_event_ = std::exchange(o.join_event_, nullptr);
    cublaslt_ = std::exchange(o.cublaslt_, nullptr);
    workspace_ = std::exchange(o.workspace_, nullptr);
    workspace_bytes_ = std::exchange(o.workspace_bytes_, 0);
    reduction_words_ = std::exchange(o.reduction_words_, nullptr);
    pinned_ = std::exchange(o.pinned_, nullptr);
    pinned_bytes_ = std::exchange(o.pinned_bytes_, 0);
    seed_ = o.seed_;
    next_offset_ = o.next_offset_;
  }
  return *this;
}

void Context::release() {
  if (workspace_ != nullptr) {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    mem_free(device_, workspace_, workspace_bytes_, MemCategory::kWorkspace);
    workspace_ = nullptr;
    workspace_bytes_ = 0;
  }
  if (reduction_words_ != nullptr) {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    mem_free(device_, reduction_words_, kReductionWords * sizeof(uint32_t),
             MemCategory::kWorkspace);
    reduction_words_ = nullptr;
  }
  if (pinned_ != nullptr) {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_bytes_ = 0;
  }
  if (cublaslt_ != nullptr) {
    cublasLtDestroy(cublaslt_);
    cublaslt_ = nullptr;
  }
  if (side_ != nullptr) {
    cudaStreamSynchronize(side_);
    cudaStreamDestroy(side_);
    cudaEventDestroy(fork_event_);
    cudaEventDestroy(join_event_);
    side_ = nullptr;
    fork_event_ = join_event_ = nullptr;
  }
  if (stream_ != nullptr) {
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
}

CUstream_st* Context::side_stream() {
  LOWBIT_CHECK(on_gpu(), "side stream requested on a CPU context");
  if (side_ == nullptr) {
    LOWBIT_CUDA_CHECK(cudaSetDevice(device_.index));
    int least = 0, greatest = 0;
    LOWBIT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    LOWBIT_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    cudaEvent_t f = nullptr, j = nullptr;
    LOWBIT_CUDA_CHECK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
    LOWBIT_CUDA_CHECK(cudaEventCreateWithFlags(&j, cudaEventDisableTiming));
    side_ = s;
    fork_event_ = f;
    join_event_ = j;
  }
  return side_;
}

Context::SideFork::SideFork(Context& ctx) : ctx_(&ctx) {
  cudaStream_t side = ctx.side_stream();
  LOWBIT_CUDA_CHECK(cudaEventRecord(ctx.fork_event_, ctx.stream_));
  LOWBIT_CUDA_CHECK(cudaStreamWaitEvent(side, ctx.fork_event_, 0));
}

CUstream_st* Context::SideFork::stream() const {
  LOWBIT_CHECK(ctx_ != nullptr, "SideFork::stream after join");
  return ctx_->side_;
}

void Context::SideFork::join() {
  if (ctx_ == nullptr) return;
  Context& ctx = *std::exchange(ctx_, nullptr);
  LOWBIT_CUDA_CHECK(cudaEventRecord(ctx.join_event_, ctx.side_));
  LOWBIT_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream_, ctx.join_event_, 0));
}

// Reached with ctx_ set only when an exception left the scope before join(): a failure of this
// join is not reported over the exception already on its way.
Context::SideFork::~SideFork() {
  try {
    join();
  } catch (...) {
  }
}

cublasLtContext* Context::cublaslt() {
  LOWBIT_CHECK(on_gpu(), "cuBLASLt handle requested on a CPU context");
  if (cublaslt_ == nullptr) LOWBIT_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  return cublaslt_;
}

void* Context::workspace(size_t bytes) {
  if (bytes > workspace_bytes_) {
    if (workspace_ != nullptr) {
      synchronize();  // in-flight work may still read the old buffer
      mem_free(device_, workspace_, workspace_bytes_, MemCategory::kWorkspace);
      workspace_ = nullptr;
      workspace_bytes_ = 0;
    }
    workspace_ = mem_alloc(device_, bytes, MemCategory::kWorkspace);
    workspace_bytes_ = bytes;
  }
  return workspace_;
}

uint32_t* Context::reduction_words() {
  LOWBIT_CHECK(on_gpu(), "reduction words requested on a CPU context");
  if (reduction_words_ == nullptr) {
    void* p = mem_alloc(device_, kReductionWords * sizeof(uint32_t), MemCategory::kWorkspace);
    reduction_words_ = static_cast<uint32_t*>(p);  // owned (released) even if the fill fails
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(p, 0, kReductionWords * sizeof(uint32_t), stream_));
  }
  return reduction_words_;
}

void Context::read_back(const std::vector<HostCopy>& copies) {
  // Each copy's place in the staging buffer starts on a 256-byte boundary.
  const auto slot = [](const HostCopy& c) {
    return (static_cast<size_t>(c.src.nbytes()) + 255) / 256 * 256;
  };
  size_t total = 0;
  for (const HostCopy& c : copies) {
    LOWBIT_CHECK(c.src.is_contiguous() && c.src.device == device_,
                 "read_back: {} must be contiguous on {}", c.src.str(), device_.str());
    total += slot(c);
  }
  if (!on_gpu()) {
    for (const HostCopy& c : copies) {
      if (c.src.nbytes() > 0) std::memcpy(c.dst, c.src.data, static_cast<size_t>(c.src.nbytes()));
    }
    return;
  }
  if (total > pinned_bytes_) {
    if (pinned_ != nullptr) {
      synchronize();  // an earlier read-back may still be landing in it
      LOWBIT_CUDA_CHECK(cudaFreeHost(pinned_));
      pinned_ = nullptr;
      pinned_bytes_ = 0;
    }
    LOWBIT_CUDA_CHECK(cudaMallocHost(&pinned_, total));
    pinned_bytes_ = total;
  }
  size_t off = 0;
  for (const HostCopy& c : copies) {
    const size_t bytes = static_cast<size_t>(c.src.nbytes());
    if (bytes > 0) {
      LOWBIT_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(pinned_) + off, c.src.data, bytes,
                                        cudaMemcpyDeviceToHost, stream_));
    }
    off += slot(c);
  }
  synchronize();
  off = 0;
  for (const HostCopy& c : copies) {
    const size_t bytes = static_cast<size_t>(c.src.nbytes());
    if (bytes > 0) std::memcpy(c.dst, static_cast<char*>(pinned_) + off, bytes);
    off += slot(c);
  }
}

void Context::synchronize() const {
  if (stream_ != nullptr) LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace lowbit
