// ScratchDir: a fresh folder per object, removed with its files when the object goes, and by
// RemoveLiveScratchDirs (the exit guard's call) while it is still alive.
#include "format/scratch_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

namespace {

namespace fs = std::filesystem;

TEST(ScratchDir, EachObjectHasItsOwnFolderRemovedWithItsFilesWhenItGoes) {
  fs::path kept;
  {
    const kvdiff::format::ScratchDir a("test"), b("test");
    ASSERT_TRUE(fs::is_directory(a.path()));
    EXPECT_NE(a.path(), b.path());
    EXPECT_NE(a.path().filename().string().find("kvdiff-test-"), std::string::npos);
    std::ofstream(a.path() / "model.safetensors") << "bytes";
    kept = a.path();
  }
  EXPECT_FALSE(fs::exists(kept));
}

TEST(ScratchDir, RemoveLiveScratchDirsEmptiesAndRemovesEveryLiveFolder) {
  std::vector<std::unique_ptr<kvdiff::format::ScratchDir>> live;
  for (int i = 0; i < 70; ++i) {  // more than the registry's 64 slots: the rest are left alone
    live.push_back(std::make_unique<kvdiff::format::ScratchDir>("test"));
    for (const char* name : {"config.json", "model.safetensors"})
      std::ofstream(live.back()->path() / name) << "bytes";
  }
  kvdiff::format::RemoveLiveScratchDirs();
  int removed = 0;
  for (const auto& dir : live) removed += !fs::exists(dir->path());
  EXPECT_EQ(removed, 64);
  live.clear();  // the destructors meet removed folders and the 6 others: no error, none left
  // A slot freed by a destructor serves the next folder.
  const kvdiff::format::ScratchDir next("test");
  std::ofstream(next.path() / "f") << "x";
  kvdiff::format::RemoveLiveScratchDirs();
  EXPECT_FALSE(fs::exists(next.path()));
}

}  // namespace
