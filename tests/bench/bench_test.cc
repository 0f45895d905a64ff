// kvdiff bench: what it writes and how it fails, never how fast anything is (times are only
// checked to be positive numbers). A tiny model with 1024 positions keeps every run short.
#include "bench/bench.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <nlohmann/json.hpp>

#include "format/error.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// The tiny preset, but with room for the 513 positions the figures decode at.
std::filesystem::path MakeTinyModel(const TempDir& dir) {
  json config = json::parse(format::ConfigToJson(format::PresetConfig("tiny")));
  config["max_position_embeddings"] = 1024;
  WriteFile(dir / "config.json", config.dump());
  const auto r = RunKvdiff("make-model --config config.json --seed 2 --out model", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return dir / "model";
}

TEST(BenchCli, JsonHasEveryAgreedKeyForImpl) {
  TempDir dir;
  MakeTinyModel(dir);
  const auto r = RunKvdiff("bench --model model --backends impl --threads 2 --reps 1 --json b.json",
                           dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("memory read bandwidth:"));
  EXPECT_THAT(r.out, HasSubstr("prefill 128 (tok/s)"));
  EXPECT_THAT(r.out, HasSubstr("impl decode @ ctx 64:"));
  const json j = json::parse(ReadFile(dir / "b.json"));
  EXPECT_GT(j.at("bandwidth_gb_s").get<double>(), 0);
  EXPECT_EQ(j.at("threads"), 2);
  for (const char* key : {"prefill_tok_s", "decode_tok_s_ctx64", "decode_tok_s_ctx512",
                          "batch_decode_tok_s_1", "batch_decode_tok_s_4", "batch_decode_tok_s_16",
                          "full_forward_s_128", "full_forward_s_512", "peak_rss_mb"}) {
    EXPECT_GT(j.at("impl").at(key).get<double>(), 0) << key;
  }
  EXPECT_TRUE(j.at("ref").is_null()) << "ref was not asked for";
  EXPECT_GT(j.at("impl_decode_fraction_of_limit").get<double>(), 0);
  // Counting the cache a step at 512 reads too only adds bytes to the limit: a larger share.
  EXPECT_GT(j.at("impl_decode_fraction_of_limit_ctx512_with_cache").get<double>(),
            j.at("impl_decode_fraction_of_limit_ctx512").get<double>());
  // The peak of the impl child includes the model: more than the process had before loading it.
  EXPECT_GT(j.at("impl").at("peak_rss_mb").get<double>(),
            j.at("impl").at("baseline_rss_mb").get<double>());
}

TEST(BenchCli, CurveWritesCsvAndSvgAndReplotsFromTheCsv) {
  TempDir dir;
  MakeTinyModel(dir);
  const auto r = RunKvdiff(
      "bench --model model --backends impl --threads 1 --reps 1 --curve c.csv --plot c.svg "
      "--curve-max 8",
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string csv = ReadFile(dir / "c.csv");
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "context,impl_cached_ms,impl_uncached_ms");
  const bench::CostCurve curve = bench::ReadCostCsv(dir / "c.csv");
  EXPECT_EQ(curve.contexts, (std::vector<int64_t>{1, 2, 4, 8}));
  ASSERT_EQ(curve.series.size(), 1u);
  for (double ms : curve.series[0].cached_ms) EXPECT_GT(ms, 0);
  for (double ms : curve.series[0].uncached_ms) EXPECT_GT(ms, 0);
  const std::string svg = ReadFile(dir / "c.svg");
  EXPECT_EQ(XmlProblem(svg, nullptr), "") << svg;
  EXPECT_THAT(svg, HasSubstr("impl, cached: Session Append of 1 token"));
  EXPECT_THAT(svg, HasSubstr("impl, uncached: ForwardFull of the whole history"));
  EXPECT_THAT(svg, HasSubstr("memory-bandwidth limit"));
  EXPECT_THAT(svg, HasSubstr("(log scale)"));

  std::filesystem::remove(dir / "c.svg");
  const auto replot =
      RunKvdiff("bench --model model --curve c.csv --plot c.svg --replot", dir.path());
  ASSERT_EQ(replot.exit_code, 0) << replot.out << replot.err;
  EXPECT_EQ(XmlProblem(ReadFile(dir / "c.svg"), nullptr), "");
}

TEST(BenchCli, BadArgumentsExitTwoWithTheReason) {
  TempDir dir;
  auto r = RunKvdiff("bench --preset tiny --plot x.svg", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--plot and --replot need --curve"));
  r = RunKvdiff("bench --preset tiny --backends impl,nope", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--backends: unknown or unavailable backend 'nope'"));
  r = RunKvdiff("bench --preset tiny --backends impl --reps 1", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("the model holds 512 positions; the figures need 513"));
  r = RunKvdiff("bench --model no-such-dir --backends impl", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no-such-dir"));
}

TEST(BenchCsv, MalformedFilesAreRefusedWithTheLine) {
  TempDir dir;
  WriteFile(dir / "a.csv", "context,impl_cached_ms\n1,2\n");
  try {
    bench::ReadCostCsv(dir / "a.csv");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected a header \"context,<backend>_cached_ms"));
  }
  WriteFile(dir / "b.csv", "context,impl_cached_ms,impl_uncached_ms\n1,2,3\n2,x,4\n");
  try {
    bench::ReadCostCsv(dir / "b.csv");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("line 3: expected a number, got \"x\""));
  }
  // An empty cell is a skipped point (NaN), and survives a write and a read.
  WriteFile(dir / "c.csv", "context,impl_cached_ms,impl_uncached_ms\n1,2,\n");
  const bench::CostCurve curve = bench::ReadCostCsv(dir / "c.csv");
  EXPECT_TRUE(std::isnan(curve.series[0].uncached_ms[0]));
  bench::WriteCostCsv(dir / "d.csv", curve);
  EXPECT_EQ(ReadFile(dir / "d.csv"), "context,impl_cached_ms,impl_uncached_ms\n1,2.0000,\n");
}

// A context must be a whole number of positions: 1e300 was cast to int64_t (undefined), and a
// FIFO or /dev/zero given as the CSV hung or grew without bound (the input-file rules now apply).
TEST(BenchCsv, AContextThatIsNoWholeNumberAndAFileThatIsNoneAreRefused) {
  TempDir dir;
  WriteFile(dir / "e.csv", "context,impl_cached_ms,impl_uncached_ms\n1e300,2,3\n");
  try {
    bench::ReadCostCsv(dir / "e.csv");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("line 2: context must be a whole number from 1 to 1e9"));
  }
  EXPECT_THROW(bench::ReadCostCsv("/dev/zero"), InputError);
}

