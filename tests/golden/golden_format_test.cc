// The golden library without the binary: text round trips, parse errors, file discovery, the row
// comparison and its digest tolerances, and what regen counts as a move.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "format/error.h"
#include "harness/golden/golden.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::harness {
namespace {

using ::kvdiff::testing::TempDir;
using ::kvdiff::testing::WriteFile;

// Logits like a model's: N(0, 3), magnitudes well below 16 (so float32 steps stay < 1e-6).
std::vector<float> RandomRow(int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(vocab);
  for (float& v : row) v = std::clamp(normal(rng), -15.0f, 15.0f);
  return row;
}

RecordedRow Recorded(const std::vector<float>& logits, Token token = 5) {
  RecordedRow r;
  r.token = token;
  r.logits = logits;
  return r;
}

GoldenRow GoldenOf(const std::vector<float>& logits, Token token = 5) {
  GoldenRow g = SummarizeRow(logits, kGoldenTopK);
  g.token = token;
  return g;
}

std::string Compare(const std::vector<float>& golden, const std::vector<float>& now,
                    bool with_full = false, double tol = 1e-4) {
  const GoldenRow g = GoldenOf(golden);
  return CompareWithGolden(g, with_full ? &golden : nullptr, Recorded(now), tol, nullptr);
}

Golden SampleGolden() {
  Golden g;
  g.scenario = "s.json";
  g.scenario_sha256 = std::string(64, 'a');
  g.model = {{"preset", "tiny"}, {"seed", 3}};
  g.model_files = {{"model.safetensors", std::string(64, 'b')}};
  g.model_description = "2 layers";
  g.vocab_size = 300;
  g.backend = "ref64";
  g.dtype = "float64";
  g.driver = "session";
  g.tolerance = 1e-4;
  g.kvdiff_version = "0.1.0";
  g.regenerate = "kvdiff golden regen s.json --backend ref64";
  g.rows_file = "s.golden.safetensors";
  g.rows_sha256 = std::string(64, 'c');
  for (int i = 0; i < 4; ++i) {
    GoldenRow r = GoldenOf(RandomRow(300, 10 + i), 7 * i);
    r.step = i / 2;
    r.row = i % 2;
    r.conversation = i < 3 ? "main" : "quote\"d";
    r.position = i;
    if (i == 3) {
      r.full = "step1.row1";
      g.full_rows[r.full] = RandomRow(300, 10 + i);
    }
    g.rows.push_back(r);
  }
  return g;
}

TEST(GoldenText, RoundTripsExactly) {
  const Golden g = SampleGolden();
  const std::string text = GoldenToText(g);
  Golden back = ParseGolden(text, "s.golden.json");
  EXPECT_TRUE(back.full_rows.empty());  // they live in the rows file
  back.full_rows = g.full_rows;
  EXPECT_EQ(GoldenToText(back), text);
  ASSERT_EQ(back.rows.size(), g.rows.size());
  for (size_t i = 0; i < g.rows.size(); ++i) {
    EXPECT_EQ(back.rows[i].conversation, g.rows[i].conversation);
    EXPECT_EQ(back.rows[i].sum, g.rows[i].sum);  // bit for bit: doubles are written exactly
    EXPECT_EQ(back.rows[i].sum_sq, g.rows[i].sum_sq);
    EXPECT_EQ(back.rows[i].max, g.rows[i].max);
    EXPECT_EQ(back.rows[i].min, g.rows[i].min);
    EXPECT_EQ(back.rows[i].top_k, g.rows[i].top_k);
  }
  const GoldenChange change = DiffGolden(g, back);
  EXPECT_FALSE(change.Any()) << change.Summary();
}

TEST(GoldenText, HasNoTimestampOrHost) {
  const std::string text = GoldenToText(SampleGolden());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(text.find(host), std::string::npos);
  EXPECT_EQ(text.find("time"), std::string::npos);
  EXPECT_EQ(text.find("date"), std::string::npos);
}

void ExpectParseError(const std::string& text, const std::string& expected) {
  try {
    ParseGolden(text, "g.golden.json");
    FAIL() << "expected InputError containing: " << expected;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("g.golden.json"), std::string::npos) << e.what();
  }
}

