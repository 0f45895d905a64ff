// kvdiff golden verify / regen through the binary, on copies of the shipped golden/ folder in
// temporary directories (the source tree is never written): exit codes, an edited value named by
// file and row, stale goldens, regen that leaves unchanged files alone (bytes and mtime), --check,
// the refusal to pin a self-inconsistent backend, and a regen killed midway.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

namespace fs = std::filesystem;

const fs::path kGoldenSource = fs::path(KVDIFF_SOURCE_DIR) / "golden";

#ifdef KVDIFF_HAVE_TORCH
constexpr bool kHaveTorch = true;
#else
constexpr bool kHaveTorch = false;
#endif

// Copies golden/ (or some of its sets) to root/repo/golden and links root/shared/data to the
// shared data, so the stories260K scenarios' "../../../shared/data" paths resolve as in the tree.
fs::path CopyGolden(const fs::path& root, const std::vector<std::string>& sets = {}) {
  const fs::path dest = root / "repo" / "golden";
  fs::create_directories(dest);
  for (const auto& entry : fs::directory_iterator(kGoldenSource)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory()) continue;
    if (!sets.empty() && std::find(sets.begin(), sets.end(), name) == sets.end()) continue;
    fs::copy(entry.path(), dest / name, fs::copy_options::recursive);
  }
  if (auto data = SharedDataDir()) {
    fs::create_directories(root / "shared");
    fs::create_directory_symlink(fs::absolute(*data), root / "shared" / "data");
  }
  return dest;
}

struct FileState {
  std::string bytes;
  fs::file_time_type mtime;
};

// Every golden output file under dir (not the scenarios, not temporary files).
std::map<fs::path, FileState> Snapshot(const fs::path& dir) {
  std::map<fs::path, FileState> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name[0] == '.' || name.find(".golden.") == std::string::npos)
      continue;
    out[e.path()] = {ReadFile(e.path()), fs::last_write_time(e.path())};
  }
  return out;
}

// Sets every golden file's mtime to a fixed past time, so a rewrite is seen even within a second.
[[maybe_unused]] void AgeFiles(const fs::path& dir) {
  const auto past = fs::file_time_type::clock::now() - std::chrono::hours(24 * 365);
  for (const auto& [path, state] : Snapshot(dir)) fs::last_write_time(path, past);
}

// Replaces the first logit of the top-k of the row (step, row) in a golden file's text.
std::string EditTopLogit(const std::string& text, int step, int row, float delta) {
  const std::string key =
      "{\"step\": " + std::to_string(step) + ", \"row\": " + std::to_string(row) + ",";
  const size_t line = text.find(key);
  EXPECT_NE(line, std::string::npos) << key;
  const size_t at = text.find("\"top_k\": [[", line) + 11;
  const size_t comma = text.find(", ", at) + 2;
  const size_t end = text.find(']', comma);
  const float value = std::stof(text.substr(comma, end - comma)) + delta;
  std::string out = text;
  return out.replace(comma, end - comma, std::to_string(value));
}

std::string BackendsArg() { return kHaveTorch ? "--backends impl,ref" : "--backends impl"; }

