// The bad-input catalogue (bad_input_catalogue.txt): every way of feeding kvdiff a bad input that
// docs/bad-input.md lists, run through the binary. Each case builds its files in a
// fresh directory, runs one command, and expects an exit code and a fragment of the message on
// stderr; a crash or a hang is a failure (the exit code is then not the expected one). The table in
// docs/bad-input.md is generated from the same file and must equal it
// (Catalogue.ReadmeTableMatches).
//
// The file: cases separated by blank lines, one directive per line ("key: value"), "#" comments.
//   case: TEXT          what is refused (the table's first column)
//   needs: ref          skip unless the build has the LibTorch reference
//   needs: data         skip unless the shared data (@DATA@: ../shared/data) is there
//   needs: llamacpp     skip unless the build has the llama.cpp backend
//   env: NAME=VALUE     set for the setup and the command (e.g. KVDIFF_GGUF_CACHE=cache)
//   file: NAME = TEXT   write TEXT (macros below) to NAME
//   copy: SRC DST       copy a file or directory; SRC may start with @SRC@ (the repository)
//   config: DIR = JSON  DIR: the tiny model with JSON merged into its config.json (null deletes)
//   st: NAME +N = JSON  a safetensors file: JSON as its header, then N zero bytes
//   sparse: NAME BYTES  a sparse file of that size; fifo: NAME; dir: NAME; remove: NAME
//   cut: NAME BYTES     truncate a file to that size
//   edit: FILE = OLD => NEW   replace the first OLD by NEW in FILE (both may use macros; FILE may
//                       be DIR/*.EXT, the one file of DIR with that extension)
//   setup: ARGS         run kvdiff ARGS first (exit code ignored)
//   run: ARGS           the command under test;  exit: N;  expect: FRAGMENT (on stderr; with
//                       exit 1, a failure, on stdout or stderr)
// Macros: @BROKEN@ is the deliberately broken plugin (tests/engines/broken_plugin.c);
// @DEEP:N@ is N '[' then N ']'; @REPEAT:N:TEXT@ is TEXT N times joined by ",";
// @TIMES:N:TEXT@ is TEXT N times (TEXT without '@'); @HEX:0a0b@ the bytes written in hex;
// @ENGINES@ the folder of tests/engines' misbehaving plugins; @EXAMPLE_ENGINE@ the example plugin.
// Every case directory starts with tiny/ (make-model --preset tiny --seed 3) and nan/ (the same
// with a NaN final norm, so every logit is NaN).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "format/affixes.h"
#include "format/model_files.h"
#include "format/safetensors.h"
#include "harness/backend/registry.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

const fs::path kCatalogue = fs::path(KVDIFF_SOURCE_DIR) / "tests/harness/bad_input_catalogue.txt";

struct Case {
  std::string name;
  std::vector<std::pair<std::string, std::string>> directives;  // in order
  std::string run, expect;
  int exit = -1;
  bool needs_ref = false;
  bool needs_data = false;
  bool needs_llamacpp = false;
  std::vector<std::pair<std::string, std::string>> env;
  int line = 0;
};

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<Case> ReadCatalogue() {
  std::ifstream in(kCatalogue);
  std::vector<Case> cases;
  Case current;
  std::string line;
  int number = 0;
  auto flush = [&] {
    if (!current.name.empty()) cases.push_back(current);
    current = Case{};
  };
  while (std::getline(in, line)) {
    ++number;
    if (Trim(line).empty()) {
      flush();
      continue;
    }
    if (line[0] == '#') continue;
    const size_t colon = line.find(": ");
    if (colon == std::string::npos) throw std::runtime_error("bad catalogue line " + line);
    const std::string key = line.substr(0, colon), value = Trim(line.substr(colon + 2));
    if (key == "case") {
      current.name = value;
      current.line = number;
    } else if (key == "run") {
      current.run = value;
    } else if (key == "exit") {
      current.exit = std::stoi(value);
    } else if (key == "expect") {
      current.expect = value;
    } else if (key == "needs") {
      current.needs_ref = current.needs_ref || value == "ref";
      current.needs_data = current.needs_data || value == "data";
      current.needs_llamacpp = current.needs_llamacpp || value == "llamacpp";
    } else if (key == "env") {
      const size_t eq = value.find('=');
      if (eq == std::string::npos) throw std::runtime_error("expected NAME=VALUE: " + value);
      current.env.emplace_back(value.substr(0, eq), value.substr(eq + 1));
    } else {
      current.directives.emplace_back(key, value);
    }
  }
  flush();
  return cases;
}

