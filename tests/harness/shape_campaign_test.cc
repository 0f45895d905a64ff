// check --shapes random: the shape generator's reach and determinism, the inline-config model of a
// scenario file, random-shape campaigns (pass on the backends of this build, one job = two), and
// their power: a port that hard-codes tiny's GQA group size passes every fixed-shape case and is
// caught on the shapes, and the failing case's file replays the failure on its own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>

#include "format/error.h"
#include "format/model_files.h"
#include "harness/backend/registry.h"
#include "harness/campaign/campaign.h"
#include "harness/campaign/shape_generator.h"
#include "harness/compare/tolerance_profile.h"
#include "harness/run/differential_run.h"
#include "harness/scenario/scenario.h"
#include "tests/harness/harness_test_util.h"
#include "tests/test_support.h"

namespace kvdiff::testing {
namespace {

using namespace kvdiff::harness;
using ::testing::HasSubstr;

constexpr int64_t kShapes = 1000;

TEST(ShapeGenerator, ReachesEveryAttentionKindHeadSizeAndFeature) {
  std::set<int64_t> ratios, layers;
  std::map<std::string, int64_t> seen;
  int64_t min_head = 1000, max_head = 0, min_ctx = 1 << 30, max_ctx = 0;
  for (int64_t k = 0; k < kShapes; ++k) {
    const format::LlamaConfig c = DrawShape(0, k);
    EXPECT_NO_THROW(c.Validate()) << ShapeParams(c);
    EXPECT_GE(c.QDim(), kMinShapeWidth) << ShapeParams(c);
    EXPECT_LE(c.QDim(), kMaxShapeWidth) << ShapeParams(c);
    EXPECT_LE(c.hidden_size, kMaxShapeWidth) << ShapeParams(c);
    EXPECT_EQ(c.head_dim % 2, 0) << ShapeParams(c);
    ratios.insert(c.NumRep());
    layers.insert(c.num_hidden_layers);
    ++seen[AttentionKind(c).substr(0, 3)];
    if (c.num_attention_heads > 1 && c.num_key_value_heads == c.num_attention_heads)
      ++seen["MHA>1"];
    ++seen[c.tie_word_embeddings ? "tied" : "untied"];
    ++seen[c.rope_scaling ? "scaled" : "unscaled"];
    if (c.hidden_size != c.QDim()) ++seen["hidden!=qdim"];
    if (c.vocab_size % 2 == 1) ++seen["odd vocab"];
    if (c.head_dim % 4 != 0) ++seen["head_dim 2 mod 4"];
    if (c.rope_theta != 10000.0) ++seen["theta"];
    ++seen["eps " + std::to_string(c.rms_norm_eps)];
    min_head = std::min(min_head, c.head_dim);
    max_head = std::max(max_head, c.head_dim);
    min_ctx = std::min(min_ctx, c.max_position_embeddings);
    max_ctx = std::max(max_ctx, c.max_position_embeddings);
  }
  EXPECT_EQ(ratios, (std::set<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(layers, (std::set<int64_t>{1, 2, 3}));
  for (const char* kind : {"MHA", "MQA", "GQA", "MHA>1", "tied", "untied", "scaled", "unscaled",
                           "hidden!=qdim", "odd vocab", "head_dim 2 mod 4", "theta"}) {
    EXPECT_GE(seen[kind], kShapes / 20) << kind << ": every kind in at least 5% of the shapes";
  }
  EXPECT_EQ(min_head, 8);
  EXPECT_EQ(max_head, 128);
  EXPECT_LT(min_ctx, 48) << "some cases reach the end of their cache";
  EXPECT_GE(max_ctx, 2048);
}

TEST(ShapeGenerator, IsAFunctionOfSeedAndCaseAlone) {
  std::set<std::string> distinct;
  for (int64_t k = 0; k < 50; ++k) {
    const ModelSpec a = ShapeModel(4, k), b = ShapeModel(4, k);
    EXPECT_EQ(format::ConfigToJson(*a.config), format::ConfigToJson(*b.config));
    EXPECT_EQ(a.seed, b.seed);
    distinct.insert(a.Describe());
  }
  EXPECT_EQ(distinct.size(), 50u) << "neighbouring cases draw different shapes";
  EXPECT_NE(format::ConfigToJson(DrawShape(4, 0)), format::ConfigToJson(DrawShape(5, 0)));
}

// ---- The inline-config model of a scenario file ---------------------------------------------

Scenario OnShape(const ModelSpec& model) {
  Scenario sc;
  sc.model = model;
  sc.steps = {Step::Prefill("main", {1, 2, 3}), Step::Decode("main", 2)};
  return sc;
}

TEST(InlineConfigModel, RoundTripsThroughTheScenarioFile) {
  for (int64_t k = 0; k < 20; ++k) {
    const ModelSpec model = ShapeModel(9, k);
    const Scenario back = ParseScenario(OnShape(model).ToText());
    ASSERT_TRUE(back.model.config.has_value());
    EXPECT_FALSE(back.model.preset || back.model.path || back.model.llama2c);
    EXPECT_EQ(format::ConfigToJson(*back.model.config), format::ConfigToJson(*model.config));
    EXPECT_EQ(back.model.seed, model.seed);
    EXPECT_EQ(back.model.Describe(), model.Describe());
    EXPECT_EQ(back.model.ToJson(), model.ToJson());
  }
  const ModelSpec model = ShapeModel(9, 3);
  EXPECT_THAT(model.Describe(), HasSubstr("config(layers="));
  const auto weights = LoadModelFor(model);
  const format::ModelWeights direct = format::MakeRandomModel(*model.config, model.seed);
  EXPECT_EQ(format::ConfigToJson(weights->config), format::ConfigToJson(*model.config));
  EXPECT_EQ(weights->Get("model.embed_tokens.weight").data,
            direct.Get("model.embed_tokens.weight").data);
}

std::string ModelError(const std::string& model_json) {
  try {
    ParseScenario(R"({"model": )" + model_json +
                  R"(, "steps": [{"op": "prefill", "tokens": [1]}]})");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(InlineConfigModel, RefusesBadInputNamingTheField) {
  const std::string good =
      R"("hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 99,
         "max_position_embeddings": 64)";
  EXPECT_EQ(ModelError(R"({"config": {)" + good + R"(}, "seed": 3})"), "(accepted)");
  EXPECT_THAT(ModelError(R"({"config": {)" + good + R"(}, "seed": 3, "preset": "tiny"})"),
              HasSubstr("model: unknown field \"preset\" (expected one of: config, scale, seed)"));
  // A config model takes a scale, as a preset does (the demanding variant of a shape).
  EXPECT_EQ(ModelError(R"({"config": {)" + good + R"(}, "seed": 3, "scale": "demanding"})"),
            "(accepted)");
  EXPECT_THAT(ModelError(R"({"config": {)" + good + R"(}, "seed": 3, "scale": "loud"})"),
              HasSubstr("model.scale"));
  EXPECT_THAT(ModelError(R"({"config": {)" + good + R"(, "num_kv_heads": 1}})"),
              HasSubstr("model.config: unknown field \"num_kv_heads\" (expected one of: "));
  EXPECT_THAT(ModelError(R"({"config": {)" + good + R"(, "head_dim": 7}})"),
              HasSubstr("model.config field \"head_dim\": expected an even number"));
  EXPECT_THAT(ModelError(R"({"config": {"hidden_size": 64}})"),
              HasSubstr("model.config: missing required field \"intermediate_size\""));
  EXPECT_THAT(ModelError(R"({"config": {)" + good +
                         R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8,
                              "low_freq_factor": 1, "high_freq_factor": 4,
                              "original_max_position_embeddings": 32, "beta": 2}}})"),
              HasSubstr("model.config field \"rope_scaling\": unknown field \"beta\""));
  EXPECT_THAT(ModelError(R"({"config": "config.json"})"),
              HasSubstr("model.config: expected an object of config.json's fields"));
  EXPECT_THAT(ModelError(R"({"config": {)" + good + R"(}, "seed": -1})"),
              HasSubstr("model.seed: expected an integer >= 0, got -1"));
}

// ---- Random-shape campaigns ----------------------------------------------------------------

CampaignOptions Options(int64_t cases, const std::filesystem::path& out_dir) {
  CampaignOptions options;
  options.cases = cases;
  options.out_dir = out_dir;
  // As `kvdiff check` resolves it: pairs with a float32-angle backend (ref) get the rope-f32
  // allowance; any other pair keeps the flat gate.
  options.gate.rope_f32_per_position = RopeF32Profile().per_position;
  return options;
}

nlohmann::json WithoutSeconds(nlohmann::json j) {
  j.erase("seconds");
  return j;
}

TEST(RandomShapeCampaign, PassesOnThisBuildsBackendsAndOneJobEqualsTwo) {
  TempDir tmp;
  const std::vector<std::string> backends = DefaultBackends();  // impl,ref; impl without LibTorch
  const CampaignReport one =
      RunRandomShapeCampaign(backends, BackendOptions{1}, 1, Options(200, tmp.path() / "one"));
  EXPECT_TRUE(one.Passed()) << one.Summary();
  EXPECT_EQ(one.results.size(), 200u);
  EXPECT_GT(one.rows_compared, 10000);
  EXPECT_TRUE(one.random_shapes);
  EXPECT_EQ(one.coverage.cases, 200);
  EXPECT_GT(one.coverage.shapes.size(), 190u) << "a shape per case, nearly all distinct";
  EXPECT_EQ(one.ToJson().at("shapes"), "random");
  EXPECT_EQ(one.ToJson().at("model").at("source"), "random shapes");
  for (const CaseResult& r : one.results) EXPECT_THAT(r.shape, HasSubstr("layers="));
  // Each case's history is capped by its own context; the coverage's context is the largest.
  int64_t largest = 0;
  for (int64_t k = 0; k < 200; ++k) {
    largest = std::max(largest, CampaignMaxLength(DrawShape(0, k), kDefaultMaxLength));
  }
  EXPECT_EQ(one.coverage.context, largest);
  EXPECT_GT(one.coverage.cases_at_context, 0) << "short contexts are reached";
  const CampaignReport two =
      RunRandomShapeCampaign(backends, BackendOptions{1}, 2, Options(200, tmp.path() / "one"));
  EXPECT_EQ(WithoutSeconds(two.ToJson()), WithoutSeconds(one.ToJson()));
  EXPECT_EQ(two.ToJUnitSuite().cases.size(), one.ToJUnitSuite().cases.size());
}

// ---- Power: a bug only some shapes show -------------------------------------------------------

// A port that hard-codes the GQA group size of the model it was written for (tiny: 4 query heads
// on 2 KV heads): query head h reads KV head (h / 2) mod n_kv instead of h / n_rep. Right for
// n_rep = 2 and for MQA; wrong for MHA and for GQA with n_rep >= 3. Built outside impl as impl
// over rewritten weights: a multi-head model whose KV head h is the original's head (h / 2) mod
// n_kv, computes exactly what the mutant computes.
std::shared_ptr<const format::ModelWeights> PairedKvHeads(const format::ModelWeights& w) {
  auto out = std::make_shared<format::ModelWeights>(w);
  const format::LlamaConfig& c = w.config;
  out->config.num_key_value_heads = c.num_attention_heads;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (const char* proj : {"k_proj", "v_proj"}) {
      const std::string name = fmt::format("model.layers.{}.self_attn.{}.weight", l, proj);
      const format::Tensor& in = w.Get(name);  // (n_kv * head_dim, hidden)
      format::Tensor& t = out->tensors.at(name);
      const int64_t row = c.head_dim * c.hidden_size;  // one head's rows
      t.shape = {c.num_attention_heads * c.head_dim, c.hidden_size};
      t.data.resize(static_cast<size_t>(c.num_attention_heads * row));
      for (int64_t h = 0; h < c.num_attention_heads; ++h) {
        const int64_t src = (h / 2) % c.num_key_value_heads;
        std::copy(in.data.begin() + src * row, in.data.begin() + (src + 1) * row,
                  t.data.begin() + h * row);
      }
    }
  }
  return out;
}

// A port that ignores the config's rope_scaling (a llama3 scaling misread, as in unsloth#6197 or
// vllm#48351, in its bluntest form): impl over the same weights with the scaling removed.
std::shared_ptr<const format::ModelWeights> WithoutRopeScaling(const format::ModelWeights& w) {
  auto out = std::make_shared<format::ModelWeights>(w);
  out->config.rope_scaling.reset();
  return out;
}

// impl run on rewritten weights (a mutant), under its own name and the model's own config.
class RewrittenImplBackend : public Backend {
 public:
  using Rewrite =
      std::shared_ptr<const format::ModelWeights> (*)(const format::ModelWeights& weights);
  RewrittenImplBackend(BackendInfo info, std::shared_ptr<const format::ModelWeights> weights,
                       Rewrite rewrite)
      : info_(std::move(info)),
        config_(weights->config),
        inner_(MakeBackend("impl", rewrite(*weights), 1)) {}
  const BackendInfo& Info() const override { return info_; }
  const format::LlamaConfig& config() const override { return config_; }  // the model's own
  Logits ForwardFull(const Tokens& tokens, ForwardTrace* trace) const override {
    return inner_->ForwardFull(tokens, trace);
  }
  std::unique_ptr<BackendSession> NewSession() const override { return inner_->NewSession(); }