TEST(GoldenCli, EditedValueFailsVerifyNamingFileAndRow) {
  TempDir dir;
  const fs::path golden = CopyGolden(dir.path(), {"tiny"});
  const fs::path file = golden / "tiny" / "fork.golden.json";
  WriteFile(file, EditTopLogit(ReadFile(file), 4, 1, 0.01f));

  const auto r = RunKvdiff("golden verify repo/golden --backends impl --json v.json --junit v.xml",
                           dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("repo/golden/tiny/fork.golden.json: impl differs from the golden (made "
                       "with ref64) at step 4 decode(side,n=4), row 1 (conversation side"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(golden rank 1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL: 1 of 5 golden sets failed"), std::string::npos) << r.out;

  const auto report = nlohmann::json::parse(ReadFile(dir / "v.json"));
  EXPECT_EQ(report["exit_code"], 1);
  bool found = false;
  for (const auto& s : report["sets"]) {
    if (s["golden"] != "repo/golden/tiny/fork.golden.json") {
      EXPECT_TRUE(s["passed"].get<bool>()) << s.dump();
      continue;
    }
    found = true;
    EXPECT_EQ(s["checks"][0]["first_mismatch"]["step"], 4);
    EXPECT_EQ(s["checks"][0]["first_mismatch"]["row"], 1);
    EXPECT_EQ(s["checks"][0]["first_mismatch"]["conversation"], "side");
  }
  EXPECT_TRUE(found);
  const std::string xml = ReadFile(dir / "v.xml");
  EXPECT_EQ(XmlProblem(xml, nullptr), "");
  EXPECT_EQ(XmlAttribute(xml, "testsuites", "failures"), "1");
  EXPECT_NE(xml.find("step 4 decode(side,n=4), row 1"), std::string::npos) << xml;
}

TEST(GoldenCli, VerifyPassesOnACopyAndRefusesWhatItCannotRead) {
  TempDir dir;
  const fs::path golden = CopyGolden(dir.path(), {"tiny"});
  auto r =
      RunKvdiff("golden verify repo/golden/tiny/reset.json repo/golden/tiny/fork.golden.json " +
                    BackendsArg(),
                dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("PASS: 0 of 2 golden sets failed"), std::string::npos) << r.out;

  // A scenario edited after its golden was made: stale, exit 1.
  const fs::path scenario = golden / "tiny" / "decode.json";
  std::string text = ReadFile(scenario);
  text.replace(text.find("\"n\": 24"), 7, "\"n\": 23");
  WriteFile(scenario, text);
  r = RunKvdiff("golden verify repo/golden/tiny/decode.json --backends impl", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("stale golden: repo/golden/tiny/decode.json was edited after its golden "
                       "was made"),
            std::string::npos)
      << r.out;

  // A rows file that does not match its golden (as a regen killed between the two writes leaves).
  const fs::path rows = golden / "tiny" / "reset.golden.safetensors";
  std::string bytes = ReadFile(rows);
  bytes.back() ^= 1;
  WriteFile(rows, bytes);
  r = RunKvdiff("golden verify repo/golden/tiny/reset.json --backends impl", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("does not match the rows_sha256"), std::string::npos) << r.out;

  // No golden at all, and a golden cut short: bad input, exit 2.
  WriteFile(golden / "tiny" / "new.json", ReadFile(golden / "tiny" / "fork.json"));
  r = RunKvdiff("golden verify repo/golden/tiny/new.json --backends impl", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("no golden file; create it with `kvdiff golden regen"), std::string::npos)
      << r.out;
  const fs::path cut = golden / "tiny" / "truncate.golden.json";
  WriteFile(cut, ReadFile(cut).substr(0, 900));
  r = RunKvdiff("golden verify repo/golden/tiny/truncate.json --backends impl", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("truncate.golden.json: invalid JSON"), std::string::npos) << r.out;

  r = RunKvdiff("golden verify repo/golden/nothing-here", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no such file or folder"), std::string::npos) << r.err;
}

TEST(GoldenCli, RegenRefusesABackendThatDisagreesWithItself) {
  // The pos0 driver feeds every call at position 0 (the seed's bug): impl's cached rows then
  // differ from its own uncached forward, and that must never become a golden.
  TempDir dir;
  std::string text = ReadFile(kGoldenSource / "tiny" / "decode.json");
  text.replace(text.find("\"tolerance\""), 0, "\"driver\": \"pos0\", ");
  WriteFile(dir / "pos0.json", text);
  const auto r = RunKvdiff("golden regen pos0.json --backend impl", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("pos0.golden.json: REFUSED: backend impl disagrees with itself: at step 1 "
                       "decode(main,n=24) row 0 (conversation main, position 1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("a golden must never pin a bug"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "pos0.golden.json"));
  EXPECT_FALSE(fs::exists(dir / "pos0.golden.safetensors"));
}

TEST(GoldenCli, RegenCreatesAGoldenDeterministically) {
  // A new scenario gets a golden (with impl here, so this runs without LibTorch too); a second
  // regen of a fresh copy writes the same bytes.
  TempDir dir;
  const std::string text = ReadFile(kGoldenSource / "tiny" / "fork.json");
  for (const char* sub : {"a", "b"}) {
    fs::create_directories(dir / sub);
    WriteFile(dir / sub / "f.json", text);
    const auto r = RunKvdiff(std::string("golden regen ") + sub + " --backend impl", dir.path());
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("written: new golden (23 rows)"), std::string::npos) << r.out;
  }
  EXPECT_EQ(ReadFile(dir / "a" / "f.golden.json"), ReadFile(dir / "b" / "f.golden.json"));
  EXPECT_EQ(ReadFile(dir / "a" / "f.golden.safetensors"),
            ReadFile(dir / "b" / "f.golden.safetensors"));
  const std::string golden = ReadFile(dir / "a" / "f.golden.json");
  EXPECT_NE(golden.find("\"regenerate\": \"kvdiff golden regen f.json --backend impl\""),
            std::string::npos);
  EXPECT_NE(golden.find("\"dtype\": \"float32\""), std::string::npos);
  // And it verifies against impl.
  const auto v = RunKvdiff("golden verify a --backends impl", dir.path());
  EXPECT_EQ(v.exit_code, 0) << v.out;
}

#ifdef KVDIFF_HAVE_TORCH

TEST(GoldenCli, RegenOfAnUnchangedTreeTouchesNothing) {
  TempDir dir;
  // smollm2-135m is left to the golden_regen_check test, which checks the source tree itself.
  const fs::path golden = CopyGolden(dir.path(), {"tiny", "stories260K"});
  AgeFiles(golden);
  const auto before = Snapshot(golden);
  ASSERT_GE(before.size(), 10u);

  auto r = RunKvdiff("golden regen repo/golden --check", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  r = RunKvdiff("golden regen repo/golden", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("repo/golden/tiny/fork.golden.json: unchanged: 23 rows, nothing moved"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("written"), std::string::npos) << r.out;
  const auto after = Snapshot(golden);
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [path, state] : before) {
    EXPECT_EQ(after.at(path).bytes, state.bytes) << path;
    EXPECT_TRUE(after.at(path).mtime == state.mtime) << path << " was rewritten";
  }
}

TEST(GoldenCli, CheckReportsAnEditWithoutWritingAndRegenRepairsIt) {
  TempDir dir;
  const fs::path golden = CopyGolden(dir.path(), {"tiny"});
  const fs::path file = golden / "tiny" / "truncate.golden.json";
  const std::string original = ReadFile(file);
  const std::string edited = EditTopLogit(original, 3, 2, -0.25f);
  WriteFile(file, edited);

  auto r = RunKvdiff("golden regen repo/golden --check", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("truncate.golden.json: would change: 1 of 20 rows changed, largest change "
                       "2.5e-01 at step 3 row 2; 0 tokens changed"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("4 unchanged"), std::string::npos) << r.out;
  EXPECT_EQ(ReadFile(file), edited);

  r = RunKvdiff("golden regen repo/golden/tiny/truncate.golden.json", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("truncate.golden.json: written: 1 of 20 rows changed"), std::string::npos)
      << r.out;
  EXPECT_EQ(ReadFile(file), original);
}

#else

TEST(GoldenCli, WithoutTorchRegenRefusesAndVerifyUsesImpl) {
  TempDir dir;
  CopyGolden(dir.path(), {"tiny"});
  auto r = RunKvdiff("golden regen repo/golden/tiny/fork.json", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("made with backend ref64, which this kvdiff lacks"), std::string::npos)
      << r.out;
  r = RunKvdiff("golden verify repo/golden", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("backends impl\n"), std::string::npos) << r.out;
}

#endif

// A regen killed with SIGKILL at several points leaves every golden file either as it was or as
// the finished regen writes it, never partial; and the next regen completes the job.
TEST(GoldenCli, InterruptedRegenLeavesEveryFileOldOrNew) {
  const std::string backend = kHaveTorch ? "" : " --backend impl";
  TempDir dir;
  // "Old": the tiny set with one value edited in every golden and one byte of every rows file.
  const fs::path base = CopyGolden(dir / "base", {"tiny"});
  for (const auto& [path, state] : Snapshot(base)) {
    if (path.extension() == ".json") {
      WriteFile(path, EditTopLogit(state.bytes, 0, 0, 0.5f));
    } else {
      std::string bytes = state.bytes;
      bytes.back() ^= 1;
      WriteFile(path, bytes);
    }
  }
  const auto old_state = Snapshot(base);

  // "New": what a regen that runs to the end writes.
  fs::copy(dir / "base", dir / "full", fs::copy_options::recursive);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = RunKvdiff("golden regen repo/golden" + backend, dir / "full");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::map<fs::path, std::string> new_bytes;
  for (const auto& [path, state] : Snapshot(dir / "full" / "repo" / "golden")) {
    new_bytes[fs::relative(path, dir / "full")] = state.bytes;
  }

  int mixed = 0;
  for (int k = 1; k <= 6; ++k) {
    const fs::path run = dir / ("kill" + std::to_string(k));
    fs::copy(dir / "base", run, fs::copy_options::recursive);
    // The killed regen's scratch folder (RowsFileBytes) is left where it was: in the test's own
    // folder, not the machine's temporary one.
    fs::create_directories(run / "tmp");
    std::vector<std::string> env = {"TMPDIR=" + (run / "tmp").string()};
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string(*e).rfind("TMPDIR=", 0) != 0) env.push_back(*e);
    }
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (chdir(run.c_str()) != 0) _exit(127);
      const int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      std::vector<std::string> args = {KVDIFF_BINARY, "golden", "regen", "repo/golden"};
      if (!kHaveTorch) args.insert(args.end(), {"--backend", "impl"});
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execve(KVDIFF_BINARY, argv.data(), envp.data());
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds * k / 7.0));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);

    int olds = 0, news = 0;
    for (const auto& [path, state] : old_state) {
      const fs::path rel = fs::relative(path, dir / "base");
      const std::string now = ReadFile(run / rel);
      const bool is_old = now == state.bytes;
      const bool is_new = now == new_bytes.at(rel);
      EXPECT_TRUE(is_old || is_new)
          << rel << " is neither the old nor the new version after a kill "
          << "at " << k << "/7 of the run (" << now.size() << " bytes)";
      olds += is_old && !is_new;
      news += is_new && !is_old;
    }
    mixed += olds > 0 && news > 0;
    // Whatever was left, the next regen finishes the job: every file is the new version.
    const auto again = RunKvdiff("golden regen repo/golden" + backend, run);
    EXPECT_EQ(again.exit_code, 0) << again.out << again.err;
    for (const auto& [rel, bytes] : new_bytes) EXPECT_EQ(ReadFile(run / rel), bytes) << rel;
  }
  std::cout << "kills that left old and new files side by side: " << mixed << " of 6\n";
}

}  // namespace
}  // namespace kvdiff::testing