fs::path DataDir() { return SharedDataDir().value_or(fs::path("/nonexistent")); }

std::string Expand(std::string text) {
  for (size_t at; (at = text.find("@DEEP:")) != std::string::npos;) {
    const size_t end = text.find('@', at + 1);
    const size_t n = std::stoul(text.substr(at + 6, end - at - 6));
    text = text.substr(0, at) + std::string(n, '[') + std::string(n, ']') + text.substr(end + 1);
  }
  for (const auto& [macro, separator] : {std::pair{std::string("@REPEAT:"), std::string(",")},
                                         std::pair{std::string("@TIMES:"), std::string()}}) {
    for (size_t at; (at = text.find(macro)) != std::string::npos;) {
      const size_t count_at = at + macro.size();
      const size_t colon = text.find(':', count_at);
      const size_t end = text.find('@', colon);
      const size_t n = std::stoul(text.substr(count_at, colon - count_at));
      const std::string item = text.substr(colon + 1, end - colon - 1);
      std::string joined;
      joined.reserve(n * (item.size() + separator.size()));
      for (size_t i = 0; i < n; ++i) joined += (i ? separator : "") + item;
      text = text.substr(0, at) + joined + text.substr(end + 1);
    }
  }
  for (size_t at; (at = text.find("@HEX:")) != std::string::npos;) {
    const size_t end = text.find('@', at + 5);
    std::string bytes;
    for (size_t i = at + 5; i + 1 < end; i += 2)
      bytes += static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16));
    text = text.substr(0, at) + bytes + text.substr(end + 1);
  }
  size_t at;
  while ((at = text.find("@SRC@")) != std::string::npos) text.replace(at, 5, KVDIFF_SOURCE_DIR);
  while ((at = text.find("@ENGINES@")) != std::string::npos)
    text.replace(at, 9, KVDIFF_TEST_ENGINES_DIR);
  while ((at = text.find("@EXAMPLE_ENGINE@")) != std::string::npos)
    text.replace(at, 16, KVDIFF_EXAMPLE_ENGINE);
  while ((at = text.find("@DATA@")) != std::string::npos) text.replace(at, 6, DataDir().string());
  while ((at = text.find("@BROKEN@")) != std::string::npos) {
    text.replace(at, 8, KVDIFF_BROKEN_ENGINE);
  }
  return text;
}

// "NAME = VALUE" -> {NAME, VALUE}.
std::pair<std::string, std::string> Split(const std::string& value, const std::string& sep) {
  const size_t at = value.find(sep);
  if (at == std::string::npos) throw std::runtime_error("expected '" + sep + "' in " + value);
  return {Trim(value.substr(0, at)), Trim(value.substr(at + sep.size()))};
}

// RunKvdiff under `timeout 120`: a hang fails the case (exit 124) instead of the suite. Its
// temporary directory is `tmp`, made empty in `dir`.
CommandResult RunBounded(const std::string& args, const fs::path& dir) {
  fs::create_directories(dir / "tmp");
  const std::string cmd = "cd '" + dir.string() + "' && TMPDIR='" + (dir / "tmp").string() +
                          "' timeout 120 '" KVDIFF_BINARY "' " + args + " >stdout.txt 2>stderr.txt";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(dir / "stdout.txt");
  r.err = ReadFile(dir / "stderr.txt");
  return r;
}

