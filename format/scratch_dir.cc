#include "format/scratch_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstring>

#include "format/error.h"

namespace kvdiff::format {
namespace {

// The live folders' paths, in fixed storage an exit handler can read. A slot is written before
// it is marked in use and unmarked before its folder is removed.
constexpr int kSlots = 64;
std::array<std::atomic<bool>, kSlots> in_use{};
std::array<std::array<char, PATH_MAX>, kSlots> paths{};

int Register(const std::filesystem::path& path) {
  const std::string& text = path.native();
  if (text.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (!in_use[i].compare_exchange_strong(expected, true)) continue;
    // Claimed: mark it unreadable while the path is written (an empty path is skipped).
    paths[i][0] = '\0';
    std::memcpy(paths[i].data() + 1, text.c_str() + 1, text.size());
    paths[i][0] = text[0];
    return i;
  }
  return -1;  // more live folders than slots: this one is left to its destructor alone
}

struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[256];  // NUL-terminated, d_reclen - 19 bytes at most; never allocated, only read
};

// Unlinks the entries of `dir` (files) and removes it: open, getdents64, unlinkat, rmdir only.
void RemoveFlatFolder(const char* dir) noexcept {
  const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buffer[4096];
  while (true) {
    const long n = syscall(SYS_getdents64, fd, buffer, sizeof buffer);
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      const auto* entry = reinterpret_cast<const LinuxDirent64*>(buffer + at);
      at += entry->d_reclen;
      const char* name = entry->d_name;
      if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
      unlinkat(fd, name, 0);
    }
  }
  close(fd);
  rmdir(dir);
}

}  // namespace

ScratchDir::ScratchDir(const std::string& purpose) {
  static std::atomic<unsigned> counter{0};
  const auto tmp = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    path_ = tmp / fmt::format("kvdiff-{}-{}-{}", purpose, static_cast<long>(getpid()), counter++);
    std::error_code ec;
    if (std::filesystem::create_directory(path_, ec)) {
      slot_ = Register(path_);
      return;
    }
  }
  throw InputError(fmt::format("cannot create a temporary folder in {}", tmp.string()));
}

ScratchDir::~ScratchDir() {
  if (slot_ >= 0) in_use[slot_].store(false);
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void RemoveLiveScratchDirs() noexcept {
  for (int i = 0; i < kSlots; ++i) {
    if (in_use[i].load() && paths[i][0] != '\0') RemoveFlatFolder(paths[i].data());
  }
}

}  // namespace kvdiff::format
