// The HTML reports of `kvdiff run` and `kvdiff check`, loaded in headless Chromium: the page the
// browser built (its DOM after load) holds the figures, the first divergence marker, and the same
// numbers as the --json report of the same command. A screenshot of each page is kept under
// build/test-artifacts/ for CI to publish. Without chromium these tests FAIL (install it with
// ci/install-deps): a browser test that skips would pass having checked nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// $KVDIFF_CHROMIUM, else chromium on PATH; "" when there is none (or it cannot be run).
std::string FindChromium() {
  if (const char* env = std::getenv("KVDIFF_CHROMIUM")) return access(env, X_OK) == 0 ? env : "";
  std::string path;
  if (FILE* p = popen("command -v chromium 2>/dev/null", "r")) {
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) path += buf;
    pclose(p);
  }
  return path.substr(0, path.find('\n'));
}

// Runs headless Chromium on a page from a file, with a fresh profile and no network chatter (the
// machine's network is closed), within 120 s. dump_dom: the DOM after load, as HTML; else a
// 1200x1600 screenshot into `screenshot`.
std::string Chromium(const fs::path& page, const fs::path& work, const fs::path& screenshot = {}) {
  const std::string chromium = FindChromium();
  if (chromium.empty()) {
    ADD_FAILURE() << "chromium not found: the HTML report's browser tests need Debian's "
                     "chromium (ci/install-deps installs it; KVDIFF_CHROMIUM names another)";
    return "";
  }
  const fs::path profile = work / "chromium-profile";
  const fs::path out = work / "chromium-out.html";
  std::string cmd = "timeout 120 " + ShellQuote(chromium) +
                    " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                    " --disable-background-networking --disable-component-update --disable-sync"
                    " --user-data-dir=" +
                    ShellQuote(profile.string());
  cmd += screenshot.empty()
             ? " --dump-dom"
             : " --window-size=1200,1600 --screenshot=" + ShellQuote(screenshot.string());
  cmd += " " + ShellQuote("file://" + fs::absolute(page).string()) + " >" +
         ShellQuote(out.string()) + " 2>" + ShellQuote((work / "chromium-err.txt").string());
  const int status = std::system(cmd.c_str());
  EXPECT_EQ(status, 0) << cmd << "\n" << ReadFile(work / "chromium-err.txt");
  return ReadFile(out);
}

// The start tag of the element with this id in dom ("" when there is none).
std::string TagWithId(const std::string& dom, const std::string& id) {
  const size_t at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t lt = dom.rfind('<', at), gt = dom.find('>', at);
  return dom.substr(lt, gt - lt + 1);
}

// The attribute's value in the element with this id; fails the test when either is absent.
std::string Attribute(const std::string& dom, const std::string& id, const std::string& name) {
  const std::string tag = TagWithId(dom, id);
  const size_t at = tag.find(" " + name + "=\"");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no element with id " << id << " and attribute " << name << ": " << tag;
    return "";
  }
  const size_t start = at + name.size() + 3;
  return tag.substr(start, tag.find('"', start) - start);
}

double Figure(const std::string& dom, const std::string& id) {
  const std::string v = Attribute(dom, id, "data-value");
  return v.empty() ? -1 : std::stod(v);
}

// Every start tag in dom that begins with `prefix` ("<rect class=\"cell"), in order.
std::vector<std::string> TagsStartingWith(const std::string& dom, const std::string& prefix) {
  std::vector<std::string> tags;
  for (size_t at = dom.find(prefix); at != std::string::npos; at = dom.find(prefix, at + 1)) {
    tags.push_back(dom.substr(at, dom.find('>', at) - at + 1));
  }
  return tags;
}

// The attribute's value in one start tag ("" when absent).
std::string AttributeOf(const std::string& tag, const std::string& name) {
  const size_t at = tag.find(" " + name + "=\"");
  if (at == std::string::npos) return "";
  const size_t start = at + name.size() + 3;
  return tag.substr(start, tag.find('"', start) - start);
}

