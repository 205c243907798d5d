// Progress bar, table rows and size / duration formatting (include/lowbit/train/progress.h).
#include "lowbit/train/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace lowbit {

namespace {

// The unit of `bytes` and its divisor.
std::pair<const char*, double> byte_unit(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double div = 1;
  int u = 0;
  const double b = std::fabs(static_cast<double>(bytes));
  while (u < 5 && b >= div * 1024.0) {
    div *= 1024.0;
    ++u;
  }
  return {kUnits[u], div};
}

std::string number_in_unit(int64_t bytes, double div) {
  if (div == 1) return fmt::format("{}", bytes);
  const double v = static_cast<double>(bytes) / div;
  return std::fabs(v) < 99.95 ? fmt::format("{:.1f}", v) : fmt::format("{:.0f}", v);
}

std::string format_loss(double v) {
  if (!std::isfinite(v)) return v > 0 ? "inf" : (v < 0 ? "-inf" : "nan");
  return fmt::format("{:.4f}", v);
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  const auto [unit, div] = byte_unit(bytes);
  return fmt::format("{} {}", number_in_unit(bytes, div), unit);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "-";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  if (t < 86400) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  return fmt::format("{}d{:02}h", t / 86400, (t % 86400) / 3600);
}

std::string format_count(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a < 1e3) return fmt::format("{:.0f}", v);
  static const struct {
    double div;
    const char* suffix;
  } kSteps[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  for (const auto& st : kSteps) {
    if (a >= st.div * 0.9995) {
      const double x = v / st.div;
      const double ax = std::fabs(x);
      return ax < 9.995   ? fmt::format("{:.2f}{}", x, st.suffix)
             : ax < 99.95 ? fmt::format("{:.1f}{}", x, st.suffix)
                          : fmt::format("{:.0f}{}", x, st.suffix);
    }
  }
  return fmt::format("{:.0f}", v);
}

std::string format_mem_stats(const MemStats& stats) {
  auto one = [](std::string_view name, const MemCounters& c) {
    const auto [unit, div] = byte_unit(std::max(c.current_bytes, c.peak_bytes));
    return fmt::format("{} {} {} (peak {})", name, number_in_unit(c.current_bytes, div), unit,
                       number_in_unit(c.peak_bytes, div));
  };
  std::string out;
  for (int i = 0; i < kNumMemCategories; ++i) {
    const MemCounters& c = stats.by_category[i];
    if (c.current_bytes == 0 && c.peak_bytes == 0) continue;
    if (!out.empty()) out += " · ";
    out += one(mem_category_name(static_cast<MemCategory>(i)), c);
  }
  if (!out.empty()) out += " · ";
  out += one("total", stats.total);
  return out;
}

// ---- ProgressBar -----------------------------------------------------------------------------

ProgressBar::ProgressBar(int64_t total_steps, int64_t start_step, std::FILE* out, Mode mode)
    : total_(total_steps), out_(out ? out : stdout) {
  (void)start_step;  // the rates start from the first update, whatever step that is
  if (mode == Mode::kAuto) {
    tty_ = ::isatty(::fileno(out_)) != 0;
  } else {
    tty_ = mode == Mode::kTty;
  }
  if (tty_ && ::isatty(::fileno(out_))) {
    winsize ws{};
    if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) width_ = ws.ws_col;
  }
}

ProgressBar::~ProgressBar() { finish(); }

double ProgressBar::eta_seconds(const Line& line, double elapsed, int64_t steps_timed) const {
  if (steps_timed <= 0 || elapsed <= 0) return -1;
  const int64_t left = std::max<int64_t>(total_ - line.step, 0);
  return elapsed / double(steps_timed) * double(left);
}

std::string ProgressBar::status_text(const Line& line, double elapsed, int64_t steps_timed) const {
  constexpr int kBar = 20;
  const double frac = total_ > 0 ? std::clamp(double(line.step) / double(total_), 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(frac * kBar);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kBar) bar += '>';
  bar.resize(kBar, ' ');
  std::string s = fmt::format("step {}/{} [{}] {:3.0f}% | loss {}", line.step, total_, bar,
                              frac * 100.0, format_loss(line.loss));
  if (line.val_loss >= 0) s += fmt::format(" | val {}", format_loss(line.val_loss));
  s += fmt::format(" | lr {:.2e} | {} tok/s", line.lr, format_count(line.tokens_per_s));
  if (line.mfu >= 0) s += fmt::format(" | MFU {:.1f}%", line.mfu * 100.0);
  s += fmt::format(" | ETA {}", format_duration(eta_seconds(line, elapsed, steps_timed)));
  return s;
}

std::string ProgressBar::header_text() {
  return fmt::format("{:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>6} {:>8} {:>8}", "step", "loss",
                     "val_loss", "lr", "gnorm", "tok/s", "MFU", "elapsed", "ETA");
}

std::string ProgressBar::row_text(const Line& line, double elapsed, int64_t steps_timed) const {
  return fmt::format("{:>9} {:>9} {:>9} {:>9.2e} {:>8} {:>8} {:>6} {:>8} {:>8}", line.step,
                     format_loss(line.loss), line.val_loss >= 0 ? format_loss(line.val_loss) : "-",
                     line.lr, line.grad_norm >= 0 ? fmt::format("{:.3f}", line.grad_norm) : "-",
                     format_count(line.tokens_per_s),
                     line.mfu >= 0 ? fmt::format("{:.1f}%", line.mfu * 100.0) : "-",
                     format_duration(elapsed),
                     format_duration(eta_seconds(line, elapsed, steps_timed)));
}

void ProgressBar::clear_status() {
  if (tty_ && status_shown_) {
    std::fputs("\r\x1b[2K", out_);
    status_shown_ = false;
  }
}

void ProgressBar::update(const Line& line, bool log_row) {
  const Clock::time_point now = Clock::now();
  if (!started_) {
    // The first step's time includes warm-up (allocations, kernel loading): the rates start
    // from its end.
    started_ = true;
    first_step_ = line.step;
    t_first_ = now;
  }
  finished_ = false;
  const double elapsed = std::chrono::duration<double>(now - t_first_).count();
  const int64_t timed = line.step - first_step_;
  if (log_row) {
    clear_status();
    if (!header_done_) {
      std::fprintf(out_, "%s\n", header_text().c_str());
      header_done_ = true;
    }
    std::fprintf(out_, "%s\n", row_text(line, elapsed, timed).c_str());
  }
  if (tty_) {
    const double since = std::chrono::duration<double>(now - t_redraw_).count();
    if (log_row || !status_shown_ || since >= min_redraw_s_ || line.step >= total_) {
      std::string s = status_text(line, elapsed, timed);
      if (width_ > 1 && static_cast<int>(s.size()) > width_ - 1) s.resize(width_ - 1);
      std::fprintf(out_, "\r\x1b[2K%s", s.c_str());
      status_shown_ = true;
      t_redraw_ = now;
    }
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_ && status_shown_) {
    std::fputc('\n', out_);
    status_shown_ = false;
  }
  std::fflush(out_);
}

}  // namespace lowbit
