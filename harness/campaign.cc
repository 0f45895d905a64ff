#include "harness/campaign.h"

#include "format/prng.h"
#include "harness/jobs.h"
#include "harness/junit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>

#include "format/error.h"
#include "harness/report.h"

namespace kvdiff::harness {
namespace {

// format/prng.h's SplitMix64 stream: the same sequence everywhere (std distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return format::SplitMix64(state_); }
  // Uniform in [0, n), n >= 1 (the modulo bias is irrelevant at these sizes).
  int64_t Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }
  int64_t Between(int64_t lo, int64_t hi) { return lo + Below(hi - lo + 1); }  // inclusive
  bool Chance(int percent) { return Below(100) < percent; }

 private:
  uint64_t state_;
};

// The longest history a generated conversation reaches: long enough for several chunks and a
// decode run, short enough that a case takes milliseconds on the tiny model.
constexpr int64_t kMaxCaseLength = 48;
constexpr int64_t kMaxConversations = 4;

struct GenConv {
  std::string name;
  int64_t length = 0;
  bool has_last_row = false;
};

}  // namespace

Shard ParseShard(const std::string& text) {
  const auto slash = text.find('/');
  Shard s;
  try {
    KVDIFF_CHECK(slash != std::string::npos, "");
    size_t used = 0;
    s.index = std::stoll(text.substr(0, slash), &used);
    KVDIFF_CHECK(used == slash, "");
    s.count = std::stoll(text.substr(slash + 1), &used);
    KVDIFF_CHECK(used == text.size() - slash - 1, "");
  } catch (const std::exception&) {
    throw InputError(fmt::format("--shard: expected i/n like 1/4, got \"{}\"", text));
  }
  KVDIFF_CHECK(s.count >= 1 && s.index >= 1 && s.index <= s.count,
               "--shard: expected 1 <= i <= n in i/n, got {}/{}", s.index, s.count);
  return s;
}

std::vector<int64_t> ShardCases(int64_t cases, const Shard& shard) {
  std::vector<int64_t> out;
  for (int64_t k = shard.index - 1; k < cases; k += shard.count) out.push_back(k);
  return out;
}

Scenario GenerateCase(const format::LlamaConfig& config, const ModelSpec& model, uint64_t seed,
                      int64_t k) {
  // Mix seed and k so neighbouring cases (and seeds) start far apart.
  Rng mix(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  Rng rng(mix.Next() ^ (static_cast<uint64_t>(k) * 0xD1B54A32D192ED03ull));
  Scenario sc;
  sc.name = fmt::format("case-{}", k);
  sc.description = fmt::format("kvdiff check --seed {}: case {}", seed, k);
  sc.model = model;
  const int64_t max_len = std::min<int64_t>(kMaxCaseLength, config.max_position_embeddings);
  std::vector<GenConv> convs = {{"main"}};
  int64_t next_name = 1;

  auto random_tokens = [&](int64_t n) {
    Tokens t(n);
    for (auto& x : t) x = static_cast<Token>(rng.Below(config.vocab_size));
    return t;
  };
  auto prefill = [&](GenConv& c) {
    Step s;
    s.op = Op::kPrefill;
    s.conversation = c.name;
    const int64_t room = max_len - c.length;
    const int64_t n = rng.Between(1, std::min<int64_t>(room, 12));
    s.tokens = random_tokens(n);
    // A random split into 1..4 chunks (cut points drawn without repeats).
    const int64_t pieces = rng.Between(1, std::min<int64_t>(n, 4));
    if (pieces > 1) {
      std::vector<int64_t> cuts;
      while (static_cast<int64_t>(cuts.size()) < pieces - 1) {
        const int64_t cut = rng.Between(1, n - 1);
        if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end()) cuts.push_back(cut);
      }
      std::sort(cuts.begin(), cuts.end());
      int64_t prev = 0;
      for (int64_t cut : cuts) {
        s.chunks.push_back(cut - prev);
        prev = cut;
      }
      s.chunks.push_back(n - prev);
    }
    c.length += n;
    c.has_last_row = true;
    sc.steps.push_back(s);
  };
  auto pick = [&](auto pred) -> GenConv* {
    std::vector<GenConv*> ok;
    for (auto& c : convs)
      if (pred(c)) ok.push_back(&c);
    return ok.empty() ? nullptr : ok[rng.Below(static_cast<int64_t>(ok.size()))];
  };

  prefill(convs[0]);
  const int64_t n_steps = rng.Between(2, 10);
  for (int64_t i = 0; i < n_steps; ++i) {
    const int64_t roll = rng.Below(100);
    Step s;
    if (roll < 30) {  // prefill
      if (GenConv* c = pick([&](const GenConv& c) { return c.length < max_len; })) prefill(*c);
    } else if (roll < 60) {  // decode
      if (GenConv* c =
              pick([&](const GenConv& c) { return c.has_last_row && c.length < max_len; })) {
        s.op = Op::kDecode;
        s.conversation = c->name;
        s.n = rng.Between(1, std::min<int64_t>(max_len - c->length, 8));
        c->length += s.n;
        sc.steps.push_back(s);
      }
    } else if (roll < 72) {  // truncate (to the same length now and then: keeps the last row)
      if (GenConv* c = pick([](const GenConv& c) { return c.length > 0; })) {
        s.op = Op::kTruncate;
        s.conversation = c->name;
        s.length = rng.Chance(10) ? c->length : rng.Below(c->length);
        if (s.length != c->length) c->has_last_row = false;
        c->length = s.length;
        sc.steps.push_back(s);
      }
    } else if (roll < 84) {  // fork
      if (static_cast<int64_t>(convs.size()) < kMaxConversations) {
        const GenConv src = convs[rng.Below(static_cast<int64_t>(convs.size()))];
        s.op = Op::kFork;
        s.from = src.name;
        s.to = s.conversation = fmt::format("c{}", next_name++);
        GenConv copy = src;
        copy.name = s.to;
        convs.push_back(copy);
        sc.steps.push_back(s);
      }
    } else if (roll < 92) {  // new conversation, started with a prefill
      if (static_cast<int64_t>(convs.size()) < kMaxConversations) {
        s.op = Op::kNewConversation;
        s.name = s.conversation = fmt::format("c{}", next_name++);
        convs.push_back({s.name});
        sc.steps.push_back(s);
        prefill(convs.back());
      }
    } else {  // reset, then a new prompt
      GenConv& c = convs[rng.Below(static_cast<int64_t>(convs.size()))];
      s.op = Op::kReset;
      s.conversation = c.name;
      c.length = 0;
      c.has_last_row = false;
      sc.steps.push_back(s);
      prefill(c);
    }
  }
  return sc;
}