// The --localize map in the page holds the JSON report's matrix, cell for cell, outlines its first
// cell and marks the first divergence's position. Returns how many cells were within the tolerance.
size_t ExpectMapIsTheJsons(const std::string& dom, const nlohmann::json& j) {
  EXPECT_THAT(TagWithId(dom, "localization-map"), HasSubstr("<svg"));
  const auto& map = j.at("localization").at("map");
  std::map<std::pair<std::string, std::string>, std::string> cells;  // (row, column) -> value
  for (const std::string& tag : TagsStartingWith(dom, "<rect class=\"cell")) {
    cells[{AttributeOf(tag, "data-row"), AttributeOf(tag, "data-column")}] =
        AttributeOf(tag, "data-value");
  }
  const auto& columns = map.at("columns");
  const double tolerance = j.at("tolerance").at("abs").get<double>();
  size_t checked = 0, within = 0;
  for (const char* block : {"attention", "mlp"}) {
    const auto& matrix = map.at(std::string(block) + "_max_abs_diff");
    EXPECT_EQ(matrix.size(), j.at("model").at("config").at("num_hidden_layers").get<size_t>());
    for (size_t l = 0; l < matrix.size(); ++l) {
      EXPECT_EQ(matrix[l].size(), columns.size());
      for (size_t c = 0; c < columns.size() && c < matrix[l].size(); ++c) {
        const std::string row = "layer " + std::to_string(l) + " " + block;
        const std::string column = std::to_string(columns[c].at("position").get<int>());
        const auto it = cells.find({row, column});
        if (it == cells.end()) {
          ADD_FAILURE() << "no cell for " << row << ", position " << column;
          continue;
        }
        EXPECT_EQ(std::stod(it->second), matrix[l][c].get<double>()) << row << ", " << column;
        within += matrix[l][c].get<double>() <= tolerance ? 1 : 0;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, cells.size()) << "no cell beyond the JSON's";
  const auto& first = map.at("first_cell");
  EXPECT_EQ(Attribute(dom, "localization-map-highlight", "data-row"),
            "layer " + std::to_string(first.at("layer").get<int>()) + " " +
                first.at("block").get<std::string>());
  EXPECT_EQ(Attribute(dom, "localization-map-highlight", "data-column"),
            std::to_string(first.at("position").get<int>()));
  EXPECT_EQ(Attribute(dom, "localization-map-marked-column", "data-column"),
            std::to_string(j.at("first_divergence").at("position").get<int>()));
  EXPECT_THAT(dom, HasSubstr("class=\"colour-scale\""));
  return within;
}

fs::path Artifacts() {
  const fs::path dir = KVDIFF_TEST_ARTIFACTS;
  fs::create_directories(dir);
  return dir;
}

TEST(HtmlReportBrowser, FailingRunShowsItsDivergenceAndTheJsonFigures) {
  TempDir dir;
  const std::string scenario = KVDIFF_SOURCE_DIR "/examples/repro/pos0-tiny.json";
  const auto r = RunKvdiff(
      "run " + ShellQuote(scenario) + " --threads 1 --localize --json out.json --html page.html",
      dir.path());
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto j = nlohmann::json::parse(ReadFile(dir / "out.json"));
  const std::string dom = Chromium(dir / "page.html", dir.path());
  ASSERT_FALSE(dom.empty());
  // The pictures: |a-b| against position with the gate and the first divergence, the layer map.
  EXPECT_THAT(TagWithId(dom, "diff-chart"), HasSubstr("<svg"));
  EXPECT_NE(TagWithId(dom, "diff-chart-gate"), "");
  EXPECT_THAT(TagWithId(dom, "first-divergence"), HasSubstr("class=\"marker\""));
  EXPECT_THAT(TagWithId(dom, "localization-map"), HasSubstr("<svg"));
  EXPECT_THAT(dom, HasSubstr("class=\"cell highlight\""));
  ExpectMapIsTheJsons(dom, j);
  // The numbers shown are the JSON report's.
  EXPECT_THAT(TagWithId(dom, "verdict"), HasSubstr("fail"));
  EXPECT_EQ(Figure(dom, "worst-diff"), j.at("worst_diff").get<double>());
  EXPECT_EQ(Figure(dom, "rows-compared"), j.at("rows_compared").get<double>());
  EXPECT_EQ(Figure(dom, "tolerance"), j.at("tolerance").at("abs").get<double>());
  const auto& d = j.at("first_divergence");
  EXPECT_EQ(Figure(dom, "first-divergence-step"), d.at("step").get<double>());
  EXPECT_EQ(Figure(dom, "first-divergence-position"), d.at("position").get<double>());
  EXPECT_EQ(Figure(dom, "first-divergence-diff"),
            d.at("comparison").at("max_abs_diff").get<double>());
  EXPECT_EQ(std::stod(Attribute(dom, "first-divergence", "data-x")),
            d.at("position").get<double>());
  // The failing step's row of the table is marked failed.
  const std::string step = "data-step=\"" + std::to_string(d.at("step").get<int>()) + "\"";
  const size_t row = dom.find(step);
  ASSERT_NE(row, std::string::npos) << step;
  EXPECT_THAT(dom.substr(dom.rfind("<tr", row), row - dom.rfind("<tr", row)), HasSubstr("failed"));
  const fs::path png = Artifacts() / "run-report.png";
  fs::remove(png);
  Chromium(dir / "page.html", dir.path(), png);
  EXPECT_TRUE(fs::exists(png) && fs::file_size(png) > 1000) << png;
}

// A map with both colours: under pos0 a prompt fed in chunks 3, 1, 1, 1, 1 is right at positions
// 0-2 and wrong from 3 on, where the map must start (layer 0 attention: RoPE at the wrong
// position).
TEST(HtmlReportBrowser, LocalizationMapShowsWhereInDepthAndTimeTheDivergenceStarts) {
  TempDir dir;
  WriteFile(dir / "chunks.json", R"({"model": {"preset": "tiny", "seed": 3}, "driver": "pos0",
    "backends": ["impl"],
    "steps": [{"op": "prefill", "tokens": [5, 17, 3, 99, 42, 7, 8], "chunks": [3, 1, 1, 1, 1]}]})");
  const auto r = RunKvdiff(
      "run chunks.json --threads 1 --localize --json out.json --html page.html", dir.path());
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto j = nlohmann::json::parse(ReadFile(dir / "out.json"));
  const std::string dom = Chromium(dir / "page.html", dir.path());
  ASSERT_FALSE(dom.empty());
  const auto& map = j.at("localization").at("map");
  ASSERT_EQ(map.at("columns").size(), 7u) << "one column per row of the step's five calls";
  EXPECT_EQ(map.at("first_cell").at("position"), 3);
  EXPECT_EQ(map.at("first_cell").at("layer"), 0);
  EXPECT_EQ(map.at("first_cell").at("block"), "attention");
  const size_t layers = j.at("model").at("config").at("num_hidden_layers").get<size_t>();
  EXPECT_EQ(ExpectMapIsTheJsons(dom, j), 2 * layers * 3) << "positions 0-2 within, in every block";
  EXPECT_EQ(Attribute(dom, "localized-start", "data-position"), "3");
  const fs::path png = Artifacts() / "run-report-localization.png";
  fs::remove(png);
  Chromium(dir / "page.html", dir.path(), png);
  EXPECT_TRUE(fs::exists(png) && fs::file_size(png) > 1000) << png;
}

TEST(HtmlReportBrowser, FailingCheckShowsItsCasesCoverageAndTheJsonFigures) {
  TempDir dir;
  const auto r = RunKvdiff(
      "check --cases 4 --seed 1 --jobs 1 --shrink 1 --shrink-seconds 20 --batch-percent 60 "
      "--backends 'impl,impl?fault=batch-shared-positions' --out-dir fails --json out.json "
      "--html page.html",
      dir.path());
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto j = nlohmann::json::parse(ReadFile(dir / "out.json"));
  const std::string dom = Chromium(dir / "page.html", dir.path());
  ASSERT_FALSE(dom.empty());
  for (const char* id : {"coverage-lengths", "coverage-call-sizes", "coverage-ops",
                         "coverage-batches", "coverage-deep", "coverage-boundaries"}) {
    EXPECT_THAT(TagWithId(dom, id), HasSubstr("<svg")) << id;
  }
  EXPECT_THAT(TagWithId(dom, "verdict"), HasSubstr("fail"));
  EXPECT_EQ(Figure(dom, "failures"), j.at("failures").get<double>());
  EXPECT_EQ(Figure(dom, "rows-compared"), j.at("rows_compared").get<double>());
  EXPECT_EQ(Figure(dom, "worst-diff"), j.at("worst_diff").get<double>());
  // Every failing case is listed with the file that replays it; the first, shrunk, with its own.
  bool shrunk_shown = false;
  for (const auto& c : j.at("results")) {
    if (c.at("passed").get<bool>()) continue;
    EXPECT_THAT(dom, HasSubstr("data-case=\"" + std::to_string(c.at("case").get<int>()) + "\""));
    EXPECT_THAT(dom, HasSubstr(c.at("scenario_file").get<std::string>()));
    if (c.contains("shrunk")) {
      EXPECT_THAT(dom, HasSubstr(c.at("shrunk").at("scenario_file").get<std::string>()));
      shrunk_shown = true;
    }
  }
  EXPECT_TRUE(shrunk_shown) << "the first failing case is shrunk (--shrink 1)";
  // The ops histogram's bars are the JSON coverage's counts.
  for (const auto& [op, count] : j.at("coverage").at("ops").items()) {
    EXPECT_THAT(dom, HasSubstr("data-category=\"" + op + "\" data-series=\"count\" data-value=\"" +
                               std::to_string(count.get<int>()) + "\""))
        << op;
  }
  const fs::path png = Artifacts() / "check-report.png";
  fs::remove(png);
  Chromium(dir / "page.html", dir.path(), png);
  EXPECT_TRUE(fs::exists(png) && fs::file_size(png) > 1000) << png;
}

}  // namespace
}  // namespace kvdiff::testing