class Catalogue : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixtures_ = new fs::path(fs::temp_directory_path() /
                             ("kvdiff-catalogue-" + std::to_string(::getpid())));
    fs::create_directories(*fixtures_);
    ASSERT_EQ(RunKvdiff("make-model --preset tiny --seed 3 --out tiny", *fixtures_).exit_code, 0);
    format::ModelWeights weights = format::LoadModel(*fixtures_ / "tiny");
    auto& norm = weights.tensors.at("model.norm.weight").data;
    std::fill(norm.begin(), norm.end(), std::numeric_limits<float>::quiet_NaN());
    format::SaveModel(*fixtures_ / "nan", weights, format::DType::kF32);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*fixtures_);
    delete fixtures_;
  }
  static fs::path* fixtures_;
};
fs::path* Catalogue::fixtures_ = nullptr;

// NAME, or the one file of DIR ending in EXT for "DIR/*EXT".
fs::path Resolve(const fs::path& dir, const std::string& name) {
  const size_t star = name.find("/*");
  if (star == std::string::npos) return dir / name;
  const std::string ext = name.substr(star + 2);
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir / name.substr(0, star))) {
    const std::string file = entry.path().string();
    if (format::EndsWith(file, ext)) found.push_back(entry.path());
  }
  if (found.size() != 1) throw std::runtime_error(name + ": expected exactly one match");
  return found[0];
}

void Build(const Case& c, const fs::path& dir) {
  for (const auto& [key, value] : c.directives) {
    if (key == "file") {
      const auto [name, text] = Split(value, " = ");
      WriteFile(dir / name, Expand(text));
    } else if (key == "copy") {
      const auto [src, dst] = Split(value, " ");
      fs::copy(Expand(src), dir / dst, fs::copy_options::recursive);
    } else if (key == "config") {
      const auto [name, patch] = Split(value, " = ");
      fs::copy(dir / "tiny", dir / name, fs::copy_options::recursive);
      json config = json::parse(ReadFile(dir / name / "config.json"));
      config.merge_patch(json::parse(patch));
      WriteFile(dir / name / "config.json", config.dump());
    } else if (key == "st") {
      const auto [lhs, header] = Split(value, " = ");
      const auto [name, extra] = Split(lhs, " +");
      std::string h = Expand(header);
      const uint64_t n = h.size();
      std::string bytes(reinterpret_cast<const char*>(&n), 8);
      WriteFile(dir / name, bytes + h + std::string(std::stoul(extra), '\0'));
    } else if (key == "sparse") {
      const auto [name, size] = Split(value, " ");
      WriteFile(dir / name, "");
      fs::resize_file(dir / name, std::stoull(size));
    } else if (key == "cut") {
      const auto [name, size] = Split(value, " ");
      fs::resize_file(dir / name, std::stoull(size));
    } else if (key == "fifo") {
      ASSERT_EQ(::mkfifo((dir / value).c_str(), 0600), 0);
    } else if (key == "remove") {
      fs::remove_all(dir / value);
    } else if (key == "dir") {
      fs::create_directories(dir / value);
    } else if (key == "edit") {
      const auto [file, change] = Split(value, " = ");
      const auto [old_text, new_text] = Split(change, " => ");
      const fs::path path = Resolve(dir, file);
      std::string text = ReadFile(path);
      const size_t at = text.find(Expand(old_text));
      ASSERT_NE(at, std::string::npos) << c.name << ": " << old_text << " not in " << file;
      text.replace(at, Expand(old_text).size(), Expand(new_text));
      WriteFile(path, text);
    } else if (key == "setup") {
      RunKvdiff(Expand(value), dir);
    } else {
      FAIL() << "catalogue line " << c.line << ": unknown directive " << key;
    }
  }
}

TEST_F(Catalogue, HasAtLeastSixtyCases) { EXPECT_GE(ReadCatalogue().size(), 60u); }

// The catalogue's ~190 commands take about 140 s on 2 cores: one test would end a parallel ctest
// run alone, so every kShards-th case is one shard, and the shards are separate ctest entries.
constexpr int kShards = 4;
class CatalogueShard : public Catalogue, public ::testing::WithParamInterface<int> {};