TEST(GoldenText, ParseErrorsNameTheField) {
  const std::string text = GoldenToText(SampleGolden());
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  ExpectParseError("{", "invalid JSON");
  ExpectParseError(replaced("\"kvdiff-golden\"", "\"other\""),
                   "format: expected \"kvdiff-golden\"");
  ExpectParseError(replaced("\"version\": 1", "\"version\": 9"), "version 1, the file has 9");
  ExpectParseError(replaced("\"vocab_size\": 300", "\"vocab_size\": 3"), "outside [0, 3)");
  ExpectParseError(replaced("\"rows_sha256\"", "\"rows_sha\""), "missing field \"rows_sha256\"");
  ExpectParseError(replaced("\"sum\": ", "\"sum\": \"x\", \"was\": "),
                   "rows[0].sum: expected a number");
  ExpectParseError(replaced("\"top_k\": [[", "\"top_k\": [[\"a\"], ["),
                   "rows[0].top_k[0]: expected [id, logit]");
}

TEST(GoldenPaths, FromAnyOfTheThreeNames) {
  for (const char* name : {"d/x.json", "d/x.golden.json", "d/x.golden.safetensors"}) {
    const GoldenPaths p = GoldenPathsFor(name);
    EXPECT_EQ(p.scenario, "d/x.json") << name;
    EXPECT_EQ(p.golden, "d/x.golden.json") << name;
    EXPECT_EQ(p.rows, "d/x.golden.safetensors") << name;
  }
  try {
    GoldenPathsFor("d/x.txt");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("expected a scenario (NAME.json)"), std::string::npos);
  }
}

TEST(GoldenPaths, FindsScenariosRecursivelySortedSkippingDotFiles) {
  TempDir dir;
  std::filesystem::create_directories(dir / "b" / "deep");
  std::filesystem::create_directories(dir / "a");
  for (const char* f : {"b/deep/z.json", "b/deep/z.golden.json", "a/y.json", "a/y.golden.json",
                        "a/.y.golden.json.tmp.1.2", "a/README.md", "b/w.json"}) {
    WriteFile(dir / f, "{}");
  }
  const auto sets = FindGoldenSets({dir.path(), dir / "a" / "y.golden.json"});
  ASSERT_EQ(sets.size(), 3u);  // y once, though named twice
  EXPECT_EQ(sets[0].scenario, dir / "a" / "y.json");
  EXPECT_EQ(sets[1].scenario, dir / "b" / "deep" / "z.json");
  EXPECT_EQ(sets[2].scenario, dir / "b" / "w.json");

  std::filesystem::create_directories(dir / "empty");
  try {
    FindGoldenSets({dir / "empty"});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no scenario file"), std::string::npos) << e.what();
  }
  try {
    FindGoldenSets({dir / "nope"});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no such file or folder"), std::string::npos);
  }
}

// The digest tolerances are necessary conditions of |a - b| <= tol elementwise: no row within the
// tolerance is ever rejected, at small and SmolLM2-sized vocabularies, for random noise and for
// the worst case of every logit moved the same way.
TEST(GoldenCompare, NeverRejectsARowWithinTolerance) {
  const double tol = 1e-4;
  for (int64_t vocab : {16, 512, 49152}) {
    for (uint32_t seed = 0; seed < 6; ++seed) {
      const std::vector<float> golden = RandomRow(vocab, seed);
      std::mt19937 rng(seed + 100);
      std::uniform_real_distribution<double> noise(-0.99 * tol, 0.99 * tol);
      for (int mode = 0; mode < 3; ++mode) {
        std::vector<float> now = golden;
        for (float& v : now) {
          const double d = mode == 0 ? noise(rng) : mode == 1 ? 0.99 * tol : -0.99 * tol;
          v = static_cast<float>(v + d);
        }
        EXPECT_EQ(Compare(golden, now, true, tol), "")
            << "vocab " << vocab << " seed " << seed << " mode " << mode;
      }
    }
  }
}

