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

using conform_detail::CheckDef;
using conform_detail::Nonconformance;
using conform_detail::NotApplicable;
using conform_detail::Probe;
using conform_detail::Refused;

std::string CheckPrefill(Probe& p) {
  auto c = p.New();
  p.Append(c, p.RandomTokens(std::min<int64_t>(24, p.max_positions())), "prefill of 24");
  return p.Figures();
}

std::string CheckChunksAndDecode(Probe& p) {
  auto c = p.New();
  for (int64_t n : {7, 1, 9}) p.Append(c, p.RandomTokens(n), fmt::format("chunk of {}", n));
  for (int i = 0; i < 5; ++i) p.Append(c, p.RandomTokens(1), fmt::format("decode step {}", i + 1));
  return p.Figures() + "; chunks 7+1+9, 5 decode steps";
}

std::string CheckTruncate(Probe& p) {
  auto c = p.New();
  p.Append(c, p.RandomTokens(12), "prefill of 12");
  c.session->Truncate(6);
  c.history.resize(6);
  p.ExpectLength(c, "truncate to 6");
  p.Append(c, p.RandomTokens(4), "append of 4 after truncate to 6");
  c.session->Truncate(0);
  c.history.clear();
  p.ExpectLength(c, "truncate to 0");
  p.Append(c, p.RandomTokens(3), "append of 3 after truncate to 0");
  return p.Figures() + "; 12 -> 6 -> +4, -> 0 -> +3";
}

std::string CheckFork(Probe& p) {
  auto parent = p.New();
  p.Append(parent, p.RandomTokens(8), "prefill of 8");
  Probe::Conversation child = p.Fork(parent, "fork at 8");
  // Interleaved, different tokens: each side must see only its own.
  p.Append(parent, p.RandomTokens(3), "parent +3 after the fork");
  p.Append(child, p.RandomTokens(2), "child +2 after the fork");
  p.Append(parent, p.RandomTokens(1), "parent +1");
  p.Append(child, p.RandomTokens(1), "child +1");
  parent.session.reset();  // the child outlives its parent
  p.Append(child, p.RandomTokens(2), "child +2 with the parent freed");
  auto empty = p.New();
  Probe::Conversation empty_fork = p.Fork(empty, "fork of an empty session");
  p.Append(empty_fork, p.RandomTokens(3), "fork of an empty session +3");
  return p.Figures() + "; interleaved, parent freed, fork of an empty session";
}

std::string CheckReset(Probe& p) {
  auto c = p.New();
  p.Append(c, p.RandomTokens(10), "prefill of 10");
  c.session->Reset();
  c.history.clear();
  p.ExpectLength(c, "reset");
  p.Append(c, p.RandomTokens(4), "prefill of 4 after reset");
  return p.Figures();
}

std::string CheckSessionsIndependent(Probe& p) {
  auto a = p.New(), b = p.New();
  for (int i = 0; i < 3; ++i) {
    p.Append(a, p.RandomTokens(3), fmt::format("session A, call {}", i + 1));
    p.Append(b, p.RandomTokens(2), fmt::format("session B, call {}", i + 1));
  }
  return p.Figures() + "; two sessions of one engine, interleaved";
}

std::string CheckDeterministic(Probe& p) {
  const Tokens prompt = p.RandomTokens(9), decode = p.RandomTokens(3);
  Logits runs[2];
  for (Logits& out : runs) {
    auto s = p.engine().NewSession();
    Logits first = s->Append(prompt, nullptr);
    out.resize(first.rows() + static_cast<int64_t>(decode.size()), first.cols());
    out.topRows(first.rows()) = first;
    for (size_t i = 0; i < decode.size(); ++i) {
      out.row(first.rows() + static_cast<int64_t>(i)) = s->Append({decode[i]}, nullptr).row(0);
    }
  }
  if (runs[0].rows() != runs[1].rows() || runs[0].cols() != runs[1].cols()) {
    Probe::Fail("two runs gave logits of different shapes");
  }
  for (int64_t r = 0; r < runs[0].rows(); ++r) {
    for (int64_t v = 0; v < runs[0].cols(); ++v) {
      if (std::memcmp(&runs[0](r, v), &runs[1](r, v), sizeof(float)) != 0) {
        Probe::Fail("row {}, logit {}: {} in the first run, {} in the second", r, v, runs[0](r, v),
                    runs[1](r, v));
      }
    }
  }
  return "prefill of 9 and 3 decode steps, twice: bit-identical";
}

