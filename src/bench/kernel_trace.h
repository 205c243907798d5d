// In-situ kernel timeline of a benchmark (`lowbit bench train --kernel-trace FILE`): every
// kernel's start and end as the GPU ran it, through CUPTI's activity API, without replaying
// or serialising anything. It answers what a profiler would, where none is installed: where a
// step's time goes, kernel by kernel, and how much of the wall time the GPU was busy at all
// (the rest is launch gaps and host work on the critical path).
//
// CUPTI is loaded at run time (dlopen of libcupti.so.13), so lowbit runs where it is absent;
// asking for a trace there is a clear error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lowbit::bench {

struct KernelRecord {
  std::string name;  // demangled, template arguments kept
  uint64_t start_ns = 0, end_ns = 0;
};

struct KernelSummaryRow {
  std::string name;
  int64_t launches = 0;
  double total_ms = 0;
};

// A host-side CUDA runtime call (cudaMemcpy, cudaLaunchKernel, …) as CUPTI timed it, on the
// kernels' clock.
struct ApiRecord {
  std::string name;  // without CUPTI's version suffix
  uint64_t start_ns = 0, end_ns = 0;
};

// An interval with no kernel running, between the end of `before` and the start of `after`.
struct IdleGap {
  double us = 0;
  std::string before, after;
  uint64_t from_ns = 0, to_ns = 0;
  // The runtime calls that overlap the gap, by the time they overlap it (largest first):
  // "cudaMemcpy 310.2 us ×1". What the host did while the GPU waited.
  std::vector<std::string> host;
};

// Idle time by gap length: (0, 2], (2, 10], (10, 100] and > 100 µs.
struct IdleBucket {
  double max_us;  // the bucket's upper bound (infinity for the last)
  int64_t gaps = 0;
  double total_ms = 0;
};

struct KernelSummary {
  std::vector<KernelSummaryRow> rows;  // by total time, largest first
  double kernel_ms = 0;                // Σ kernel durations
  double busy_ms = 0;                  // union of the kernels' intervals
  double span_ms = 0;                  // first start .. last end
  int64_t kernels = 0;
  std::vector<IdleBucket> idle;       // span − busy, by gap length
  std::vector<IdleGap> longest_gaps;  // the kLongestGaps longest, longest first
  static constexpr int kLongestGaps = 8;
};

// One trace at a time per process. start() throws UserError when CUPTI cannot be loaded or
// refuses; stop() (after the device work to be traced has been synchronised) flushes and
// returns the kernel records; api() then holds the runtime calls of the same span.
class KernelTrace {
 public:
  static std::unique_ptr<KernelTrace> start();
  ~KernelTrace();
  std::vector<KernelRecord> stop();
  const std::vector<ApiRecord>& api() const { return api_; }
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

 private:
  KernelTrace() = default;
  bool running_ = false;
  std::vector<ApiRecord> api_;
};

// `api` (sorted by start, or empty) fills each longest gap's `host`.
KernelSummary summarize_kernels(const std::vector<KernelRecord>& records,
                                const std::vector<ApiRecord>& api = {});

// The summary as text: a header (kernel sum, busy, span per `per` units, e.g. per step), one
// line per kernel name, then the idle time by gap length and the longest gaps with the kernels
// around them (where a host stall or a synchronisation sits in the timeline).
std::string format_kernel_summary(const KernelSummary& s, int per, const std::string& title);

}  // namespace lowbit::bench