TEST_P(CatalogueShard, EveryCaseIsRefusedAsListed) {
  const auto have = [](const std::string& backend) {
    for (const auto& n : harness::BackendRegistry::Global().Names())
      if (n == backend) return true;
    return false;
  };
  const bool have_ref = have("ref"), have_llamacpp = have("llama.cpp");
  // KVDIFF_CATALOGUE_CASE=TEXT runs only the cases whose name holds TEXT (to rerun one).
  const char* only = std::getenv("KVDIFF_CATALOGUE_CASE");
  int index = 0;
  for (const Case& c : ReadCatalogue()) {
    ++index;
    if (index % kShards != GetParam()) continue;
    if (only && c.name.find(only) == std::string::npos) continue;
    if (c.needs_ref && !have_ref) continue;
    if (c.needs_data && !fs::exists(DataDir() / "stories260K")) continue;
    if (c.needs_llamacpp && !have_llamacpp) continue;
    SCOPED_TRACE(c.name + " (catalogue line " + std::to_string(c.line) + ")");
    const fs::path dir = *fixtures_ / ("case" + std::to_string(index));
    fs::create_directories(dir);
    fs::copy(*fixtures_ / "tiny", dir / "tiny", fs::copy_options::recursive);
    fs::copy(*fixtures_ / "nan", dir / "nan", fs::copy_options::recursive);
    for (const auto& [name, value] : c.env) ::setenv(name.c_str(), value.c_str(), 1);
    Build(c, dir);
    const CommandResult r = RunBounded(Expand(c.run), dir);
    for (const auto& [name, value] : c.env) ::unsetenv(name.c_str());
    EXPECT_EQ(r.exit_code, c.exit) << "kvdiff " << c.run << "\nstderr: " << r.err.substr(0, 2000);
    // Refusals (exit 2) are one line on stderr; a failure (exit 1) may be in the report on stdout.
    EXPECT_THAT(c.exit == 1 ? r.out + r.err : r.err, HasSubstr(c.expect)) << "kvdiff " << c.run;
    // Whatever ended the run (a refusal, an engine's crash, hang or exit() in kvdiff's process),
    // kvdiff's scratch folders (an engine's model copy, 538 MB for smollm2) are gone.
    for (const auto& left : fs::directory_iterator(dir / "tmp"))
      ADD_FAILURE() << "kvdiff " << c.run << " left " << left.path().filename() << " in TMPDIR";
    fs::remove_all(dir);
  }
}
INSTANTIATE_TEST_SUITE_P(Of4, CatalogueShard, ::testing::Range(0, kShards));

// The table of docs/bad-input.md, generated from the catalogue:
// | what is refused | command | exit | message |.
std::string MarkdownTable() {
  auto cell = [](std::string s) {
    for (size_t at = 0; (at = s.find('|', at)) != std::string::npos; at += 2)
      s.replace(at, 1, "\\|");
    return s;
  };
  std::string out = "| refused | command | exit | the message says |\n|---|---|---|---|\n";
  for (const Case& c : ReadCatalogue()) {
    std::string run = c.run.size() > 70 ? c.run.substr(0, 67) + "..." : c.run;
    out += "| " + cell(c.name) + (c.needs_ref ? " (with LibTorch)" : "") +
           (c.needs_data ? " (shared data)" : "") + (c.needs_llamacpp ? " (with llama.cpp)" : "") +
           " | `kvdiff " + cell(run) + "` | " + std::to_string(c.exit) + " | " + cell(c.expect) +
           " |\n";
  }
  return out;
}

TEST_F(Catalogue, ReadmeTableMatches) {
  const std::string readme = ReadFile(fs::path(KVDIFF_SOURCE_DIR) / "docs" / "bad-input.md");
  const std::string begin =
      "<!-- bad-input-catalogue: generated from tests/harness/bad_input_catalogue.txt -->\n";
  const std::string end = "<!-- end of bad-input-catalogue -->";
  const size_t b = readme.find(begin), e = readme.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/bad-input.md lacks the catalogue markers";
  ASSERT_NE(e, std::string::npos);
  const std::string table = readme.substr(b + begin.size(), e - b - begin.size());
  EXPECT_EQ(table, MarkdownTable()) << "paste this table into docs/bad-input.md:\n"
                                    << MarkdownTable();
}

}  // namespace
}  // namespace kvdiff::testing
