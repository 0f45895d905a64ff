#include "harness/conform/conform.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>

#include "format/error.h"
#include "harness/campaign/campaign.h"
#include "harness/conform/conform_detail.h"
#include "harness/report/junit.h"
#include "harness/report/run_report.h"
#include "harness/run/differential_run.h"

namespace kvdiff::harness {
namespace {

using conform_detail::BadCall;
using conform_detail::CheckDef;
using conform_detail::Fail;
using conform_detail::Nonconformance;
using conform_detail::NotApplicable;
using conform_detail::Played;
using conform_detail::Script;

std::string CheckPrefill(Script& s) {
  const int64_t n = std::min<int64_t>(24, s.max_positions());
  s.Append("main", s.RandomTokens(n), fmt::format("prefill of {}", n));
  return s.Play().Figures();
}

// The decode steps append tokens drawn at random, not chosen: each is one call of one token.
std::string CheckChunksAndDecode(Script& s) {
  for (int64_t n : {7, 1, 9}) s.Append("main", s.RandomTokens(n), fmt::format("chunk of {}", n));
  for (int i = 0; i < 5; ++i)
    s.Append("main", s.RandomTokens(1), fmt::format("decode step {}", i + 1));
  return s.Play().Figures() + "; chunks 7+1+9, 5 decode steps";
}

std::string CheckTruncate(Script& s) {
  s.Append("main", s.RandomTokens(12), "prefill of 12");
  s.Add(Step::Truncate("main", 6), "truncate to 6");
  s.Append("main", s.RandomTokens(4), "append of 4 after truncate to 6");
  s.Add(Step::Truncate("main", 0), "truncate to 0");
  s.Append("main", s.RandomTokens(3), "append of 3 after truncate to 0");
  return s.Play().Figures() + "; 12 -> 6 -> +4, -> 0 -> +3";
}

std::string CheckFork(Script& s) {
  s.Append("main", s.RandomTokens(8), "prefill of 8");
  s.Add(Step::Fork("main", "child"), "fork at 8");
  // Interleaved, different tokens: each side must see only its own.
  s.Append("main", s.RandomTokens(3), "parent +3 after the fork");
  s.Append("child", s.RandomTokens(2), "child +2 after the fork");
  s.Append("main", s.RandomTokens(1), "parent +1");
  s.Append("child", s.RandomTokens(1), "child +1");
  s.Add(Step::End("main"), "the parent freed");  // the child outlives its parent
  s.Append("child", s.RandomTokens(2), "child +2 with the parent freed");
  s.Add(Step::End("child"), "the child freed");  // two sessions at most: an engine may hold two
  s.Add(Step::NewConversation("empty"), "a new session");
  s.Add(Step::Fork("empty", "empty-fork"), "fork of an empty session");
  s.Append("empty-fork", s.RandomTokens(3), "fork of an empty session +3");
  return s.Play().Figures() + "; interleaved, parent freed, fork of an empty session";
}

std::string CheckReset(Script& s) {
  s.Append("main", s.RandomTokens(10), "prefill of 10");
  s.Add(Step::Reset("main"), "reset");
  s.Append("main", s.RandomTokens(4), "prefill of 4 after reset");
  return s.Play().Figures();
}

std::string CheckSessionsIndependent(Script& s) {
  s.Add(Step::NewConversation("b"), "a new session");
  for (int i = 0; i < 3; ++i) {
    s.Append("main", s.RandomTokens(3), fmt::format("session A, call {}", i + 1));
    s.Append("b", s.RandomTokens(2), fmt::format("session B, call {}", i + 1));
  }
  return s.Play().Figures() + "; two sessions of one engine, interleaved";
}

// The same scenario replayed twice on new sessions: every row bit for bit.
std::string CheckDeterministic(Script& s) {
  s.Append("main", s.RandomTokens(9), "prefill of 9");
  for (int i = 0; i < 3; ++i)
    s.Append("main", s.RandomTokens(1), fmt::format("decode step {}", i + 1));
  const Recording runs[2] = {s.ReplayOnly(), s.ReplayOnly()};
  if (runs[0].rows.size() != runs[1].rows.size())
    Fail("two runs gave {} and {} rows", runs[0].rows.size(), runs[1].rows.size());
  for (size_t r = 0; r < runs[0].rows.size(); ++r) {
    const std::vector<float>& a = runs[0].rows[r].logits;
    const std::vector<float>& b = runs[1].rows[r].logits;
    for (size_t v = 0; v < a.size(); ++v) {
      if (std::memcmp(&a[v], &b[v], sizeof(float)) != 0)
        Fail("row {}, logit {}: {} in the first run, {} in the second", r, v, a[v], b[v]);
    }
  }
  return "prefill of 9 and 3 decode steps, twice: bit-identical";
}

// A bad call on the script's first session ("main"), then an append of 2 that must still be right.
void RefuseOnMain(Script& s, const std::string& what,
                  const std::function<void(BackendSession&)>& call) {
  s.Refuse(what, [call](const Backend&, const std::vector<BackendSession*>& sessions) {
    call(*sessions.at(0));
  });
  s.Append("main", s.RandomTokens(2), what + ", then an append");
}

std::string CheckTokenOutOfRange(Script& s) {
  s.Append("main", s.RandomTokens(4), "prefill of 4");
  const Token vocab = static_cast<Token>(s.vocab());
  RefuseOnMain(s, fmt::format("append of token {} (vocab_size {})", vocab, vocab),
               [vocab](BackendSession& session) {
                 session.Append({1, vocab}, nullptr);
               });
  RefuseOnMain(s, "append of token -1",
               [](BackendSession& session) { session.Append({-1}, nullptr); });
  return s.Play().Refused();
}

std::string CheckTruncateBeyondLength(Script& s) {
  s.Append("main", s.RandomTokens(5), "prefill of 5");
  RefuseOnMain(s, "truncate to 6 of 5", [](BackendSession& session) { session.Truncate(6); });
  RefuseOnMain(s, "truncate to -1", [](BackendSession& session) { session.Truncate(-1); });
  return s.Play().Refused();
}

std::string CheckEmptyAppend(Script& s) {
  s.Append("main", s.RandomTokens(3), "prefill of 3");
  RefuseOnMain(s, "append of no tokens",
               [](BackendSession& session) { session.Append({}, nullptr); });
  return s.Play().Refused();
}

// Fills a session to the positions it holds (the engine's max_length when it declares one, else
// max_position_embeddings) in chunks of 128 (every row held to the oracle), then one more token
// must be refused and change nothing: an engine that declares fewer positions than it holds fails.
std::string CheckCapacity(Script& s, int64_t max_fill) {
  const int64_t capacity = s.max_positions();
  if (capacity > max_fill)
    throw NotApplicable(
        fmt::format("{} is above the fill limit {}", s.max_positions_name(), max_fill));
  int64_t length = 0;
  for (; length + 128 < capacity; length += 128)
    s.Append("main", s.RandomTokens(128), fmt::format("the chunk from {}", length));
  s.Append("main", s.RandomTokens(capacity - length),
           fmt::format("the last chunk up to {}", capacity));
  s.Refuse(fmt::format("position {} ({})", capacity, s.max_positions_name()),
           [](const Backend&, const std::vector<BackendSession*>& sessions) {
             sessions.at(0)->Append({1}, nullptr);
           });
  s.Add(Step::Reset("main"), "a reset after the refusal");  // the step the refusal precedes
  const Played played = s.Play();
  return fmt::format("{} positions held; {} refused: {}", capacity, capacity + 1,
                     played.refusals.back().substr(0, 60));
}

ConformCheck RunOne(const CheckDef& def, Script& script) {
  ConformCheck check;
  check.name = def.name;
  check.what = def.what;
  const auto start = std::chrono::steady_clock::now();
  try {
    check.detail = def.run(script);
  } catch (const NotApplicable& e) {
    check.result = ConformCheck::Result::kSkip;
    check.detail = e.what();
  } catch (const std::exception& e) {  // Nonconformance, or the script's own mistake
    check.result = ConformCheck::Result::kFail;
    check.detail = e.what();
  }
  check.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return check;
}

const char* ResultName(ConformCheck::Result r) {
  switch (r) {
    case ConformCheck::Result::kPass:
      return "PASS";
    case ConformCheck::Result::kFail:
      return "FAIL";
    case ConformCheck::Result::kSkip:
      return "skip";
  }
  return "?";
}

}  // namespace

ConformReport RunConformance(const ModelSpec& model, const Backend& engine, const Backend& oracle,
                             const ConformOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ConformReport report;
  report.backend = engine.Name();
  report.oracle = oracle.Name();
  report.model = fmt::format("{} ({})", model.Describe(), DescribeModel(engine.config()));
  report.tolerance = options.gate.abs;
  KVDIFF_CHECK(engine.config().vocab_size == oracle.config().vocab_size,
               "conform: {} and {} see different models", engine.Name(), oracle.Name());

  std::vector<CheckDef> checks = {
      {"prefill", "one append of 24 tokens: every row equals the oracle's", CheckPrefill},
      {"chunks", "a prompt in chunks, then decode steps: every row, and Length()",
       CheckChunksAndDecode},
      {"truncate", "truncate forgets positions: appends after it continue from there",
       CheckTruncate},
      {"fork", "a fork is a deep copy: both sides evolve independently", CheckFork},
      {"reset", "reset starts a new conversation at position 0", CheckReset},
      {"sessions", "sessions of one engine share nothing", CheckSessionsIndependent},
      {"deterministic", "the same calls give bit-identical logits", CheckDeterministic},
      {"token-out-of-range", "tokens outside the vocabulary are refused, changing nothing",
       CheckTokenOutOfRange},
      {"truncate-beyond", "truncate beyond the length is refused, changing nothing",
       CheckTruncateBeyondLength},
      {"empty-append", "an append of no tokens is refused, changing nothing", CheckEmptyAppend},
      {"capacity",
       "the positions a session holds (max_length, else max_position_embeddings) are held; one "
       "more is refused",
       [&options](Script& s) { return CheckCapacity(s, options.max_capacity_fill); }},
  };
  // After the others, so that each of those draws the tokens it drew before there were batch,
  // shift and edge checks (a check's tokens follow from its place in the list).
  for (const CheckDef& batch : conform_detail::BatchChecks()) checks.push_back(batch);
  for (const CheckDef& shift : conform_detail::ShiftChecks()) checks.push_back(shift);
  for (const CheckDef& edge : conform_detail::EdgeChecks()) checks.push_back(edge);
  const Backend* arbiter = options.shift_arbiter;
  if (!arbiter && oracle.Info().shifts) arbiter = &oracle;
  if (arbiter && engine.Info().shifts) report.shift_arbiter = arbiter->Name();
  for (size_t i = 0; i < checks.size(); ++i) {
    // Each check draws its own tokens: one check's outcome never moves another's inputs.
    Script script(engine, oracle, arbiter, options.gate, options.seed * 1000 + i);
    report.checks.push_back(RunOne(checks[i], script));
  }

  if (options.campaign_cases > 0) {
    ConformCheck check;
    check.name = "campaign";
    check.what = fmt::format("`kvdiff check` with {} random scenarios beside {}",
                             options.campaign_cases, oracle.Name());
    CampaignOptions campaign;
    campaign.seed = options.seed;
    campaign.cases = options.campaign_cases;
    campaign.out_dir = options.out_dir;
    campaign.gate = options.gate;
    campaign.shrink_cases = 1;  // the row names one case: its smallest reproduction is the one
    const CampaignReport r = RunCampaign(model, {&oracle, &engine}, campaign);
    check.seconds = r.seconds;
    if (r.Passed()) {
      check.detail = fmt::format("{} cases, {} rows, worst {}", r.results.size(), r.rows_compared,
                                 WorstRowText(r.worst));
    } else {
      check.result = ConformCheck::Result::kFail;
      for (const CaseResult& c : r.results) {
        if (c.passed) continue;
        check.detail =
            fmt::format("{} of {} cases failed; case {}: {} (replay: kvdiff run {})", r.Failures(),
                        r.results.size(), c.index, c.failure, c.scenario_file);
        if (c.shrunk)
          check.detail += fmt::format("; shrunk to {} step{}: kvdiff run {}", c.shrunk->steps,
                                      c.shrunk->steps == 1 ? "" : "s", c.shrunk->file);
        break;
      }
    }
    report.checks.push_back(check);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

int64_t ConformReport::Failures() const {
  return std::count_if(checks.begin(), checks.end(), [](const ConformCheck& c) {
    return c.result == ConformCheck::Result::kFail;
  });
}

std::string ConformReport::Table() const {
  std::string out = fmt::format("  {:<20} {:<6} {}\n", "check", "result", "detail");
  int64_t passed = 0, skipped = 0;
  for (const ConformCheck& c : checks) {
    out += fmt::format("  {:<20} {:<6} {}\n", c.name, ResultName(c.result), c.detail);
    passed += c.result == ConformCheck::Result::kPass;
    skipped += c.result == ConformCheck::Result::kSkip;
  }
  out += fmt::format(
      "{}: {} of {} checks passed, {} failed{} (against {}, tolerance {:.1e}); {:.2f} s\n",
      Passed() ? "PASS" : "FAIL", passed, checks.size(), Failures(),
      skipped ? fmt::format(", {} skipped", skipped) : "", oracle, tolerance, seconds);
  return out;
}

nlohmann::json ConformReport::ToJson() const {
  nlohmann::json checks_json = nlohmann::json::array();
  for (const ConformCheck& c : checks) {
    checks_json.push_back({{"name", c.name},
                           {"what", c.what},
                           {"result", ResultName(c.result)},
                           {"detail", c.detail},
                           {"seconds", c.seconds}});
  }
  return {{"backend", backend},     {"oracle", oracle},       {"shift_arbiter", shift_arbiter},
          {"model", model},         {"tolerance", tolerance}, {"passed", Passed()},
          {"failures", Failures()}, {"seconds", seconds},     {"checks", checks_json}};
}

std::string ConformReport::ToJUnit() const {
  JUnitSuite suite;
  suite.name = "conform " + backend;
  suite.classname = "kvdiff.conform";
  suite.seconds = seconds;
  suite.properties = {{"backend", backend},
                      {"oracle", oracle},
                      {"shift_arbiter", shift_arbiter},
                      {"model", model},
                      {"tolerance", fmt::format("{}", tolerance)}};
  for (const ConformCheck& c : checks) {
    JUnitCase jc;
    jc.name = c.name;
    if (c.result == ConformCheck::Result::kFail) {
      jc.outcome = JUnitOutcome::kFailure;
      jc.type = "nonconformance";
      jc.text = c.what + "\n" + c.detail;
    } else if (c.result == ConformCheck::Result::kSkip) {
      jc.outcome = JUnitOutcome::kSkipped;
      jc.text = c.detail;
    }
    suite.cases.push_back(jc);
  }
  return ToJUnitXml("kvdiff conform", seconds, {suite});
}

}  // namespace kvdiff::harness
