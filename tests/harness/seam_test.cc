// The one seam: a new backend is one class and one Register call (docs/engines.md's example, built
// here); the misuse drivers run on any backend's raw call; an engine plugin runs a campaign
// through the registry; and a scenario whose backend fails mid-way replays the same way in `run`
// and in `golden` (the failing conversation stops, the others go on).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "format/error.h"
#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "harness/golden/golden.h"
#include "harness/replay/drivers.h"
#include "harness/replay/replay.h"
#include "harness/report/run_report.h"
#include "harness/run/differential_run.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using namespace kvdiff::harness;
using ::testing::HasSubstr;

std::shared_ptr<const format::ModelWeights> Tiny(uint64_t seed = 3) {
  return std::make_shared<const format::ModelWeights>(
      format::MakeRandomModel(format::PresetConfig("tiny"), seed));
}

// ---- docs/engines.md's "Adding a backend" example, as written there ----------------------------

// impl with every logit multiplied by `scale`: scale 1.0 must pass, anything else must not.
class ScaledBackend : public Backend {
 public:
  ScaledBackend(BackendInfo info, std::unique_ptr<Backend> inner, float scale)
      : info_(std::move(info)), inner_(std::move(inner)), scale_(scale) {}
  const BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return inner_->config(); }
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return inner_->ForwardFull(tokens, trace) * scale_;
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    struct Session : BackendSession {
      std::unique_ptr<BackendSession> inner;
      float scale;
      Logits Append(const Tokens& t, ForwardTrace* trace) override {
        return inner->Append(t, trace) * scale;
      }
      int64_t Length() const override { return inner->Length(); }
      void Truncate(int64_t n) override { inner->Truncate(n); }
      std::unique_ptr<BackendSession> Fork() const override {
        auto s = std::make_unique<Session>();
        s->inner = inner->Fork();
        s->scale = scale;
        return s;
      }
      void Reset() override { inner->Reset(); }
    };
    auto s = std::make_unique<Session>();
    s->inner = inner_->NewSession();
    s->scale = scale_;
    return s;
  }

 private:
  BackendInfo info_;
  std::unique_ptr<Backend> inner_;
  float scale_;
};

void RegisterScaled(const std::string& name, float scale) {
  BackendInfo info;
  info.name = name;
  info.description = "impl, every logit scaled";
  info.dtype = "float32";
  BackendRegistry::Global().Register(
      info,
      [scale](const BackendInfo& info, std::shared_ptr<const format::ModelWeights> w,
              const BackendOptions& o) -> std::unique_ptr<Backend> {
        return std::make_unique<ScaledBackend>(info, MakeBackend("impl", w, o.threads), scale);
      });
}

CampaignReport Campaign(const std::vector<std::string>& names, int64_t cases) {
  const ModelSpec model = testing::TinyModel();
  auto weights = LoadModelFor(model);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<const Backend*> backends;
  for (const std::string& name : names) {
    // In process: a test binary is no engine host (isolation runs through the kvdiff binary).
    owned.push_back(
        BackendRegistry::Global().Make(name, weights, BackendOptions{1, /*isolate=*/false}));
    backends.push_back(owned.back().get());
  }
  CampaignOptions options;
  options.cases = cases;
  const TempDir failures;  // lives until the run is over, then takes its files with it
  options.out_dir = failures / "failures";
  return RunCampaign(model, backends, options);
}

TEST(Seam, ANewBackendIsOneClassAndOneRegistryLine) {
  RegisterScaled("impl-scaled-1", 1.0f);
  RegisterScaled("impl-scaled-1.001", 1.001f);
  EXPECT_THAT(BackendRegistry::Global().HelpText(), HasSubstr("impl-scaled-1 ("));
  const CampaignReport same = Campaign({"impl", "impl-scaled-1"}, 20);
  EXPECT_TRUE(same.Passed()) << same.Summary();
  EXPECT_GT(same.rows_compared, 1000);
  // The campaign has power over the new backend: a 0.1% scale is far beyond 1e-4 on logits.
  const CampaignReport scaled = Campaign({"impl", "impl-scaled-1.001"}, 20);
  EXPECT_EQ(scaled.Failures(), 20) << scaled.Summary();
  EXPECT_THROW(RegisterScaled("impl", 1.0f), InputError) << "names are unique";
}

