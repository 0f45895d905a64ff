// Golden files: the data types, the text format, finding golden sets and loading their scenarios.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "format/affixes.h"
#include "format/error.h"
#include "format/input_file.h"
#include "format/json_document.h"
#include "format/json_field.h"
#include "format/safetensors.h"
#include "format/scratch_dir.h"
#include "harness/backend/registry.h"
#include "harness/golden/golden.h"
#include "harness/golden/golden_detail.h"
#include "harness/golden/sha256.h"
#include "harness/replay/drivers.h"
#include "harness/replay/replay.h"
#include "harness/report/run_report.h"

namespace kvdiff::harness {
namespace golden_detail {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kScenarioSuffix = ".json";
constexpr const char* kGoldenSuffix = ".golden.json";
constexpr const char* kRowsSuffix = ".golden.safetensors";

using format::EndsWith;

std::string ReadBytes(const fs::path& path) { return format::ReadInputFile(path, "file"); }

using format::JsonSnippet;
using format::ScratchDir;

// ---------------------------------------------------------------------------------------------
// Digests and their tolerances

}  // namespace golden_detail

using namespace golden_detail;

// The golden's view of one logits row.

GoldenRow SummarizeRow(const std::vector<float>& logits, int top_k) {
  GoldenRow g;
  const int64_t n = static_cast<int64_t>(logits.size());
  g.greedy = static_cast<Token>(Argmax(logits.data(), n));
  std::vector<Token> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<Token>(i);
  const int64_t k = std::min<int64_t>(top_k, n);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](Token a, Token b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t i = 0; i < k; ++i) g.top_k.emplace_back(ids[i], logits[ids[i]]);
  g.max = -INFINITY;
  g.min = INFINITY;
  for (float v : logits) {  // in index order: the same values give the same double sums
    g.sum += v;
    g.sum_sq += double(v) * v;
    g.max = std::max(g.max, double(v));
    g.min = std::min(g.min, double(v));
  }
  return g;
}

