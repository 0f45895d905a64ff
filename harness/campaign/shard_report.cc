#include "harness/campaign/shard_report.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "format/error.h"
#include "format/json_document.h"
#include "format/json_field.h"
#include "harness/report/run_report.h"

namespace kvdiff::harness {
namespace {

using nlohmann::json;

// Messages read `field "results[2].steps": expected an integer, got "x"`.
const format::JsonFieldWords kWords = {"field \"{}\""};

[[noreturn]] void Refuse(const std::string& path, const std::string& expected, const json& value) {
  throw InputError(
      fmt::format("field \"{}\": expected {}, got {}", path, expected, format::JsonSnippet(value)));
}

// object[key]; the caller has checked that object is an object.
const json& Required(const json& object, const std::string& where, const char* key) {
  KVDIFF_CHECK(object.contains(key), "no \"{}\" field", format::JsonPath(where, key));
  return object.at(key);
}
const json* Find(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

const json& Object(const json& value, const std::string& path) {
  if (!value.is_object()) Refuse(path, "an object", value);
  return value;
}

// A whole number in [min, max]: 1.9 is not read as 1.
int64_t Int(const json& value, const std::string& path, int64_t min,
            int64_t max = std::numeric_limits<int64_t>::max()) {
  const int64_t n = format::JsonInt(value, path, kWords);
  if (n < min || n > max) {
    Refuse(path,
           max == std::numeric_limits<int64_t>::max()
               ? fmt::format("a whole number >= {}", min)
               : fmt::format("a whole number in [{}, {}]", min, max),
           value);
  }
  return n;
}

double Real(const json& value, const std::string& path, double min) {
  const double x = format::JsonNumber(value, path, kWords);
  if (!(std::isfinite(x) && x >= min)) Refuse(path, fmt::format("a number >= {}", min), value);
  return x;
}

// A difference: a number >= 0, or null for a NaN or inf one (as check writes it): NaN here.
double Diff(const json& value, const std::string& path) {
  if (value.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!value.is_number()) Refuse(path, "a number >= 0 or null", value);
  return Real(value, path, 0);
}

std::string String(const json& value, const std::string& path) {
  return format::JsonString(value, path, kWords);
}
bool Bool(const json& value, const std::string& path) {
  return format::JsonBool(value, path, kWords);
}
std::vector<std::string> Strings(const json& value, const std::string& path) {
  if (!value.is_array()) Refuse(path, "an array of strings", value);
  std::vector<std::string> out;
  for (size_t i = 0; i < value.size(); ++i) {
    out.push_back(String(value[i], fmt::format("{}[{}]", path, i)));
  }
  return out;
}

// "worst": null when the case compared no row, else the row of its worst difference.
WorstRow ReadWorst(const json& j, const std::string& where) {
  WorstRow w;
  if (j.is_null()) return w;
  Object(j, where);
  const auto at = [&](const char* key) { return format::JsonPath(where, key); };
  const auto diff = [&](const char* key) {  // null: not finite, as check writes it
    const double d = Diff(Required(j, where, key), at(key));
    return std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  };
  w.diff = diff("diff");
  w.gate = diff("gate");
  w.gate_basis = String(Required(j, where, "gate_basis"), at("gate_basis"));
  w.path = String(Required(j, where, "path"), at("path"));
  w.step = Int(Required(j, where, "step"), at("step"), 0);
  w.conversation = String(Required(j, where, "conversation"), at("conversation"));
  w.position = Int(Required(j, where, "position"), at("position"), 0);
  w.within = Bool(Required(j, where, "within"), at("within"));
  return w;
}

CaseResult::Shrunk ReadShrunk(const json& j, const std::string& where) {
  Object(j, where);
  const auto at = [&](const char* key) { return format::JsonPath(where, key); };
  return CaseResult::Shrunk{String(Required(j, where, "scenario_file"), at("scenario_file")),
                            String(Required(j, where, "failure"), at("failure")),
                            Int(Required(j, where, "steps"), at("steps"), 0),
                            Int(Required(j, where, "replays"), at("replays"), 0),
                            Bool(Required(j, where, "budget_spent"), at("budget_spent"))};
}

// A passing case's own figures must say it passed: check fails a case whose difference is NaN or
// inf (written null) or beyond its row's gate, so such a case marked passed was edited.
void CheckCaseAgrees(const CaseResult& r, const std::string& where) {
  if (!r.passed) return;
  const std::string which = fmt::format("case {} ({})", r.index, where);
  KVDIFF_CHECK(!std::isnan(r.worst_diff),
               "{}: \"passed\" is true but its \"worst_diff\" is null (a NaN or inf difference, "
               "which fails a case): a report that contradicts itself",
               which);
  KVDIFF_CHECK(!r.worst.Found() || r.worst.within,
               "{}: \"passed\" is true but its \"worst\" has \"within\": false ({} over its gate "
               "{}): a report that contradicts itself",
               which, FormatDiff(r.worst.diff), FormatDiff(r.worst.gate));
  KVDIFF_CHECK(!r.demanding || !std::isnan(r.worst_relative_diff),
               "{}: \"passed\" is true but its \"worst_relative_diff\" is null (a NaN or inf "
               "difference, which fails a case): a report that contradicts itself",
               which);
}

CaseResult ReadCase(const json& j, const std::string& where) {
  Object(j, where);
  const auto at = [&](const char* key) { return format::JsonPath(where, key); };
  CaseResult r;
  r.index = Int(Required(j, where, "case"), at("case"), 0);
  r.passed = Bool(Required(j, where, "passed"), at("passed"));
  r.steps = Int(Required(j, where, "steps"), at("steps"), 0);
  r.rows_compared = Int(Required(j, where, "rows_compared"), at("rows_compared"), 0);
  r.worst_diff = Diff(Required(j, where, "worst_diff"), at("worst_diff"));
  if (const json* w = Find(j, "worst")) r.worst = ReadWorst(*w, at("worst"));  // since 0.1.0+
  if (const json* s = Find(j, "shape")) r.shape = String(*s, at("shape"));     // --shapes random
  if (const json* d = Find(j, "demanding")) r.demanding = Bool(*d, at("demanding"));
  if (r.demanding) {
    r.worst_relative_diff =
        Diff(Required(j, where, "worst_relative_diff"), at("worst_relative_diff"));
  }
  if (!r.passed) {
    if (const json* f = Find(j, "failure")) r.failure = String(*f, at("failure"));
    if (const json* f = Find(j, "scenario_file")) r.scenario_file = String(*f, at("scenario_file"));
    if (const json* s = Find(j, "shrunk")) r.shrunk = ReadShrunk(*s, at("shrunk"));  // since 0.3
    if (const json* n = Find(j, "not_shrunk")) r.not_shrunk = String(*n, at("not_shrunk"));
    // A backend hung in an earlier case.
    if (const json* n = Find(j, "not_run")) r.not_run = Bool(*n, at("not_run"));
  }
  CheckCaseAgrees(r, where);
  return r;
}

// The demanding part's object: its settings (or why it was skipped) and counts.
CampaignReport::Demanding ReadDemanding(const json& j) {
  const std::string where = "demanding";
  Object(j, where);
  const auto at = [&](const char* key) { return format::JsonPath(where, key); };
  CampaignReport::Demanding d;
  if (const json* v = Find(j, "skipped")) d.skipped = String(*v, at("skipped"));
  if (const json* v = Find(j, "notes")) d.notes = Strings(*v, at("notes"));
  if (const json* v = Find(j, "model")) d.model = String(*v, at("model"));
  if (const json* v = Find(j, "backends")) d.backends = Strings(*v, at("backends"));
  if (const json* v = Find(j, "fraction")) d.fraction = Real(*v, at("fraction"), 0);
  if (const json* v = Find(j, "rtol")) d.rtol = Real(*v, at("rtol"), 0);
  if (const json* v = Find(j, "cases")) d.cases = Int(*v, at("cases"), 0);
  if (const json* v = Find(j, "failures")) d.failures = Int(*v, at("failures"), 0);
  if (const json* v = Find(j, "worst_relative_diff")) {
    const double w = Diff(*v, at("worst_relative_diff"));
    d.worst_relative_diff = std::isnan(w) ? std::numeric_limits<double>::infinity() : w;
  }
  return d;
}

// The cases shard i/n runs hold exactly k = i-1, i-1+n, ... below the campaign's case count.
void CheckShardCases(const ShardReport& s) {
  const int64_t first = s.shard.index - 1;
  const int64_t expected = ShardCaseCount(s.cases, s.shard);
  bool exact = static_cast<int64_t>(s.results.size()) == expected;
  for (size_t k = 0; exact && k < s.results.size(); ++k) {
    exact = s.results[k].index == first + static_cast<int64_t>(k) * s.shard.count;
  }
  KVDIFF_CHECK(exact,
               "shard {}/{} of {} cases should hold {} results (cases {}...), it holds {}: a "
               "truncated or edited report",
               s.shard.index, s.shard.count, s.cases, expected, expected == 0 ? -1 : first,
               s.results.size());
}

// A report's own verdict must be the one its cases give: merge recomputes the verdict from the
// cases, so a report that says it failed while its cases pass (or the reverse) was edited or
// truncated, and is refused rather than silently overruled.
void CheckVerdictMatchesResults(const json& root, const std::vector<CaseResult>& results) {
  int64_t failed = 0;
  for (const CaseResult& r : results) failed += r.passed ? 0 : 1;
  const json& passed = Required(root, "", "passed");
  KVDIFF_CHECK(passed.is_boolean() && passed.get<bool>() == (failed == 0),
               "\"passed\" is {} but its results say {} ({} of {} cases failed): a report that "
               "contradicts itself",
               passed.dump(), failed == 0, failed, results.size());
  const json& failures = Required(root, "", "failures");
  KVDIFF_CHECK(failures.is_number_integer() && failures.get<int64_t>() == failed,
               "\"failures\" is {} but {} of its {} results failed: a report that contradicts "
               "itself",
               failures.dump(), failed, results.size());
}

ShardReport Read(const std::string& file, const json& root) {
  ShardReport s;
  s.file = file;
  s.root = &root;
  const json* command = root.is_object() ? Find(root, "command") : nullptr;
  KVDIFF_CHECK(command != nullptr && *command == "check",
               "not a `kvdiff check --json` report (no \"command\": \"check\")");
  // Compared between shards as they are written, not read.
  for (const char* field : {"kvdiff_version", "model"}) Required(root, "", field);
  const json& shard = Object(Required(root, "", "shard"), "shard");
  s.shard.index = Int(Required(shard, "shard", "index"), "shard.index", 1);
  s.shard.count = Int(Required(shard, "shard", "count"), "shard.count", 1);
  KVDIFF_CHECK(s.shard.index <= s.shard.count, "shard {}/{} is not a shard", s.shard.index,
               s.shard.count);
  const json& seed = Required(root, "", "seed");
  if (!seed.is_number_unsigned()) Refuse("seed", "a whole number >= 0", seed);
  s.seed = seed.get<uint64_t>();
  // check --cases's range: a report of more cases was not written by check, and would have merge
  // count them out.
  s.cases = Int(Required(root, "", "cases"), "cases", 1, kMaxCases);
  const json& tolerance = Object(Required(root, "", "tolerance"), "tolerance");
  s.tolerance = Real(Required(tolerance, "tolerance", "abs"), "tolerance.abs", 0);
  s.backends = Strings(Required(root, "", "backends"), "backends");
  KVDIFF_CHECK(!s.backends.empty(), "field \"backends\": expected at least one backend, got []");
  if (const json* v = Find(root, "seconds")) s.seconds = Real(*v, "seconds", 0);
  const json& results = Required(root, "", "results");
  if (!results.is_array()) Refuse("results", "an array of cases", results);
  for (size_t i = 0; i < results.size(); ++i) {
    s.results.push_back(ReadCase(results[i], fmt::format("results[{}]", i)));
  }
  CheckShardCases(s);
  CheckVerdictMatchesResults(root, s.results);
  if (const json* c = Find(root, "coverage")) s.coverage = Coverage::FromJson(*c, "coverage");
  if (const json* d = Find(root, "demanding")) s.demanding = ReadDemanding(*d);
  return s;
}

}  // namespace

ShardReport ReadShardReport(const std::string& file, const json& root) {
  try {
    return Read(file, root);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not a `kvdiff check --json` report: {}", file, e.what()));
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", file, e.what()));
  }
}

}  // namespace kvdiff::harness