TEST(Seam, TheRegistryIsTheOnlyListOfBackends) {
  const BackendRegistry& r = BackendRegistry::Global();
  EXPECT_EQ(r.Names().front(), "impl");
  EXPECT_THAT(r.Defaults(), ::testing::Contains("impl"));
  EXPECT_TRUE(r.Knows("plugin:/any/path.so")) << "a family claims its prefix";
  try {
    r.Info("warp9");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown backend 'warp9' (available: impl"));
  }
  EXPECT_EQ(r.Info("impl").raw_call, RawCall::kTakesPosition);
  EXPECT_FALSE(r.Info("impl").gemms_in_blas) << "Eigen's own products, no BLAS";
  // The demanding part asks for an arbiter, not for a name; ref64 is the only float64 backend.
  EXPECT_EQ(r.HasArbiter(), r.Has("ref64"));
  EXPECT_EQ(r.FirstWithRawCall(RawCall::kTakesPosition), "impl");
}

TEST(Seam, AnEnginePluginRunsACampaignThroughTheRegistry) {
  const std::string plugin = std::string("plugin:") + KVDIFF_EXAMPLE_ENGINE;
  const CampaignReport r = Campaign({"impl", plugin}, 30);
  EXPECT_TRUE(r.Passed()) << r.Summary();
  EXPECT_GT(r.rows_compared, 1000);
  // Naming a plugin only checks its path: loading runs its code, which isolation keeps out of
  // this process, so the engine's own name is known once it is built.
  EXPECT_THAT(BackendRegistry::Global().Info(plugin).description,
              HasSubstr("engine plugin " KVDIFF_EXAMPLE_ENGINE));
  const ModelSpec tiny = testing::TinyModel(0);
  EXPECT_THAT(BackendRegistry::Global()
                  .Make(plugin, LoadModelFor(tiny), BackendOptions{1, /*isolate=*/false})
                  ->Info()
                  .description,
              HasSubstr("engine plugin example"));
  // Engine options travel after '?', '&'-separated; an unknown one is the engine's InputError.
  EXPECT_THROW(Campaign({"impl", plugin + "?colour=blue"}, 1), InputError);
  EXPECT_THROW(BackendRegistry::Global().Info("plugin:/no/such/engine.so"), InputError);
}

// ---- Drivers on the raw call ---------------------------------------------------------------

Scenario TwoConversations(DriverKind driver, Tokens second) {
  Scenario sc;
  sc.driver = driver;
  sc.steps = {Step::Prefill("main", {5, 17, 3, 99, 42}), Step::Decode("main", 7),
              Step::NewConversation("second"), Step::Prefill("second", std::move(second)),
              Step::Decode("second", 3)};
  return sc;
}

TEST(Drivers, QuantizedDropsItsCacheAtPositionZeroSoReuseIsCorrect) {
  auto impl = MakeBackend("impl", Tiny(), 1);
  for (DriverKind kind : {DriverKind::kQuantized, DriverKind::kRaw, DriverKind::kUncached}) {
    SCOPED_TRACE(DriverName(kind));
    const RunReport r = RunScenario(TwoConversations(kind, {8, 17, 3}), {impl.get()}, {});
    EXPECT_TRUE(r.Passed()) << FormatTerminal(r, false);
  }
  // The same steps on plain reuse: the broadcast error.
  const RunReport reuse =
      RunScenario(TwoConversations(DriverKind::kReuse, {8, 17, 3}), {impl.get()}, {});
  ASSERT_TRUE(reuse.first_error);
  EXPECT_EQ(reuse.first_error->message, "cannot broadcast [3, 3] to [1, 4, 3, 15]");
}

TEST(Drivers, StalePositionRaisesCandlesErrorTheOtherWayRound) {
  auto impl = MakeBackend("impl", Tiny(), 1);
  const RunReport r =
      RunScenario(TwoConversations(DriverKind::kStalePosition, {8, 17, 3}), {impl.get()}, {});
  ASSERT_TRUE(r.first_error);
  // 5 + 7 = 12 positions reached by main; the fresh cache holds none.
  EXPECT_EQ(r.first_error->message, "cannot broadcast [3, 15] to [1, 4, 3, 3]");
  EXPECT_EQ(r.first_error->step, 3);
  // A one-token call has no mask in candle, so it runs; and since every key of the fresh cache
  // is rotated by the same stale offset, RoPE's scores (which depend only on relative positions)
  // do not change: the stale offset is invisible beyond float rounding.
  const RunReport one =
      RunScenario(TwoConversations(DriverKind::kStalePosition, {8}), {impl.get()}, {});
  EXPECT_FALSE(one.first_error);
  EXPECT_TRUE(one.Passed()) << FormatTerminal(one, false);
}

TEST(Drivers, PositionDriversNeedARawCallThatTakesAPosition) {
  BackendInfo no_raw;
  no_raw.name = "engine";
  EXPECT_THAT(DriverNotApplicable(DriverKind::kReuse, no_raw),
              HasSubstr("offers only the checked session API"));
  BackendInfo from_cache;
  from_cache.name = "hf";
  from_cache.raw_call = RawCall::kPositionFromCache;
  EXPECT_EQ(DriverNotApplicable(DriverKind::kReuse, from_cache), "");
  EXPECT_THAT(DriverNotApplicable(DriverKind::kStalePosition, from_cache),
              HasSubstr("its raw call takes no position"));
  EXPECT_EQ(DriverNotApplicable(DriverKind::kUncached, no_raw), "");
}

// ---- One replay: run and golden agree on a scenario that fails mid-way -----------------------

// impl, except that a session refuses any call that feeds token 77.
class Refuses77 : public Backend {
 public:
  Refuses77(BackendInfo info, std::unique_ptr<Backend> inner)
      : info_(std::move(info)), inner_(std::move(inner)) {}
  const BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return inner_->config(); }
  Logits ForwardFull(const Tokens& t, ForwardTrace* trace) const override {
    return inner_->ForwardFull(t, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override {
    struct Session : BackendSession {
      std::unique_ptr<BackendSession> inner;
      Logits Append(const Tokens& t, ForwardTrace* trace) override {
        for (Token x : t) KVDIFF_CHECK(x != 77, "refuses-77: token 77 is not welcome");
        return inner->Append(t, trace);
      }
      int64_t Length() const override { return inner->Length(); }
      void Truncate(int64_t n) override { inner->Truncate(n); }
      std::unique_ptr<BackendSession> Fork() const override {
        auto s = std::make_unique<Session>();
        s->inner = inner->Fork();
        return s;
      }
      void Reset() override { inner->Reset(); }
    };
    auto s = std::make_unique<Session>();
    s->inner = inner_->NewSession();
    return s;
  }

 private:
  BackendInfo info_;
  std::unique_ptr<Backend> inner_;
};

TEST(OneReplay, RunAndGoldenAgreeOnAScenarioThatFailsMidWay) {
  if (!BackendRegistry::Global().Knows("refuses-77")) {
    BackendInfo info;
    info.name = "refuses-77";
    info.description = "impl that refuses token 77";
    info.dtype = "float32";
    BackendRegistry::Global().Register(
        info,
        [](const BackendInfo& info, std::shared_ptr<const format::ModelWeights> w,
           const BackendOptions& o) -> std::unique_ptr<Backend> {
          return std::make_unique<Refuses77>(info, MakeBackend("impl", w, o.threads));
        });
  }
  TempDir dir;
  const std::string scenario = R"({
  "model": {"preset": "tiny", "seed": 3},
  "steps": [
    {"op": "prefill", "tokens": [1, 2, 3]},
    {"op": "new_conversation", "name": "second"},
    {"op": "prefill", "conversation": "second", "tokens": [4, 77, 5]},
    {"op": "decode", "conversation": "second", "n": 2},
    {"op": "decode", "conversation": "main", "n": 3},
    {"op": "fork", "from": "second", "to": "third"},
    {"op": "decode", "conversation": "third", "n": 1}
  ]
})";
  WriteFile(dir / "fails.json", scenario);

  // run: the second conversation stops at step 2, its later steps and its fork are skipped, and
  // main's decode at step 4 still runs and passes.
  Scenario sc = LoadScenario(dir / "fails.json");
  auto weights = LoadModelFor(sc.model);
  PrepareScenario(sc, *weights);
  auto faulty = BackendRegistry::Global().Make("refuses-77", weights, BackendOptions{1});
  const RunReport run = RunScenario(sc, {faulty.get()}, {});
  ASSERT_TRUE(run.first_error);
  EXPECT_EQ(run.first_error->step, 2);
  EXPECT_EQ(run.first_error->message, "refuses-77: token 77 is not welcome");
  EXPECT_EQ(run.steps[3].outcomes[0].status, PathStatus::kSkipped);
  EXPECT_EQ(run.steps[4].outcomes[0].status, PathStatus::kPass) << "main goes on";
  EXPECT_EQ(run.steps[4].outcomes[0].rows.size(), 3u);
  EXPECT_EQ(run.steps[5].outcomes[0].status, PathStatus::kSkipped) << "a fork of a stopped one";
  EXPECT_EQ(run.steps[6].outcomes[0].status, PathStatus::kSkipped);

  // golden regen refuses a backend that fails, naming the same step and error.
  const GoldenPaths paths = GoldenPathsFor(dir / "fails.json");
  RegenOptions refused;
  refused.backend = "refuses-77";
  const RegenResult r = RegenGoldenSet(paths, refused);
  EXPECT_EQ(r.status, RegenStatus::kRefused);
  EXPECT_THAT(r.message, HasSubstr("failed at step 2 prefill(second,n=3): refuses-77: token 77"));

  // golden verify on a golden made by impl: the same error, and main's later rows still compared.
  RegenOptions by_impl;
  by_impl.backend = "impl";
  ASSERT_EQ(RegenGoldenSet(paths, by_impl).status, RegenStatus::kWritten);
  const VerifyReport v = VerifyGoldens({paths}, {"refuses-77"}, {1});
  ASSERT_EQ(v.sets.size(), 1u);
  ASSERT_EQ(v.sets[0].checks.size(), 1u);
  const GoldenCheck& c = v.sets[0].checks[0];
  EXPECT_EQ(c.status, PathStatus::kError);
  EXPECT_THAT(c.message, HasSubstr("failed at step 2 prefill(second,n=3): refuses-77: token 77"));
  EXPECT_FALSE(c.first) << "every row it did produce agrees with the golden";
  EXPECT_EQ(c.rows_compared, 3 + 3) << "main's prefill and main's decode after the error";
}

}  // namespace
}  // namespace kvdiff::testing