namespace golden_detail {

// If every logit is within tol of the golden's, these bounds hold for the digests; they are the
// loosest checks that can never reject a row the elementwise gate accepts:
//   |sum a - sum b|   <= V tol                       (V terms, each off by at most tol)
//   |max a - max b|   <= tol
//   |sumsq a - sumsq b| = sum |a-b||a+b| <= tol (2 sum|b| + V tol) <= tol (2 sqrt(V sumsq b) + V
//   tol)
//                                                    (Cauchy-Schwarz: sum|b| <= sqrt(V sum b^2))
DigestTolerance DigestTolerances(double tol, int64_t vocab, double golden_sum_sq) {
  const double v = static_cast<double>(vocab);
  return {v * tol, tol * (2 * std::sqrt(v * std::max(0.0, golden_sum_sq)) + v * tol), tol};
}

// ---------------------------------------------------------------------------------------------
// Text format

std::string Str(const std::string& s) { return json(s).dump(); }

std::string RowToText(const GoldenRow& r) {
  std::string top;
  for (size_t i = 0; i < r.top_k.size(); ++i) {
    top += fmt::format("{}[{}, {}]", i ? ", " : "", r.top_k[i].first, r.top_k[i].second);
  }
  std::string out = fmt::format(
      "{{\"step\": {}, \"row\": {}, \"conversation\": {}, \"position\": {}, \"token\": {}, "
      "\"greedy\": {}, \"top_k\": [{}], \"sum\": {}, \"sum_sq\": {}, \"max\": {}, "
      "\"min\": {}",
      r.step, r.row, Str(r.conversation), r.position, r.token, r.greedy, top, r.sum, r.sum_sq,
      static_cast<float>(r.max), static_cast<float>(r.min));  // logits: float32 values
  if (!r.full.empty()) out += fmt::format(", \"full\": {}", Str(r.full));
  return out + "}";
}

const json& Field(const json& obj, const std::string& key, const std::string& where) {
  return format::RequiredJsonField(obj, key, where);
}
std::string GetStr(const json& obj, const std::string& key, const std::string& where) {
  return format::RequiredJsonString(obj, key, where);
}
int64_t GetInt(const json& obj, const std::string& key, const std::string& where) {
  return format::RequiredJsonInt(obj, key, where);
}
double GetNum(const json& v, const std::string& where) {
  const double d = format::JsonNumber(v, where);
  KVDIFF_CHECK(std::isfinite(d), "{}: expected a finite number, got {}", where, JsonSnippet(v));
  return d;
}

GoldenRow ParseRow(const json& j, const std::string& where) {
  KVDIFF_CHECK(j.is_object(), "{}: expected an object, got {}", where, JsonSnippet(j));
  GoldenRow r;
  r.step = GetInt(j, "step", where);
  r.row = GetInt(j, "row", where);
  r.conversation = GetStr(j, "conversation", where);
  r.position = GetInt(j, "position", where);
  r.token = static_cast<Token>(GetInt(j, "token", where));
  r.greedy = static_cast<Token>(GetInt(j, "greedy", where));
  const json& top = Field(j, "top_k", where);
  KVDIFF_CHECK(top.is_array() && !top.empty(), "{}.top_k: expected [[id, logit], ...], got {}",
               where, JsonSnippet(top));
  for (size_t i = 0; i < top.size(); ++i) {
    const std::string w = fmt::format("{}.top_k[{}]", where, i);
    KVDIFF_CHECK(top[i].is_array() && top[i].size() == 2 && top[i][0].is_number_integer(),
                 "{}: expected [id, logit], got {}", w, JsonSnippet(top[i]));
    r.top_k.emplace_back(static_cast<Token>(top[i][0].get<int64_t>()),
                         static_cast<float>(GetNum(top[i][1], w)));
  }
  r.sum = GetNum(Field(j, "sum", where), where + ".sum");
  r.sum_sq = GetNum(Field(j, "sum_sq", where), where + ".sum_sq");
  // Written as the float32 it is: read back as that float, not as the nearest double.
  r.max = static_cast<float>(GetNum(Field(j, "max", where), where + ".max"));
  r.min = static_cast<float>(GetNum(Field(j, "min", where), where + ".min"));
  if (j.contains("full")) r.full = GetStr(j, "full", where);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Building a golden from a recording

std::string RowsTensorName(const RecordedRow& r) {
  return fmt::format("step{}.row{}", r.step, r.row);
}

Golden GoldenHeader(const GoldenPaths& paths, const GoldenInput& in, const std::string& backend) {
  Golden g;
  g.scenario = paths.scenario.filename().string();
  g.scenario_sha256 = in.scenario_sha256;
  g.model = in.model_json;
  g.model_files = in.model_files;
  g.model_description = DescribeModel(in.weights->config);
  g.vocab_size = in.weights->config.vocab_size;
  g.backend = backend;
  g.dtype = BackendDtype(backend);
  g.driver = DriverName(in.scenario.driver);
  g.tolerance = in.scenario.gate.abs;
  g.kvdiff_version = KVDIFF_VERSION;
  g.regenerate = fmt::format("kvdiff golden regen {} --backend {}", g.scenario, backend);
  g.rows_file = paths.rows.filename().string();
  return g;
}

void CheckGoldenHeader(const Golden& recorded, const Golden& expected, const std::string& where) {
  // kvdiff_version is not compared: a golden pins numbers across releases, which is its point.
  const std::pair<const char*, std::pair<std::string, std::string>> fields[] = {
      {"scenario", {Str(recorded.scenario), Str(expected.scenario)}},
      {"model", {recorded.model.dump(), expected.model.dump()}},
      {"model_description", {Str(recorded.model_description), Str(expected.model_description)}},
      {"vocab_size", {std::to_string(recorded.vocab_size), std::to_string(expected.vocab_size)}},
      {"dtype", {Str(recorded.dtype), Str(expected.dtype)}},
      {"driver", {Str(recorded.driver), Str(expected.driver)}},
      {"tolerance.abs",
       {fmt::format("{}", recorded.tolerance), fmt::format("{}", expected.tolerance)}},
      {"top_k", {std::to_string(recorded.top_k), std::to_string(expected.top_k)}},
      {"regenerate", {Str(recorded.regenerate), Str(expected.regenerate)}},
      {"rows_file", {Str(recorded.rows_file), Str(expected.rows_file)}},
  };
  for (const auto& [field, values] : fields) {
    KVDIFF_CHECK(values.first == values.second,
                 "{}.{}: the golden records {}, but its scenario and backend give {} (the golden "
                 "was edited, or belongs to another scenario; run `{}`)",
                 where, field, values.first, values.second, expected.regenerate);
  }
}

Golden MakeGolden(const GoldenPaths& paths, const GoldenInput& in, const Recording& rec,
                  const std::string& backend) {
  Golden g = GoldenHeader(paths, in, backend);
  std::map<std::string, size_t> last_of;  // conversation -> index of its last row
  for (size_t k = 0; k < rec.rows.size(); ++k) last_of[rec.rows[k].conversation] = k;
  std::set<size_t> full_rows;
  for (const auto& [conv, k] : last_of) full_rows.insert(k);
  for (size_t k = 0; k < rec.rows.size(); ++k) {
    const RecordedRow& r = rec.rows[k];
    GoldenRow gr = SummarizeRow(r.logits, g.top_k);
    gr.step = r.step;
    gr.row = r.row;
    gr.conversation = r.conversation;
    gr.position = r.position;
    gr.token = r.token;
    if (full_rows.count(k)) {
      gr.full = RowsTensorName(r);
      g.full_rows[gr.full] = r.logits;
    }
    g.rows.push_back(std::move(gr));
  }
  return g;
}

// The bytes of the rows file, written by format::WriteSafetensors (deterministic) into a scratch
// folder so they can be hashed and compared before anything in the golden folder is touched.
std::string RowsFileBytes(const Golden& g) {
  std::vector<format::TensorToWrite> tensors;
  for (const GoldenRow& r : g.rows) {
    if (r.full.empty()) continue;
    tensors.push_back({r.full, format::DType::kF32, {g.vocab_size}, g.full_rows.at(r.full)});
  }
  ScratchDir scratch("golden");
  const fs::path file = scratch.path() / "rows.safetensors";
  format::WriteSafetensors(file, tensors,
                           {{"format", "kvdiff-golden-rows"}, {"scenario", g.scenario}});
  return ReadBytes(file);
}

// Loads the full rows a golden names from its rows file; InputError when absent or malformed.
void LoadFullRows(Golden& g, const fs::path& rows_path) {
  const format::SafetensorsFile file = format::SafetensorsFile::Open(rows_path);
  for (const GoldenRow& r : g.rows) {
    if (r.full.empty()) continue;
    std::vector<float> values = file.ReadFloat(r.full);
    KVDIFF_CHECK(static_cast<int64_t>(values.size()) == g.vocab_size,
                 "{}: tensor {} has {} values; expected vocab_size {}", rows_path.string(), r.full,
                 values.size(), g.vocab_size);
    g.full_rows[r.full] = std::move(values);
  }
}

std::string Where(const GoldenRow& r) { return fmt::format("step {} row {}", r.step, r.row); }

}  // namespace golden_detail

std::string BackendDtype(const std::string& backend) {
  // "" for a backend this build cannot make (ref64 without LibTorch): golden verify then takes
  // the recorded dtype; regen never gets here with one (it builds the backend first).
  if (!BackendRegistry::Global().Has(backend)) return "";
  return BackendRegistry::Global().Info(backend).dtype;
}

// ---------------------------------------------------------------------------------------------
// Text format

std::string GoldenToText(const Golden& g) {
  std::string out = "{\n";
  auto line = [&out](const std::string& key, const std::string& value) {
    out += fmt::format("  {}: {},\n", Str(key), value);
  };
  line("format", Str(kGoldenFormat));
  line("version", std::to_string(kGoldenVersion));
  line("scenario", Str(g.scenario));
  line("scenario_sha256", Str(g.scenario_sha256));
  line("model", g.model.dump());
  line("model_files", json(g.model_files).dump());
  line("model_description", Str(g.model_description));
  line("vocab_size", std::to_string(g.vocab_size));
  line("backend", Str(g.backend));
  line("dtype", Str(g.dtype));
  line("driver", Str(g.driver));
  line("tolerance", fmt::format("{{\"abs\": {}}}", g.tolerance));
  line("top_k", std::to_string(g.top_k));
  line("kvdiff_version", Str(g.kvdiff_version));
  line("regenerate", Str(g.regenerate));
  line("rows_file", Str(g.rows_file));
  line("rows_sha256", Str(g.rows_sha256));
  out += "  \"rows\": [\n";
  for (size_t i = 0; i < g.rows.size(); ++i) {
    out += "    " + RowToText(g.rows[i]) + (i + 1 < g.rows.size() ? ",\n" : "\n");
  }
  return out + "  ]\n}\n";
}

Golden ParseGolden(const std::string& text, const std::string& where) {
  const json root = format::ParseJsonDocument(text, where);
  KVDIFF_CHECK(root.is_object(), "{}: expected a JSON object", where);
  const std::string format = GetStr(root, "format", where);
  KVDIFF_CHECK(format == kGoldenFormat, "{}.format: expected \"{}\", got \"{}\"", where,
               kGoldenFormat, format);
  const int64_t version = GetInt(root, "version", where);
  KVDIFF_CHECK(version == kGoldenVersion,
               "{}.version: this kvdiff reads golden version {}, the file has {}", where,
               kGoldenVersion, version);
  Golden g;
  g.scenario = GetStr(root, "scenario", where);
  g.scenario_sha256 = GetStr(root, "scenario_sha256", where);
  g.model = Field(root, "model", where);
  const json& files = Field(root, "model_files", where);
  KVDIFF_CHECK(files.is_object(), "{}.model_files: expected an object, got {}", where,
               JsonSnippet(files));
  for (const auto& [name, sha] : files.items()) {
    KVDIFF_CHECK(sha.is_string(), "{}.model_files.{}: expected a sha256 string", where, name);
    g.model_files[name] = sha.get<std::string>();
  }
  g.model_description = GetStr(root, "model_description", where);
  g.vocab_size = GetInt(root, "vocab_size", where);
  KVDIFF_CHECK(g.vocab_size >= 1, "{}.vocab_size: expected >= 1, got {}", where, g.vocab_size);
  g.backend = GetStr(root, "backend", where);
  KVDIFF_CHECK(BackendRegistry::Global().Knows(g.backend),
               "{}.backend: unknown backend \"{}\" (expected one of {})", where, g.backend,
               BackendRegistry::Global().NamesText());
  g.dtype = GetStr(root, "dtype", where);
  g.driver = GetStr(root, "driver", where);
  const json& tol = Field(root, "tolerance", where);
  KVDIFF_CHECK(tol.is_object(), "{}.tolerance: expected {{\"abs\": x}}, got {}", where,
               JsonSnippet(tol));
  g.tolerance = GetNum(Field(tol, "abs", where + ".tolerance"), where + ".tolerance.abs");
  KVDIFF_CHECK(g.tolerance >= 0, "{}.tolerance.abs: expected >= 0, got {}", where, g.tolerance);
  g.top_k = static_cast<int>(GetInt(root, "top_k", where));
  KVDIFF_CHECK(g.top_k >= 1, "{}.top_k: expected >= 1, got {}", where, g.top_k);
  g.kvdiff_version = GetStr(root, "kvdiff_version", where);
  g.regenerate = GetStr(root, "regenerate", where);
  g.rows_file = GetStr(root, "rows_file", where);
  g.rows_sha256 = GetStr(root, "rows_sha256", where);
  const json& rows = Field(root, "rows", where);
  KVDIFF_CHECK(rows.is_array(), "{}.rows: expected an array", where);
  // verify matches rows by (step, row): a second entry for one would hide a replay row unchecked.
  std::map<std::pair<int64_t, int64_t>, size_t> index_of;
  for (size_t i = 0; i < rows.size(); ++i) {
    GoldenRow r = ParseRow(rows[i], fmt::format("{}: rows[{}]", where, i));
    const auto [seen, added] = index_of.emplace(std::pair{r.step, r.row}, i);
    KVDIFF_CHECK(added,
                 "{}: rows[{}]: step {} row {} is listed twice (rows[{}] too; the file was edited? "
                 "regenerate it with `{}`)",
                 where, i, r.step, r.row, seen->second, g.regenerate);
    for (const auto& [id, logit] : r.top_k) {
      KVDIFF_CHECK(id >= 0 && id < g.vocab_size, "{}: rows[{}].top_k: id {} outside [0, {})", where,
                   i, id, g.vocab_size);
    }
    KVDIFF_CHECK(r.greedy >= 0 && r.greedy < g.vocab_size,
                 "{}: rows[{}].greedy: id {} outside [0, {})", where, i, r.greedy, g.vocab_size);
    // The greedy token is the argmax, which top_k lists first (ties: the lower id, both ways).
    KVDIFF_CHECK(r.top_k.empty() || r.top_k[0].first == r.greedy,
                 "{}: rows[{}].greedy: {} is not the top token {} of its top_k (the file was "
                 "edited? regenerate it with `{}`)",
                 where, i, r.greedy, r.top_k[0].first, g.regenerate);
    const size_t listed = static_cast<size_t>(std::min<int64_t>(g.top_k, g.vocab_size));
    KVDIFF_CHECK(r.top_k.size() == listed,
                 "{}: rows[{}].top_k: {} entries, but top_k {} of vocab_size {} means {}", where, i,
                 r.top_k.size(), g.top_k, g.vocab_size, listed);
    g.rows.push_back(std::move(r));
  }
  return g;
}

// ---------------------------------------------------------------------------------------------
// Finding golden sets

GoldenPaths GoldenPathsFor(const fs::path& file) {
  const std::string name = file.filename().string();
  std::string stem;
  if (EndsWith(name, kGoldenSuffix)) {
    stem = name.substr(0, name.size() - std::string(kGoldenSuffix).size());
  } else if (EndsWith(name, kRowsSuffix)) {
    stem = name.substr(0, name.size() - std::string(kRowsSuffix).size());
  } else {
    KVDIFF_CHECK(EndsWith(name, kScenarioSuffix),
                 "{}: expected a scenario (NAME.json) or a golden file (NAME.golden.json)",
                 file.string());
    stem = name.substr(0, name.size() - std::string(kScenarioSuffix).size());
  }
  KVDIFF_CHECK(!stem.empty(), "{}: the file name has no stem", file.string());
  const fs::path dir = file.parent_path();
  return {dir / (stem + kScenarioSuffix), dir / (stem + kGoldenSuffix), dir / (stem + kRowsSuffix)};
}

std::vector<GoldenPaths> FindGoldenSets(const std::vector<fs::path>& args) {
  KVDIFF_CHECK(!args.empty(), "golden: no file or folder given (e.g. golden/)");
  std::vector<fs::path> scenarios;
  for (const fs::path& arg : args) {
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> found;
      for (auto it = fs::recursive_directory_iterator(arg, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!name.empty() && name[0] == '.') {  // temporary files of an interrupted write
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file() && EndsWith(name, kScenarioSuffix) &&
            !EndsWith(name, kGoldenSuffix)) {
          found.push_back(it->path());
        }
      }
      KVDIFF_CHECK(!ec, "cannot list {}: {}", arg.string(), ec.message());
      KVDIFF_CHECK(!found.empty(), "{}: no scenario file (NAME.json) in this folder", arg.string());
      scenarios.insert(scenarios.end(), found.begin(), found.end());
    } else {
      KVDIFF_CHECK(fs::exists(arg, ec), "{}: no such file or folder", arg.string());
      scenarios.push_back(GoldenPathsFor(arg).scenario);
    }
  }
  std::sort(scenarios.begin(), scenarios.end());
  scenarios.erase(std::unique(scenarios.begin(), scenarios.end()), scenarios.end());
  std::vector<GoldenPaths> out;
  for (const fs::path& s : scenarios) out.push_back(GoldenPathsFor(s));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Loading a scenario and its model

GoldenInput LoadGoldenInput(const fs::path& scenario_file) {
  GoldenInput in;
  const std::string text = ReadBytes(scenario_file);
  in.scenario_sha256 = Sha256Hex(text);
  try {
    in.scenario = ParseScenario(text, scenario_file.parent_path());
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", scenario_file.string(), e.what()));
  }
  in.scenario.name = scenario_file.stem().string();
  // The header records the model as written (relative paths and all): the resolved spec holds
  // paths that depend on where the command was run from.
  in.model_json = format::ParseJsonDocument(text, scenario_file.string()).at("model");
  in.missing = MissingModelData(in.scenario.model);
  if (!in.missing.empty()) return in;
  for (const fs::path& f : ModelDataFiles(in.scenario.model))
    in.model_files[f.filename().string()] = Sha256File(f);
  in.weights = LoadModelFor(in.scenario.model);
  PrepareScenario(in.scenario, *in.weights);
  return in;
}

}  // namespace kvdiff::harness
