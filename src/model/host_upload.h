// Small uploads of a micro-batch's token ids and targets that do not stall the host: from host
// memory the bytes go through pinned staging slots with cudaMemcpyAsync on the context's stream,
// instead of a pageable cudaMemcpy (~80 µs of host time between a step's end-of-step wait and its
// first kernel), and a slot is reused only after the copy that last read it has completed; ids
// already on the context's GPU are copied on its stream (not with a legacy-stream cudaMemcpy,
// which waits for the device).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>

#include "lowbit/core.h"

namespace lowbit {

class HostUpload {
 public:
  HostUpload() = default;
  HostUpload(const HostUpload&) = delete;
  HostUpload& operator=(const HostUpload&) = delete;
  ~HostUpload();
  // dst (contiguous, on ctx's GPU) = src (contiguous host memory, or memory on ctx's GPU, of the
  // same byte size), queued on ctx's stream; returns once host memory src may be reused (a
  // device src is read when the stream reaches the copy).
  void copy(Context& ctx, const TensorView& src, const TensorView& dst);

 private:
  struct Slot {
    void* pinned = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the slot's last copy
    bool pending = false;
  };
  std::array<Slot, 4> slots_{};
  size_t next_ = 0;
};

}  // namespace lowbit