 private:
  BackendInfo info_;
  format::LlamaConfig config_;
  std::unique_ptr<Backend> inner_;
};

constexpr const char* kMutant = "impl-kv-pairs";
constexpr const char* kUnscaled = "impl-ignoring-rope-scaling";

void RegisterOnce(const char* name, const char* description,
                  RewrittenImplBackend::Rewrite rewrite) {
  if (BackendRegistry::Global().Has(name)) return;
  BackendInfo info;
  info.name = name;
  info.description = description;
  info.dtype = "float32";
  BackendRegistry::Global().Register(
      info,
      [rewrite](const BackendInfo& i, std::shared_ptr<const format::ModelWeights> w,
                const BackendOptions&) -> std::unique_ptr<Backend> {
        return std::make_unique<RewrittenImplBackend>(i, std::move(w), rewrite);
      });
}

void RegisterMutantOnce() {
  RegisterOnce(kMutant, "impl with query head h reading KV head (h / 2) mod n_kv", PairedKvHeads);
}

TEST(RandomShapeCampaign, CatchesABugTheFixedPresetCannotAndItsFileReplaysIt) {
  RegisterMutantOnce();
  TempDir tmp;
  const std::vector<std::string> names = {"impl", kMutant};
  // The fixed campaign on the tiny preset (n_rep 2): every case passes.
  ModelSpec tiny;
  tiny.preset = "tiny";
  tiny.seed = 7;
  const auto weights = LoadModelFor(tiny);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<const Backend*> backends;
  for (const std::string& name : names) {
    owned.push_back(BackendRegistry::Global().Make(name, weights, BackendOptions{1}));
    backends.push_back(owned.back().get());
  }
  const CampaignReport fixed = RunCampaign(tiny, backends, Options(100, tmp.path() / "fixed"));
  EXPECT_TRUE(fixed.Passed()) << fixed.Summary();

  // Random shapes: the cases on MHA or GQA n_rep >= 3 fail, those on n_rep 2 or MQA pass.
  const CampaignReport random =
      RunRandomShapeCampaign(names, BackendOptions{1}, 2, Options(60, tmp.path() / "random"));
  ASSERT_FALSE(random.Passed());
  int64_t wrong_shapes = 0;
  const CaseResult* first_failure = nullptr;
  for (const CaseResult& r : random.results) {
    const format::LlamaConfig c = DrawShape(0, r.index);
    const bool affected = c.num_key_value_heads > 1 && c.NumRep() != 2;
    wrong_shapes += affected ? 1 : 0;
    EXPECT_EQ(r.passed, !affected) << r.shape << ": " << r.failure;
    if (!r.passed && !first_failure) first_failure = &r;
  }
  EXPECT_EQ(random.Failures(), wrong_shapes);
  ASSERT_NE(first_failure, nullptr);

  // The failing case's file is self-contained: its model is the shape, inline.
  const Scenario sc = LoadScenario(first_failure->scenario_file);
  ASSERT_TRUE(sc.model.config.has_value());
  EXPECT_EQ(ShapeParams(*sc.model.config), first_failure->shape);
  const auto case_weights = LoadModelFor(sc.model);
  std::vector<std::unique_ptr<Backend>> replay_owned;
  std::vector<const Backend*> replay;
  for (const std::string& name : sc.backends) {
    replay_owned.push_back(BackendRegistry::Global().Make(name, case_weights, BackendOptions{1}));
    replay.push_back(replay_owned.back().get());
  }
  Scenario prepared = sc;
  PrepareScenario(prepared, *case_weights);
  const RunReport run = RunScenario(prepared, replay, {});
  ASSERT_TRUE(run.first_divergence);
  EXPECT_THAT(first_failure->failure,
              HasSubstr(fmt::format("step {} {}: ", run.first_divergence->step,
                                    run.first_divergence->params)));
}

// The fixed presets have no rope_scaling, so only random shapes can see a port that ignores it:
// every case on a llama3-scaled shape fails (its original context is 8..64 positions, so most
// frequencies are scaled and every position past 0 moves), every other case passes.
TEST(RandomShapeCampaign, CatchesAPortThatIgnoresRopeScalingOnTheScaledShapesAlone) {
  RegisterOnce(kUnscaled, "impl reading the config as if it had no rope_scaling",
               WithoutRopeScaling);
  TempDir tmp;
  const CampaignReport random = RunRandomShapeCampaign({"impl", kUnscaled}, BackendOptions{1}, 2,
                                                       Options(60, tmp.path() / "random"));
  int64_t scaled = 0;
  for (const CaseResult& r : random.results) {
    const bool is_scaled = DrawShape(0, r.index).rope_scaling.has_value();
    scaled += is_scaled ? 1 : 0;
    EXPECT_EQ(r.passed, !is_scaled) << r.shape << ": " << r.failure;
  }
  EXPECT_GT(scaled, 10) << "too few scaled shapes to show anything";
  EXPECT_EQ(random.Failures(), scaled);
}

// ---- An engine that refuses some shapes ------------------------------------------------------

constexpr const char* kPicky = "impl-picky";

// impl, except that it refuses a model whose head_dim is not a multiple of 32 when built (as
// llama.cpp's q8_0 cache does).
void RegisterPickyOnce() {
  if (BackendRegistry::Global().Has(kPicky)) return;
  BackendInfo info;
  info.name = kPicky;
  info.description = "impl, refusing head_dim not a multiple of 32";
  info.dtype = "float32";
  BackendRegistry::Global().Register(
      info,
      [](const BackendInfo&, std::shared_ptr<const format::ModelWeights> w,
         const BackendOptions&) -> std::unique_ptr<Backend> {
        if (w->config.head_dim % 32 != 0) {
          throw InputError(fmt::format("head_dim {} is not a multiple of 32", w->config.head_dim));
        }
        return MakeBackend("impl", std::move(w), 1);
      });
}

TEST(RandomShapeCampaign, ABackendRefusingAShapeFailsThatCaseSayingWhy) {
  RegisterPickyOnce();
  TempDir tmp;
  const std::vector<std::string> names = {"impl", kPicky};
  const CampaignReport r =
      RunRandomShapeCampaign(names, BackendOptions{1}, 2, Options(40, tmp.path() / "f"));
  int64_t refused = 0;
  for (const CaseResult& c : r.results) {
    const format::LlamaConfig shape = DrawShape(0, c.index);
    if (shape.head_dim % 32 == 0) {
      EXPECT_TRUE(c.passed) << c.shape << ": " << c.failure;
      continue;
    }
    ++refused;
    EXPECT_FALSE(c.passed);
    EXPECT_EQ(c.failure, fmt::format("backend impl-picky could not be built for this shape: "
                                     "head_dim {} is not a multiple of 32",
                                     shape.head_dim));
    // Its file names the shape, and building the backend for it refuses it again.
    const Scenario sc = LoadScenario(c.scenario_file);
    EXPECT_THAT([&] { BackendRegistry::Global().Make(kPicky, LoadModelFor(sc.model)); },
                ::testing::ThrowsMessage<InputError>(HasSubstr("is not a multiple of 32")));
  }
  EXPECT_GT(refused, 0);
  EXPECT_LT(refused, 40);
  EXPECT_EQ(r.Failures(), refused);
  EXPECT_EQ(r.coverage.cases, 40 - refused) << "the coverage counts the cases that ran";
}

// ---- The command line ------------------------------------------------------------------------

TEST(RandomShapeCampaign, TheCommandLineRefusesAModelAndRunsItsOwnFailingCase) {
  TempDir tmp;
  const CommandResult with_model =
      RunKvdiff("check --shapes random --model somewhere --cases 3", tmp.path());
  EXPECT_EQ(with_model.exit_code, 2);
  EXPECT_THAT(with_model.err, HasSubstr("--shapes random cannot be combined with --model"));
  const CommandResult with_preset =
      RunKvdiff("check --shapes random --preset tiny --cases 3", tmp.path());
  EXPECT_EQ(with_preset.exit_code, 2);
  EXPECT_THAT(with_preset.err, HasSubstr("--preset/--model-seed"));
  EXPECT_EQ(RunKvdiff("check --shapes square --cases 3", tmp.path()).exit_code, 2);

  // A tolerance of 0 fails every case on float rounding: each writes a self-contained file that
  // `kvdiff run` replays on its own.
  const CommandResult check = RunKvdiff(
      "check --shapes random --cases 4 --backends impl --tolerance 0 --jobs 2 --json r.json "
      "--junit r.xml --out-dir fails",
      tmp.path());
  EXPECT_EQ(check.exit_code, 1) << check.out << check.err;
  EXPECT_THAT(check.out, HasSubstr("kvdiff check: random shapes"));
  EXPECT_THAT(check.out, HasSubstr("FAIL case 0 (layers="));
  const std::string junit = ReadFile(tmp.path() / "r.xml");
  EXPECT_EQ(XmlProblem(junit, nullptr), "");
  EXPECT_THAT(junit, HasSubstr("shape: layers=")) << "a CI failure names the case's shape";
  const nlohmann::json report = nlohmann::json::parse(ReadFile(tmp.path() / "r.json"));
  EXPECT_EQ(report.at("shapes"), "random");
  const CommandResult run = RunKvdiff("run fails/check-seed0-case0.json --tolerance 0", tmp.path());
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("model: config(layers="));
  EXPECT_EQ(RunKvdiff("run fails/check-seed0-case0.json --tolerance 1e-4", tmp.path()).exit_code, 0)
      << "within the default gate (the file records the campaign's tolerance, 0)";
}