std::string CheckTokenOutOfRange(Probe& p) {
  auto c = p.New();
  p.Append(c, p.RandomTokens(4), "prefill of 4");
  const Token vocab = static_cast<Token>(p.vocab());
  p.ExpectRefused(c, fmt::format("append of token {} (vocab_size {})", vocab, vocab), [&] {
    c.session->Append({1, vocab}, nullptr);
  });
  p.ExpectRefused(c, "append of token -1", [&] { c.session->Append({-1}, nullptr); });
  return Refused(p);
}

std::string CheckTruncateBeyondLength(Probe& p) {
  auto c = p.New();
  p.Append(c, p.RandomTokens(5), "prefill of 5");
  p.ExpectRefused(c, "truncate to 6 of 5", [&] { c.session->Truncate(6); });
  p.ExpectRefused(c, "truncate to -1", [&] { c.session->Truncate(-1); });
  return Refused(p);
}

std::string CheckEmptyAppend(Probe& p) {
  auto c = p.New();
  p.Append(c, p.RandomTokens(3), "prefill of 3");
  p.ExpectRefused(c, "append of no tokens", [&] { c.session->Append({}, nullptr); });
  return Refused(p);
}

// Fills a session to max_position_embeddings in chunks of 128 (the last chunk compared), then one
// more token must be refused and change nothing.
std::string CheckCapacity(Probe& p, int64_t max_fill) {
  const int64_t capacity = p.max_positions();
  if (capacity > max_fill) {
    throw NotApplicable(
        fmt::format("max_position_embeddings {} is above the fill limit {}", capacity, max_fill));
  }
  auto c = p.New();
  while (static_cast<int64_t>(c.history.size()) + 128 < capacity) {
    const Tokens chunk = p.RandomTokens(128);
    c.session->Append(chunk, nullptr);
    c.history.insert(c.history.end(), chunk.begin(), chunk.end());
  }
  p.Append(c, p.RandomTokens(capacity - static_cast<int64_t>(c.history.size())),
           fmt::format("the last chunk up to {}", capacity));
  try {
    c.session->Append({1}, nullptr);
  } catch (const InputError& e) {
    p.ExpectLength(c, "the append past the capacity");
    return fmt::format("{} positions held; {} refused: {}", capacity, capacity + 1,
                       std::string(e.what()).substr(0, 60));
  } catch (const EngineError& e) {
    Probe::Fail("position {}: expected a refusal as bad input, got an engine failure: {}", capacity,
                e.what());
  }
  Probe::Fail("position {} (max_position_embeddings {}) was accepted; expected a refusal", capacity,
              capacity);
}

ConformCheck RunOne(const CheckDef& def, Probe& probe) {
  ConformCheck check;
  check.name = def.name;
  check.what = def.what;
  const auto start = std::chrono::steady_clock::now();
  try {
    check.detail = def.run(probe);
  } catch (const Nonconformance& e) {
    check.result = ConformCheck::Result::kFail;
    check.detail = e.what();
  } catch (const NotApplicable& e) {
    check.result = ConformCheck::Result::kSkip;
    check.detail = e.what();
  } catch (const std::exception& e) {
    check.result = ConformCheck::Result::kFail;
    check.detail = fmt::format("unexpected {}: {}",
                               dynamic_cast<const InputError*>(&e) ? "refusal" : "error", e.what());
  }
  probe.Figures();  // a failed check's rows are not the next one's
  probe.SameRowsFigure();
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
      {"capacity", "max_position_embeddings positions are held; one more is refused",
       [&options](Probe& p) { return CheckCapacity(p, options.max_capacity_fill); }},
  };
  // After the others, so that each of those draws the tokens it drew before there were batch
  // checks (a check's tokens follow from its place in the list).
  for (const CheckDef& batch : conform_detail::BatchChecks()) checks.push_back(batch);
  for (size_t i = 0; i < checks.size(); ++i) {
    // Each check draws its own tokens: one check's outcome never moves another's inputs.
    Probe probe(engine, oracle, options.gate, options.seed * 1000 + i);
    report.checks.push_back(RunOne(checks[i], probe));
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
  return {{"backend", backend},     {"oracle", oracle},     {"model", model},
          {"tolerance", tolerance}, {"passed", Passed()},   {"failures", Failures()},
          {"seconds", seconds},     {"checks", checks_json}};
}

std::string ConformReport::ToJUnit() const {
  JUnitSuite suite;
  suite.name = "conform " + backend;
  suite.classname = "kvdiff.conform";
  suite.seconds = seconds;
  suite.properties = {{"backend", backend},
                      {"oracle", oracle},
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