int64_t CampaignReport::Failures() const {
  int64_t n = 0;
  for (const auto& r : results) n += r.passed ? 0 : 1;
  return n;
}

std::string CampaignReport::Summary() const {
  std::string out;
  // The first few failures in full; all of them are in --json and in the out-dir.
  constexpr int64_t kListed = 10;
  int64_t listed = 0;
  for (const auto& r : results) {
    if (r.passed || listed++ >= kListed) continue;
    out += fmt::format("FAIL case {}: {}\n  replay: kvdiff run {}\n", r.index, r.failure,
                       r.scenario_file);
  }
  if (listed > kListed) {
    out += fmt::format("... and {} more failing cases (all listed in --json)\n", listed - kListed);
  }
  out += fmt::format(
      "{}: {} of {} cases run (shard {}/{}, seed {}), {} failed; {} rows compared, worst "
      "difference {} (tolerance {}); {:.2f} s\n",
      Passed() ? "PASS" : "FAIL", results.size(), cases, shard.index, shard.count, seed, Failures(),
      rows_compared, FormatDiff(worst_diff), FormatDiff(tolerance), seconds);
  return out;
}

nlohmann::json CampaignReport::ToJson() const {
  nlohmann::json cases_json = nlohmann::json::array();
  std::vector<int64_t> indices;
  for (const auto& r : results) {
    indices.push_back(r.index);
    nlohmann::json j = {{"case", r.index},
                        {"passed", r.passed},
                        {"steps", r.steps},
                        {"rows_compared", r.rows_compared},
                        {"worst_diff", Number(r.worst_diff)}};
    if (!r.passed) {
      j["failure"] = r.failure;
      j["scenario_file"] = r.scenario_file;
    }
    cases_json.push_back(j);
  }
  return {{"kvdiff_version", KVDIFF_VERSION},
          {"command", "check"},
          {"model", {{"source", model.Describe()}, {"description", model_description}}},
          {"backends", backends},
          {"tolerance", {{"abs", tolerance}}},
          {"seed", seed},
          {"cases", cases},
          {"shard", {{"index", shard.index}, {"count", shard.count}}},
          {"case_indices", indices},
          {"passed", Passed()},
          {"failures", Failures()},
          {"rows_compared", rows_compared},
          {"worst_diff", Number(worst_diff)},
          {"seconds", seconds},
          {"results", cases_json}};
}

std::string CampaignReport::ToJUnit() const {
  return ToJUnitXml("kvdiff", seconds, {ToJUnitSuite()});
}

