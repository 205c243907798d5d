// write_file_atomic (the writer of safetensors files, metrics, JSON reports, tokenizers and shard
// manifests): its temporary file is always a new one, never a file or link already at that name,
// and a replaced file keeps its permissions.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "data/data_test_util.h"
#include "data/data_util.h"

namespace lowbit::data {
namespace {

namespace fs = std::filesystem;
using testing::user_error;

class AtomicWrite : public testing::ScratchDirTest {
 protected:
  std::string read_bytes(const std::string& p) const {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  std::string tmp_name(const std::string& p) const {
    return p + ".tmp-" + std::to_string(::getpid());
  }
  static mode_t mode_of(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
    return st.st_mode & 0777;
  }
};

TEST_F(AtomicWrite, LinkAtTheTemporaryNameIsNotFollowed) {
  const std::string victim = write("victim", "keep me");
  const std::string out = path("out.json");
  fs::create_symlink(victim, tmp_name(out));
  detail::write_file_atomic(out, "new");
  EXPECT_EQ(read_bytes(out), "new");
  EXPECT_EQ(read_bytes(victim), "keep me");
  EXPECT_TRUE(fs::is_symlink(tmp_name(out)));
  EXPECT_FALSE(fs::is_symlink(out));
}

TEST_F(AtomicWrite, FileAtTheTemporaryNameIsLeftAlone) {
  const std::string out = path("out.json");
  write("out.json.tmp-" + std::to_string(::getpid()), "someone else's");
  detail::write_file_atomic(out, "new");
  EXPECT_EQ(read_bytes(out), "new");
  EXPECT_EQ(read_bytes(tmp_name(out)), "someone else's");
  EXPECT_FALSE(fs::exists(tmp_name(out) + "-1"));  // renamed onto out
}

TEST_F(AtomicWrite, EveryTemporaryNameTakenIsAClearError) {
  const std::string out = path("out.json");
  write("out.json.tmp-" + std::to_string(::getpid()), "");
  for (int i = 1; i <= 100; ++i) {
    write("out.json.tmp-" + std::to_string(::getpid()) + "-" + std::to_string(i), "");
  }
  const std::string msg = user_error([&] { detail::write_file_atomic(out, "new"); });
  EXPECT_NE(msg.find("cannot create the temporary file"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(AtomicWrite, ReplacedFileKeepsItsPermissions) {
  const std::string out = write("key.json", "old");
  fs::permissions(out, fs::perms::owner_read | fs::perms::owner_write);
  detail::write_file_atomic(out, "new");
  EXPECT_EQ(read_bytes(out), "new");
  EXPECT_EQ(mode_of(out), 0600u);

  fs::permissions(out, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                           fs::perms::others_read | fs::perms::others_write);
  detail::write_file_atomic(out, "newer");  // bits the umask would clear are kept too
  EXPECT_EQ(mode_of(out), 0646u);
}

TEST_F(AtomicWrite, NewFileGetsTheUmasksMode) {
  const mode_t old_mask = ::umask(027);
  const std::string out = path("new.json");
  detail::write_file_atomic(out, "x");
  ::umask(old_mask);
  EXPECT_EQ(mode_of(out), 0640u);
}

}  // namespace
}  // namespace lowbit::data
