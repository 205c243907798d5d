// Context: the device a computation runs on, its stream, library handles and workspace.
// CPU contexts carry no stream; kernels dispatch on the tensors' device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lowbit/core/device.h"
#include "lowbit/core/tensor.h"

struct CUstream_st;
struct CUevent_st;
struct cublasLtContext;

namespace lowbit {

class Context {
 public:
  // The first GPU if there is one, else the CPU.
  static Context create_default();
  explicit Context(Device dev);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;

  Device device() const { return device_; }
  bool on_gpu() const { return device_.is_cuda(); }
  CUstream_st* stream() const { return stream_; }  // cudaStream_t; null on the CPU
  cublasLtContext* cublaslt();                     // created on first use
  // Latency-bound work beside the main stream's, on a second stream of this device (high
  // priority; created on first use, GPU only). Constructing a SideFork makes that stream wait
  // for the main stream's work so far; join() makes the main stream wait for the side stream's
  // work so far — also done by the destructor when an exception leaves the scope first, so that
  // queued side work never outlives the call that owns its buffers. An op that forks joins
  // before it returns: callers see one ordered stream.
  class SideFork {
   public:
    explicit SideFork(Context& ctx);
    ~SideFork();
    SideFork(const SideFork&) = delete;
    SideFork& operator=(const SideFork&) = delete;
    CUstream_st* stream() const;  // the side stream (cudaStream_t)
    void join();

   private:
    Context* ctx_;  // null once joined
  };
  // Scratch memory of at least `bytes`, owned by the context, accounted as workspace.
  // Valid until the next call that asks for more.
  void* workspace(size_t bytes);
  size_t workspace_bytes() const { return workspace_bytes_; }
  // kReductionWords u32 words of device memory that are zero whenever no kernel of this
  // context's stream is running: a kernel may use them for a grid-wide reduction (accumulate,
  // count the finished blocks; the last block reads the result) provided that last block sets
  // them back to zero. For kernels on the main stream only (one such kernel at a time). GPU only;
  // allocated and zeroed on first use.
  static constexpr int kReductionWords = 16;
  uint32_t* reduction_words();
  void synchronize() const;

  // Small device results read back to the host: each copy's `src` (contiguous, on this
  // context's device) into `dst` (src's bytes of host memory). The copies are queued on the
  // context's stream into a pinned staging buffer the context owns and waited for once — one
  // synchronisation for all of them, no pageable-memory copies (which cost ~0.1 ms each on the
  // critical path between a step's kernels). On the CPU, plain copies.
  struct HostCopy {
    TensorView src;
    void* dst;
  };
  void read_back(const std::vector<HostCopy>& copies);

  // Random-number stream state for ops that draw from Philox: each call takes a fresh offset.
  uint64_t seed() const { return seed_; }
  void set_seed(uint64_t s) {
    seed_ = s;
    next_offset_ = 0;
  }
  uint64_t take_rng_offset() { return next_offset_++; }
  // The next offset take_rng_offset() would return (checkpoints store and restore it).
  uint64_t rng_offset() const { return next_offset_; }
  void set_rng_offset(uint64_t next) { next_offset_ = next; }

 private:
  void release();
  CUstream_st* side_stream();  // created on first use
  Device device_;
  CUstream_st* stream_ = nullptr;
  CUstream_st* side_ = nullptr;
  CUevent_st* fork_event_ = nullptr;  // recorded on stream_, waited for by side_
  CUevent_st* join_event_ = nullptr;  // recorded on side_, waited for by stream_
  cublasLtContext* cublaslt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  uint32_t* reduction_words_ = nullptr;  // [kReductionWords], see reduction_words()
  void* pinned_ = nullptr;               // read_back's staging buffer (page-locked host memory)
  size_t pinned_bytes_ = 0;
  uint64_t seed_ = 0x5EEDu;
  uint64_t next_offset_ = 0;
};

}  // namespace lowbit
