// What a training run prints: a progress bar on a terminal (one line redrawn in place), plain
// table rows otherwise, and the formatting of sizes, durations and memory counters.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "lowbit/core/allocator.h"

namespace lowbit {

// "512 B", "12.3 KiB", "1.2 GiB" (binary units; one decimal below 100, none above).
std::string format_bytes(int64_t bytes);
// "45s", "2m13s", "1h02m", "3d04h"; "-" for a negative or non-finite duration.
std::string format_duration(double seconds);
// "950", "12.3k", "4.56M", "1.20G": a rate or count with an SI suffix.
std::string format_count(double v);
// "weights 1.2 GiB (peak 1.3) · gradients 1.2 GiB (peak 1.2) · … · total 3.1 GiB (peak 3.5)":
// every category that held memory, each current value with its peak in the same unit.
std::string format_mem_stats(const MemStats& stats);

class ProgressBar {
 public:
  // One step's numbers. Negative optional fields are not shown.
  struct Line {
    int64_t step = 0;  // steps done, 1-based
    double loss = 0;
    double lr = 0;
    double grad_norm = -1;
    double tokens_per_s = 0;
    double mfu = -1;       // model FLOPs utilisation, a fraction
    double val_loss = -1;  // set on the steps that evaluated
  };
  enum class Mode : uint8_t {
    kAuto,   // kTty when `out` is a terminal, else kPlain
    kTty,    // a status line redrawn with '\r' (plus the table rows asked for)
    kPlain,  // only the table rows asked for (logs, pipes, CI)
  };

  // Steps start_step + 1 … total_steps remain (a resumed run starts past 0); rates and the ETA
  // are measured from the end of the first update, so set-up and warm-up do not count.
  explicit ProgressBar(int64_t total_steps, int64_t start_step = 0, std::FILE* out = stdout,
                       Mode mode = Mode::kAuto);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Records a finished step. `log_row`: also print a permanent table row (the header before
  // the first one). On a terminal the status line is redrawn at most every
  // min_redraw_seconds (always when a row is printed).
  void update(const Line& line, bool log_row);
  // Ends the status line (a terminal keeps its last state on its own line).
  void finish();

  bool is_tty() const { return tty_; }
  void set_min_redraw_seconds(double s) { min_redraw_s_ = s; }
  // The status line and table row of `line`, with `elapsed` seconds since the first update
  // covering `steps_timed` steps (for the ETA).
  std::string status_text(const Line& line, double elapsed, int64_t steps_timed) const;
  std::string row_text(const Line& line, double elapsed, int64_t steps_timed) const;
  static std::string header_text();

 private:
  using Clock = std::chrono::steady_clock;
  double eta_seconds(const Line& line, double elapsed, int64_t steps_timed) const;
  void clear_status();

  int64_t total_;
  std::FILE* out_;
  bool tty_ = false;
  bool header_done_ = false;
  bool status_shown_ = false;
  bool finished_ = false;
  bool started_ = false;
  int64_t first_step_ = 0;  // the step of the first update (its time is not measured)
  Clock::time_point t_first_{};
  Clock::time_point t_redraw_{};
  double min_redraw_s_ = 0.1;
  int width_ = 0;  // terminal columns (0: unknown)
};

}  // namespace lowbit