TEST(RandomShapeCampaign, ShardsMergeIntoTheWholeCampaign) {
  TempDir tmp;
  const std::string common = "check --shapes random --cases 12 --backends impl --seed 5 ";
  ASSERT_EQ(RunKvdiff(common + "--json whole.json", tmp.path()).exit_code, 0);
  ASSERT_EQ(RunKvdiff(common + "--shard 1/2 --json s1.json", tmp.path()).exit_code, 0);
  ASSERT_EQ(RunKvdiff(common + "--shard 2/2 --json s2.json", tmp.path()).exit_code, 0);
  const CommandResult merge = RunKvdiff("merge s1.json s2.json --json merged.json", tmp.path());
  ASSERT_EQ(merge.exit_code, 0) << merge.out << merge.err;
  const auto whole = nlohmann::json::parse(ReadFile(tmp.path() / "whole.json"));
  const auto merged = nlohmann::json::parse(ReadFile(tmp.path() / "merged.json"));
  EXPECT_EQ(merged.at("shapes"), "random");
  ASSERT_EQ(merged.at("results").size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    nlohmann::json a = whole.at("results")[i], b = merged.at("results")[i];
    EXPECT_EQ(a, b) << "case " << i << ": the same shape, steps and figures";
  }
  nlohmann::json wc = whole.at("coverage"), mc = merged.at("coverage");
  EXPECT_EQ(wc.at("shapes"), mc.at("shapes"));
  EXPECT_EQ(wc.at("context"), mc.at("context"));
  EXPECT_EQ(wc.at("cases_at_context"), mc.at("cases_at_context"));
}

}  // namespace
}  // namespace kvdiff::testing