// A note's word longer than a line (a long path in "regenerate: ... --curve PATH") is cut; the
// wrap looped forever on it, growing its list of lines until memory ran out.
TEST(BenchPlot, ANoteWithAWordLongerThanALineIsCut) {
  bench::CostCurve curve;
  curve.contexts = {1, 2};
  curve.series.push_back({"impl", {1.0, 1.1}, {2.0, 4.0}});
  bench::PlotNotes notes;
  notes.title = "t";
  notes.lines = {"replot of " + std::string(300, 'a') + ".csv", std::string(130, ' ') + "x"};
  const std::string svg = bench::CostCurveSvg(curve, notes);
  // Continuations: 4 spaces of indent, then the next 121 characters of the word.
  EXPECT_THAT(svg, HasSubstr(">    " + std::string(121, 'a') + "</text>"));
  EXPECT_THAT(svg, HasSubstr("a.csv</text>"));
}

TEST(BenchChild, ResultsAndErrorsComeBackFromTheChild) {
  EXPECT_EQ(bench::RunInChild([] { return json{{"x", 3}}; }), (json{{"x", 3}}));
  try {
    bench::RunInChild([]() -> json { throw InputError("bad thing: 7"); });
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "bad thing: 7");
  }
  try {
    bench::RunInChild([]() -> json {
      std::raise(SIGKILL);
      return nullptr;
    });
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("died of signal 9"));
  }
}

}  // namespace
}  // namespace kvdiff::testing
