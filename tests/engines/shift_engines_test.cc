// Context shifts in outside engines (issue 34, the engine side): engine.h ABI 3's shift through
// the example plugin (in process and isolated, and through a version-3 wrapper), the protocol's
// shift through the numpy engine program, and llama.cpp's llama_memory_seq_rm + seq_add, each
// held to BackendSession::Shift's algebra (tests/harness/shift_session_suite.h) and to ref64 on
// shift scenarios. The example's fault=shift-not-rerotated is caught on every scenario whose
// shift moved keys (the proof of power); a plugin that does not shift is refused naming it; one
// that claims a shift it never made is caught by its length; an engine's own refusal of a shift
// beyond its length is bad input, in process and isolated.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "format/error.h"
#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "harness/compare/gate.h"
#include "harness/run/differential_run.h"
#include "harness/run/model_for.h"
#include "harness/scenario/scenario.h"
#include "plugin_host/isolated_engine.h"
#include "plugin_host/plugin_loader.h"
#include "tests/harness/shift_session_suite.h"

namespace kvdiff::harness {
namespace {

using ::testing::HasSubstr;

// Isolated plugins run in `kvdiff engine-host`: the binary under test.
const bool kEngineHostSet = (SetEngineHost(KVDIFF_BINARY), true);

std::string Example(const std::string& options = "") {
  return std::string("plugin:") + KVDIFF_EXAMPLE_ENGINE + options;
}
// The Rust example (engines/rust_example), when the build has cargo; "" when it has not.
#ifdef KVDIFF_RUST_EXAMPLE_ENGINE
std::string Rust(const std::string& options = "") {
  return std::string("plugin:") + KVDIFF_RUST_EXAMPLE_ENGINE + options;
}
#else
std::string Rust(const std::string& = "") { return ""; }
#endif
std::string Numpy() {
  return fmt::format("exec:/usr/bin/python3 {}/examples/numpy_engine.py", KVDIFF_SOURCE_DIR);
}

// The engines that shift, as suite parameters (the strings live as long as the program).
// llama.cpp's twins sit in other cells of its unified memory: measured up to 4.1e-6 apart (as
// docs/llama-cpp.md's twins in one batch call, 3.3e-6).
std::vector<ShiftSuiteBackend> ShiftingEngines() {
  static const std::vector<std::string> names = {
      Example(), "in-process:" + Example(),
      std::string("in-process:plugin:") + KVDIFF_BROKEN_V3_ENGINE,  // a v3 wrapper, passing on
      Numpy(), Rust()};
  std::vector<ShiftSuiteBackend> out;
  for (const std::string& n : names)
    if (!n.empty()) out.push_back({n.c_str()});
  out.push_back({"llama.cpp", 1e-5});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Engines, ShiftSessionTest, ::testing::ValuesIn(ShiftingEngines()));

// ---- against ref64, through the differential run ----

class ShiftEnginesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = new std::shared_ptr<const format::ModelWeights>(LoadModelFor(testing::TinyModel(3)));
  }
  static void TearDownTestSuite() { delete weights_; }