TEST(GoldenCompare, CatchesEachKindOfChange) {
  const int64_t vocab = 512;
  std::vector<float> golden = RandomRow(vocab, 1);
  // A clear top: the 10 best logits far above the rest, so the changes below stay out of it.
  for (int i = 0; i < 10; ++i) golden[40 * i + 3] = 30.0f - i;
  const GoldenRow g = GoldenOf(golden);

  {  // one top-k logit
    auto now = golden;
    now[g.top_k[4].first] += 3e-4f;
    EXPECT_NE(Compare(golden, now).find("(golden rank 5)"), std::string::npos)
        << Compare(golden, now);
  }
  {  // a token from below rises into the top
    auto now = golden;
    now[1] = 25.5f;
    EXPECT_NE(Compare(golden, now).find("not in the golden's top 10"), std::string::npos)
        << Compare(golden, now);
  }
  {  // everything below the top shifts down: the sum sees it
    auto now = golden;
    for (int64_t i = 0; i < vocab; ++i)
      if (now[i] < 20) now[i] -= 0.01f;
    EXPECT_NE(Compare(golden, now).find("sum of the 512 logits"), std::string::npos)
        << Compare(golden, now);
  }
  {  // spread changes, sum kept: positives up, as many negatives down: the sum of squares sees it
    auto now = golden;
    std::vector<int64_t> pos, neg;
    for (int64_t i = 0; i < vocab; ++i) {
      if (now[i] >= 20) continue;
      (now[i] > 0 ? pos : neg).push_back(i);
    }
    for (size_t k = 0; k < std::min(pos.size(), neg.size()); ++k) {
      now[pos[k]] += 0.05f;
      now[neg[k]] -= 0.05f;
    }
    EXPECT_NE(Compare(golden, now).find("sum of squares of the 512 logits"), std::string::npos)
        << Compare(golden, now);
  }
  {  // the smallest logit
    auto now = golden;
    now[std::min_element(now.begin(), now.end()) - now.begin()] -= 0.01f;
    EXPECT_NE(Compare(golden, now).find("min logit"), std::string::npos) << Compare(golden, now);
  }
  {  // one logit in the middle: only the full row sees it
    auto now = golden;
    now[100] += 5e-3f;
    EXPECT_EQ(Compare(golden, now, false), "");
    EXPECT_NE(Compare(golden, now, true).find("full row: logit 100"), std::string::npos)
        << Compare(golden, now, true);
  }
  {  // not finite
    auto now = golden;
    now[7] = NAN;
    EXPECT_NE(Compare(golden, now).find("logit 7 is nan"), std::string::npos)
        << Compare(golden, now);
  }
  {  // a different input token
    const std::string r = CompareWithGolden(g, nullptr, Recorded(golden, 6), 1e-4, nullptr);
    EXPECT_NE(r.find("input token 6, the golden fed 5"), std::string::npos) << r;
  }
}

TEST(GoldenDiff, IgnoresNoiseCountsMovesAndTokens) {
  const Golden a = SampleGolden();
  Golden b = a;
  b.rows[1].top_k[2].second += 1e-8f;  // below kGoldenNoiseFraction * tolerance
  EXPECT_FALSE(DiffGolden(a, b).Any());
  b.rows[2].top_k[0].second += 2e-3f;
  b.rows[3].token = 99;
  b.kvdiff_version = "0.2.0";
  const GoldenChange c = DiffGolden(a, b);
  EXPECT_EQ(c.rows_changed, 2);
  EXPECT_EQ(c.tokens_changed, 1);
  EXPECT_NEAR(c.largest_change, 2e-3, 1e-5);
  EXPECT_EQ(c.largest_where, "step 1 row 0");
  EXPECT_EQ(c.header_fields, std::vector<std::string>{"kvdiff_version"});
  EXPECT_NE(c.Summary().find("2 of 4 rows changed"), std::string::npos) << c.Summary();
}

}  // namespace
}  // namespace kvdiff::harness