JUnitSuite CampaignReport::ToJUnitSuite() const {
  JUnitSuite suite;
  suite.name = suite.classname =
      fmt::format("kvdiff.check.seed{}.shard{}of{}", seed, shard.index, shard.count);
  suite.seconds = seconds;
  for (const auto& r : results) {
    JUnitCase c;
    c.name = fmt::format("case {}", r.index);
    if (!r.passed) {
      c.outcome = JUnitOutcome::kFailure;
      c.type = "divergence";
      c.message = r.failure;
      c.text = "replay: kvdiff run " + r.scenario_file;
    }
    suite.cases.push_back(std::move(c));
  }
  return suite;
}

CampaignReport RunCampaign(const ModelSpec& model, const std::vector<const Backend*>& backends,
                           const CampaignOptions& options) {
  return RunCampaignOnJobs(model, {backends}, options);
}

namespace {

// Case k of the campaign on one job's backends.
CaseResult RunCase(const format::LlamaConfig& config, const ModelSpec& model,
                   const std::vector<std::string>& backend_names,
                   const std::vector<const Backend*>& backends, const CampaignOptions& options,
                   int64_t k) {
  Scenario sc = GenerateCase(config, model, options.seed, k);
  sc.backends = backend_names;
  sc.tolerance_abs = options.tolerance_abs;
  ValidateScenario(sc, config);  // a generator bug must not pass as a backend bug
  const RunReport run = RunScenario(sc, backends, options.run);
  CaseResult result;
  result.index = k;
  result.passed = run.Passed();
  result.steps = static_cast<int64_t>(sc.steps.size());
  result.rows_compared = run.rows_compared;
  result.worst_diff = run.worst_diff;
  if (!run.Passed()) {
    if (run.first_divergence) {
      const Divergence& d = *run.first_divergence;
      result.failure = fmt::format(
          "step {} {}: {} vs {} at conversation {}, position {}: max |a-b| {}", d.step, d.params,
          d.a, d.b, d.row.conversation, d.row.position, FormatDiff(d.row.cmp.max_abs_diff));
    } else {
      const BackendFailure& e = *run.first_error;
      result.failure =
          fmt::format("step {} {}: {} threw: {}", e.step, e.params, e.backend, e.message);
    }
    const auto file = options.out_dir / fmt::format("check-seed{}-case{}.json", options.seed, k);
    static std::mutex write_mutex;  // jobs share the out-dir, which the first write creates
    std::lock_guard<std::mutex> lock(write_mutex);
    WriteTextFile(file, sc.ToText());
    result.scenario_file = file.string();
  }
  return result;
}

}  // namespace

CampaignReport RunCampaignOnJobs(const ModelSpec& model,
                                 const std::vector<std::vector<const Backend*>>& jobs,
                                 const CampaignOptions& options) {
  KVDIFF_CHECK(!jobs.empty() && !jobs[0].empty(), "check: no backend to run");
  const std::vector<const Backend*>& backends = jobs[0];
  for (const auto& job : jobs) {
    KVDIFF_CHECK(job.size() == backends.size(), "check: every job needs the same backends");
  }
  const format::LlamaConfig& config = backends[0]->config();
  KVDIFF_CHECK(options.cases >= 0, "--cases: expected a count >= 0, got {}", options.cases);
  KVDIFF_CHECK(options.tolerance_abs >= 0 && std::isfinite(options.tolerance_abs),
               "--tolerance: expected a finite number >= 0, got {}", options.tolerance_abs);
  const auto start = std::chrono::steady_clock::now();
  CampaignReport report;
  report.model = model;
  report.model_description = DescribeModel(config);
  for (const Backend* b : backends) report.backends.push_back(b->Name());
  report.seed = options.seed;
  report.cases = options.cases;
  report.shard = options.shard;
  report.tolerance = options.tolerance_abs;
  const std::vector<int64_t> indices = ShardCases(options.cases, options.shard);
  // Results land in case order whichever job ran them; the report is folded from them after.
  std::vector<CaseResult> results(indices.size());
  int64_t done = 0, failures = 0;
  RunJobs(
      static_cast<int64_t>(indices.size()), static_cast<int>(jobs.size()),
      [&](int job, int64_t i) {
        results[i] = RunCase(config, model, report.backends, jobs[job], options, indices[i]);
      },
      [&](int64_t i) {
        ++done;
        failures += results[i].passed ? 0 : 1;
        if (options.progress) {
          options.progress(done, static_cast<int64_t>(indices.size()), failures);
        }
      });
  for (CaseResult& result : results) {
    report.rows_compared += result.rows_compared;
    if (!(result.worst_diff <= report.worst_diff)) report.worst_diff = result.worst_diff;
    report.results.push_back(std::move(result));
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kvdiff::harness
