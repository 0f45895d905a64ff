// A folder under the system temporary directory, removed with everything in it when the object
// goes. For files kvdiff writes only to hand to something else (a rows file to hash, a model
// directory for an engine plugin).
#pragma once

#include <filesystem>
#include <string>

namespace kvdiff::format {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& purpose = "scratch");
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int slot_ = -1;  // in the registry RemoveLiveScratchDirs reads; -1 when it was full
};

// Removes the files of every ScratchDir still alive, then the folders, without allocating or
// locking: for an exit handler, which may run while another thread holds the allocator's lock (an
// engine under test that calls exit() in kvdiff's process), where no destructor will run. The
// folders' own subfolders are left (kvdiff writes none).
void RemoveLiveScratchDirs() noexcept;

}  // namespace kvdiff::format