  static std::unique_ptr<Backend> Make(const std::string& name) {
    return MakeShiftTestBackend(name, *weights_);
  }
  // The scenario on `engine` and ref64, held to the gate the command line would resolve (the
  // flat 1e-4, or llama.cpp's rope-f32 profile).
  static RunReport Run(Scenario sc, const Backend& engine, const Backend& ref64) {
    PrepareScenario(sc, **weights_);
    const std::vector<const Backend*> backends = {&engine, &ref64};
    std::vector<std::string> notes;
    sc.gate = ResolveGate(std::nullopt, sc.gate, backends, &notes);
    return RunScenario(sc, backends, RunOptions{});
  }
  // The worst engine~ref64 difference over rows after a shift: the cross rows of a step that
  // the engine's own uncached oracle did not judge.
  static double WorstAfterShift(const RunReport& r, int64_t* rows) {
    double worst = 0;
    for (const StepReport& s : r.steps) {
      std::set<int64_t> judged;
      for (const ComparedRow& row : s.outcomes[0].rows) judged.insert(row.row);
      for (const ComparedRow& row : s.outcomes[2].rows) {
        if (judged.count(row.row)) continue;
        ++*rows;
        worst = std::max(worst, row.cmp.max_abs_diff);
      }
    }
    return worst;
  }
  static std::string FirstDivergence(const RunReport& r) {
    if (r.first_error) return r.first_error->message;
    return r.first_divergence
               ? fmt::format("{} {}: {:.2e}", r.first_divergence->params, r.first_divergence->path,
                             r.first_divergence->row.cmp.max_abs_diff)
               : "";
  }
  // examples/scenarios/shift.json (two shifts before a decode, a fork shifted on its own) and
  // `seeds` random shift scenarios on `name` against ref64: all pass; prints the figure.
  static void AgreesWithRef64(const std::string& name, uint32_t seeds) {
    if (!BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "ref64 not built";
    const auto engine = Make(name);
    const auto ref64 = Make("ref64");
    std::vector<Scenario> cases = {
        LoadScenario(std::string(KVDIFF_SOURCE_DIR) + "/examples/scenarios/shift.json")};
    for (uint32_t seed = 0; seed < seeds; ++seed) cases.push_back(RandomShiftScenario(seed));
    double worst = 0;
    int64_t rows = 0;
    for (const Scenario& sc : cases) {
      const RunReport r = Run(sc, *engine, *ref64);
      ASSERT_TRUE(r.Passed()) << sc.name << ": " << FirstDivergence(r);
      worst = std::max(worst, WorstAfterShift(r, &rows));
    }
    EXPECT_GT(rows, 0);
    std::printf("figure: %s~ref64 after shifts: worst %.2e over %lld rows (%zu scenarios)\n",
                engine->Name().c_str(), worst, static_cast<long long>(rows), cases.size());
  }

  // The proof of power: an engine whose shift moves rows but leaves keys with their old rotation
  // (the example's fault=shift-not-rerotated, the Rust example's bug=shift-not-rerotated) fails
  // every scenario whose shift moved a key before a decode, the random ones included (each ends
  // with two shifts that move rows, then a decode), while the healthy engine passes them all
  // (...AgreesWithRef64AfterShifts).
  static void ShiftFaultIsCaughtWheneverAKeyMoved(const std::string& name) {
    const auto faulty = Make(name);
    const auto ref64 = Make("ref64");
    std::vector<Scenario> cases = {
        LoadScenario(std::string(KVDIFF_SOURCE_DIR) + "/examples/scenarios/shift.json")};
    for (uint32_t seed = 0; seed < 100; ++seed) cases.push_back(RandomShiftScenario(seed));
    int caught = 0, moved = 0;
    double weakest = 1e30;
    for (const Scenario& sc : cases) {
      const bool moves =
          sc.steps.back().op == Op::kDecode && sc.steps[sc.steps.size() - 2].op == Op::kShift;
      if (!moves) continue;  // a random case too short for its closing shifts
      ++moved;
      const RunReport r = Run(sc, *faulty, *ref64);
      EXPECT_FALSE(r.Passed()) << sc.name;
      if (r.Passed() || !r.first_divergence) continue;
      ++caught;
      EXPECT_EQ(r.first_divergence->kind, PathKind::kCross) << sc.name;
      weakest = std::min(weakest, r.first_divergence->row.cmp.max_abs_diff);
    }
    EXPECT_GT(moved, 80);
    EXPECT_EQ(caught, moved);
    EXPECT_GT(weakest, 1e-2);
    std::printf("figure: %s caught in %d of %d scenarios, the weakest first divergence %.2e\n",
                faulty->Name().c_str(), caught, moved, weakest);
  }

  static std::shared_ptr<const format::ModelWeights>* weights_;
};
std::shared_ptr<const format::ModelWeights>* ShiftEnginesTest::weights_ = nullptr;

TEST_F(ShiftEnginesTest, TheExamplePluginAgreesWithRef64AfterShifts) {
  AgreesWithRef64(Example(), 100);
}

TEST_F(ShiftEnginesTest, TheNumpyEngineAgreesWithRef64AfterShifts) { AgreesWithRef64(Numpy(), 40); }

TEST_F(ShiftEnginesTest, TheRustEngineAgreesWithRef64AfterShifts) {
  if (Rust().empty()) GTEST_SKIP() << "the Rust example is not built (KVDIFF_WITH_RUST=OFF)";
  AgreesWithRef64(Rust(), 100);
}

TEST_F(ShiftEnginesTest, LlamaCppAgreesWithRef64AfterShifts) {
  if (!BackendRegistry::Global().Has("llama.cpp")) GTEST_SKIP() << "llama.cpp not built";
  AgreesWithRef64("llama.cpp", 100);
}

// ggml-org/llama.cpp#3825: llama.cpp records a shift as a per-cell delta applied at the next
// decode; a second shift before that decode overwrote the delta instead of adding to it. Two
// shifts before one decode, keeping 0, 1 and 9 positions, after a prefill longer than a ubatch.
TEST_F(ShiftEnginesTest, LlamaCppAddsTwoShiftsBeforeOneDecode) {
  if (!BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "ref64 not built";
  if (!BackendRegistry::Global().Has("llama.cpp")) GTEST_SKIP() << "llama.cpp not built";
  const auto engine = Make("llama.cpp?ubatch=16");
  const auto ref64 = Make("ref64");
  Tokens prompt(48);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<Token>((i * 61 + 5) % 256);
  double worst = 0;
  for (int64_t keep : {0, 1, 9}) {
    Scenario sc;
    sc.name = fmt::format("two-shifts-keep-{}", keep);
    sc.model = testing::TinyModel(3);
    sc.steps = {Step::Prefill("main", prompt, {20, 28}),
                Step::Shift("main", keep, 5),
                Step::Shift("main", keep, 7),
                Step::Decode("main", 8),
                Step::Shift("main", keep, 11),
                Step::Decode("main", 4)};
    const RunReport r = Run(sc, *engine, *ref64);
    ASSERT_TRUE(r.Passed()) << sc.name << ": " << FirstDivergence(r);
    ASSERT_EQ(r.steps[3].outcomes[2].rows.size(), 8u);
    int64_t rows = 0;
    worst = std::max(worst, WorstAfterShift(r, &rows));
  }
  std::printf("figure: llama.cpp~ref64, two shifts before one decode (keep 0, 1, 9): worst %.2e\n",
              worst);
}

// A fork shares its parent's cells in llama.cpp's unified memory and llama_memory_seq_add moves a
// shared cell for every sequence in it: the plugin gives a shifted session cells of its own
// first (engines/llama_cpp/shift.cc; without that, examples/scenarios/shift.json's fork is refused
// by llama.cpp at its next decode and its parent is 2.2 off). Here a shift waits for its K-shift
// when the fork is made and when the fork shifts: the pending rotation is applied first (without
// that, the state copy loses it and the fork's decode is 7.4 off); the parent shifts after its
// fork did.
TEST_F(ShiftEnginesTest, LlamaCppShiftsAForkApartFromItsTwin) {
  if (!BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "ref64 not built";
  if (!BackendRegistry::Global().Has("llama.cpp")) GTEST_SKIP() << "llama.cpp not built";
  const auto engine = Make("llama.cpp");
  const auto ref64 = Make("ref64");
  Tokens prompt(24);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<Token>((i * 29 + 3) % 256);
  Scenario sc;
  sc.name = "fork-shifts";
  sc.model = testing::TinyModel(3);
  sc.steps = {
      Step::Prefill("main", prompt), Step::Shift("main", 2, 3),   Step::Fork("main", "side"),
      Step::Shift("side", 1, 4),     Step::Shift("main", 0, 2),   Step::Decode("side", 4),
      Step::Decode("main", 4),       Step::Fork("side", "third"), Step::Shift("third", 3, 5),
      Step::Decode("third", 3),      Step::Decode("side", 2)};
  const RunReport r = Run(sc, *engine, *ref64);
  ASSERT_TRUE(r.Passed()) << FirstDivergence(r);
  int64_t rows = 0;
  std::printf("figure: llama.cpp~ref64, forks shifted apart from their twins: worst %.2e\n",
              WorstAfterShift(r, &rows));
  EXPECT_EQ(rows, 4 + 4 + 3 + 2);
}

TEST_F(ShiftEnginesTest, TheExamplesShiftFaultIsCaughtWheneverAKeyMoved) {
  if (!BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "ref64 not built";
  ShiftFaultIsCaughtWheneverAKeyMoved("in-process:" + Example("?fault=shift-not-rerotated"));
}

TEST_F(ShiftEnginesTest, TheRustEnginesShiftBugIsCaughtWheneverAKeyMoved) {
  if (!BackendRegistry::Global().Has("ref64")) GTEST_SKIP() << "ref64 not built";
  if (Rust().empty()) GTEST_SKIP() << "the Rust example is not built (KVDIFF_WITH_RUST=OFF)";
  ShiftFaultIsCaughtWheneverAKeyMoved("in-process:" + Rust("?bug=shift-not-rerotated"));
}

// ---- what is refused, and the plugin that lies ----

TEST_F(ShiftEnginesTest, APluginWithoutShiftIsRefusedNamingIt) {
  // The version-2 wrapper: its table ends before shift.
  const auto v2 = Make(std::string("plugin:") + KVDIFF_BROKEN_V2_ENGINE);
  EXPECT_FALSE(v2->Info().shifts);
  Scenario sc;
  sc.model = testing::TinyModel(3);
  sc.steps = {Step::Prefill("main", {1, 2, 3}), Step::Shift("main", 1, 1)};
  EXPECT_THAT([&] { ValidateScenarioFor(sc, v2->Info()); },
              ::testing::ThrowsMessage<InputError>(HasSubstr(fmt::format(
                  "steps[1] shift(main,keep=1,discard=1): backend plugin:{} does not shift a "
                  "conversation's positions",
                  KVDIFF_BROKEN_V2_ENGINE))));
  EXPECT_TRUE(Make(std::string("plugin:") + KVDIFF_BROKEN_V3_ENGINE)->Info().shifts);
  // The registry lists llama.cpp among the backends that shift before any engine is opened.
  if (BackendRegistry::Global().Has("llama.cpp")) {
    EXPECT_THAT(BackendRegistry::Global().ShiftingBackends(), ::testing::Contains("llama.cpp"));
  }
}

TEST_F(ShiftEnginesTest, APluginThatClaimsAShiftItNeverMadeIsCaughtByItsLength) {
  const auto liar =
      Make(std::string("in-process:plugin:") + KVDIFF_BROKEN_V3_ENGINE + "?bug=shift");
  Scenario sc;
  sc.model = testing::TinyModel(3);
  sc.steps = {Step::Prefill("main", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), Step::Shift("main", 4, 3),
              Step::Decode("main", 2)};
  PrepareScenario(sc, **weights_);
  const RunReport r = RunScenario(sc, {liar.get()}, RunOptions{});
  ASSERT_TRUE(r.first_error.has_value());
  EXPECT_EQ(r.first_error->step, 1);
  EXPECT_THAT(r.first_error->message,
              HasSubstr("conversation \"main\": Length() is 10 after shift(keep=4, discard=3), "
                        "but kvdiff fed it 7 positions"));
}

// What the engine refuses comes back as bad input with its message, in process and isolated
// (the protocol's status 1), and changes nothing; a shift to an engine that does not shift is
// refused before anything is sent.
TEST_F(ShiftEnginesTest, AShiftBeyondTheLengthIsTheEnginesBadInput) {
  testing::TempDir tmp;
  format::SaveModel(tmp.path(), **weights_, format::DType::kF32);
  const std::string expected =
      "example: shift(keep=4, discard=8): expected 0 <= keep, 0 <= discard and keep + discard <= "
      "10 (the session's length)";
  const Tokens prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

  const engines::Engine in_process = engines::Plugin::Load(KVDIFF_EXAMPLE_ENGINE).Open(tmp.path());
  EXPECT_TRUE(in_process.Info().shifts);
  engines::Session s = in_process.NewSession();
  s.Append(prompt);
  EXPECT_THAT([&] { s.Shift(4, 8); },
              ::testing::ThrowsMessage<InputError>(::testing::Eq(expected)));
  EXPECT_EQ(s.Length(), 10);

  const engines::IsolatedEngine isolated =
      engines::IsolatedEngine::Start({KVDIFF_BINARY, KVDIFF_EXAMPLE_ENGINE, tmp.path(), ""});
  EXPECT_TRUE(isolated.Info().shifts);
  engines::IsolatedSession t = isolated.NewSession();
  t.Append(prompt);
  EXPECT_THAT([&] { t.Shift(4, 8); },
              ::testing::ThrowsMessage<InputError>(::testing::Eq(expected)));
  EXPECT_EQ(t.Length(), 10);
  t.Shift(4, 3);
  EXPECT_EQ(t.Length(), 7);

  const engines::IsolatedEngine v2 =
      engines::IsolatedEngine::Start({KVDIFF_BINARY, KVDIFF_BROKEN_V2_ENGINE, tmp.path(), ""});
  EXPECT_FALSE(v2.Info().shifts);
  engines::IsolatedSession u = v2.NewSession();
  u.Append(prompt);
  EXPECT_THAT([&] { u.Shift(1, 1); },
              ::testing::ThrowsMessage<InputError>(HasSubstr("the engine does not shift")));
  EXPECT_EQ(u.Length(), 10);
}

}  // namespace
}  // namespace kvdiff::harness
