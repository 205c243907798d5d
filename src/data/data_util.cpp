// Helpers of the data layer (data_util.h).
#include "data/data_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "lowbit/core/error.h"

namespace lowbit::data::detail {

namespace {

// Names write_file_atomic tries for its temporary file before giving up.
constexpr int kMaxTempAttempts = 100;

}  // namespace

uint64_t hash64(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = mix64(seed ^ 0x9E3779B97F4A7C15ull);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);  // the byte order of x86 and Arm hosts alike: little-endian
    h = mix64(h ^ w) + 0x9E3779B97F4A7C15ull;
  }
  if (i < n) {
    uint64_t w = 0;
    for (size_t k = 0; i + k < n; ++k) w |= static_cast<uint64_t>(p[i + k]) << (8 * k);
    h = mix64(h ^ w) + 0x9E3779B97F4A7C15ull;
  }
  return mix64(h ^ static_cast<uint64_t>(n));
}

std::string errno_text() { return std::strerror(errno); }

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOWBIT_USER_CHECK(fd >= 0, "{}: cannot open the file: {}", path, errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(fmt::format("{}: not a regular file", path));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const std::string err = r < 0 ? errno_text() : "unexpected end of file";
      ::close(fd);
      throw UserError(fmt::format("{}: reading the file failed: {}", path, err));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return out;
}

void write_file_atomic(const std::string& path, const Piece* pieces, size_t n_pieces) {
  // Named up front: an empty path otherwise fails at the rename with a message about the
  // temporary file. (A directory in the way fails at the rename, which removes the temporary.)
  LOWBIT_USER_CHECK(!path.empty(), "the output file name is empty: give a file path");
  // The new file replaces an existing one with that file's permission bits (a private file stays
  // private), set before any byte is written; a new name gets the umask's mode.
  struct stat old_st {};
  const bool keep_mode = ::stat(path.c_str(), &old_st) == 0 && S_ISREG(old_st.st_mode);
  const mode_t mode = keep_mode ? (old_st.st_mode & 0777) : 0666;
  // O_EXCL (which also refuses a symlink, even a dangling one) and O_NOFOLLOW: a file or link
  // already at the temporary name is never written through; another name is tried instead.
  const long pid = static_cast<long>(::getpid());
  std::string tmp;
  int fd = -1;
  for (int attempt = 0;; ++attempt) {
    tmp = attempt == 0 ? fmt::format("{}.tmp-{}", path, pid)
                       : fmt::format("{}.tmp-{}-{}", path, pid, attempt);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST || attempt == kMaxTempAttempts) break;
  }
  LOWBIT_USER_CHECK(fd >= 0,
                    "{}: cannot create the temporary file {}: {} (does the directory exist "
                    "and is it writable?)",
                    path, tmp, errno_text());
  auto fail = [&](const std::string& what) {
    const std::string err = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw UserError(fmt::format("{}: {} failed: {}", path, what, err));
  };
  // open() applied the umask to `mode`: give the replacement the old file's bits exactly.
  if (keep_mode && ::fchmod(fd, mode) != 0) fail(fmt::format("setting the permissions of {}", tmp));
  for (size_t k = 0; k < n_pieces; ++k) {
    const char* c = static_cast<const char*>(pieces[k].data);
    size_t n = pieces[k].size;
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(fmt::format("writing {}", tmp));
      c += w;
      n -= static_cast<size_t>(w);
    }
  }
  if (::fsync(fd) != 0) fail(fmt::format("fsync of {}", tmp));
  if (::close(fd) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw UserError(fmt::format("{}: closing {} failed: {}", path, tmp, err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw UserError(fmt::format("{}: renaming {} onto it failed: {}", path, tmp, err));
  }
  // Make the rename durable: fsync the directory (best effort).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace lowbit::data::detail
