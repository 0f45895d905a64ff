#include "harness/golden.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "harness/drivers.h"
#include "format/error.h"
#include "format/safetensors.h"
#include "harness/report.h"
#include "harness/sha256.h"

namespace kvdiff::harness {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kScenarioSuffix = ".json";
constexpr const char* kGoldenSuffix = ".golden.json";
constexpr const char* kRowsSuffix = ".golden.safetensors";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  KVDIFF_CHECK(in.good(), "cannot read {}", path.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A folder under the system temporary directory, removed with everything in it at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<unsigned> counter{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      path_ = fs::temp_directory_path() /
              fmt::format("kvdiff-golden-{}-{}", static_cast<long>(getpid()), counter++);
      std::error_code ec;
      if (fs::create_directory(path_, ec)) return;
    }
    throw InputError(
        fmt::format("cannot create a temporary folder in {}", fs::temp_directory_path().string()));
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---------------------------------------------------------------------------------------------
// Digests and their tolerances

// The golden's view of one logits row.
}  // namespace

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

namespace {

// If every logit is within tol of the golden's, these bounds hold for the digests; they are the
// loosest checks that can never reject a row the elementwise gate accepts:
//   |sum a - sum b|   <= V tol                       (V terms, each off by at most tol)
//   |max a - max b|   <= tol
//   |sumsq a - sumsq b| = sum |a-b||a+b| <= tol (2 sum|b| + V tol) <= tol (2 sqrt(V sumsq b) + V
//   tol)
//                                                    (Cauchy-Schwarz: sum|b| <= sqrt(V sum b^2))
struct DigestTolerance {
  double sum, sum_sq, max;  // max and min alike
};
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
  KVDIFF_CHECK(obj.contains(key), "{}: missing field \"{}\"", where, key);
  return obj.at(key);
}
std::string GetStr(const json& obj, const std::string& key, const std::string& where) {
  const json& v = Field(obj, key, where);
  KVDIFF_CHECK(v.is_string(), "{}.{}: expected a string, got {}", where, key, v.dump());
  return v.get<std::string>();
}
int64_t GetInt(const json& obj, const std::string& key, const std::string& where) {
  const json& v = Field(obj, key, where);
  KVDIFF_CHECK(v.is_number_integer(), "{}.{}: expected an integer, got {}", where, key, v.dump());
  return v.get<int64_t>();
}
double GetNum(const json& v, const std::string& where) {
  KVDIFF_CHECK(v.is_number(), "{}: expected a number, got {}", where, v.dump());
  const double d = v.get<double>();
  KVDIFF_CHECK(std::isfinite(d), "{}: expected a finite number, got {}", where, v.dump());
  return d;
}

GoldenRow ParseRow(const json& j, const std::string& where) {
  KVDIFF_CHECK(j.is_object(), "{}: expected an object, got {}", where, j.dump());
  GoldenRow r;
  r.step = GetInt(j, "step", where);
  r.row = GetInt(j, "row", where);
  r.conversation = GetStr(j, "conversation", where);
  r.position = GetInt(j, "position", where);
  r.token = static_cast<Token>(GetInt(j, "token", where));
  r.greedy = static_cast<Token>(GetInt(j, "greedy", where));
  const json& top = Field(j, "top_k", where);
  KVDIFF_CHECK(top.is_array() && !top.empty(), "{}.top_k: expected [[id, logit], ...], got {}",
               where, top.dump());
  for (size_t i = 0; i < top.size(); ++i) {
    const std::string w = fmt::format("{}.top_k[{}]", where, i);
    KVDIFF_CHECK(top[i].is_array() && top[i].size() == 2 && top[i][0].is_number_integer(),
                 "{}: expected [id, logit], got {}", w, top[i].dump());
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

Golden MakeGolden(const GoldenPaths& paths, const GoldenInput& in, const Recording& rec,
                  const std::string& backend) {
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
  g.tolerance = in.scenario.tolerance_abs;
  g.kvdiff_version = KVDIFF_VERSION;
  g.regenerate = fmt::format("kvdiff golden regen {} --backend {}", g.scenario, backend);
  g.rows_file = paths.rows.filename().string();
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
  ScratchDir scratch;
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

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;
  }
  return m;
}

bool Available(const std::string& backend) {
  const std::vector<std::string> names = AvailableBackends();
  return std::find(names.begin(), names.end(), backend) != names.end();
}

}  // namespace

std::string BackendDtype(const std::string& backend) {
  return backend == "ref64" ? "float64" : "float32";
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
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InputError(fmt::format("{}: invalid JSON: {}", where, e.what()));
  }
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
               files.dump());
  for (const auto& [name, sha] : files.items()) {
    KVDIFF_CHECK(sha.is_string(), "{}.model_files.{}: expected a sha256 string", where, name);
    g.model_files[name] = sha.get<std::string>();
  }
  g.model_description = GetStr(root, "model_description", where);
  g.vocab_size = GetInt(root, "vocab_size", where);
  KVDIFF_CHECK(g.vocab_size >= 1, "{}.vocab_size: expected >= 1, got {}", where, g.vocab_size);
  g.backend = GetStr(root, "backend", where);
  g.dtype = GetStr(root, "dtype", where);
  g.driver = GetStr(root, "driver", where);
  const json& tol = Field(root, "tolerance", where);
  KVDIFF_CHECK(tol.is_object(), "{}.tolerance: expected {{\"abs\": x}}, got {}", where, tol.dump());
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
  for (size_t i = 0; i < rows.size(); ++i) {
    GoldenRow r = ParseRow(rows[i], fmt::format("{}: rows[{}]", where, i));
    for (const auto& [id, logit] : r.top_k) {
      KVDIFF_CHECK(id >= 0 && id < g.vocab_size, "{}: rows[{}].top_k: id {} outside [0, {})", where,
                   i, id, g.vocab_size);
    }
    KVDIFF_CHECK(r.greedy >= 0 && r.greedy < g.vocab_size,
                 "{}: rows[{}].greedy: id {} outside [0, {})", where, i, r.greedy, g.vocab_size);
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
  in.model_json = json::parse(text).at("model");
  in.missing = MissingModelData(in.scenario.model);
  if (!in.missing.empty()) return in;
  for (const fs::path& f : ModelDataFiles(in.scenario.model))
    in.model_files[f.filename().string()] = Sha256File(f);
  in.weights = LoadModelFor(in.scenario.model);
  PrepareScenario(in.scenario, *in.weights);
  return in;
}

// ---------------------------------------------------------------------------------------------
// Replay

Recording RecordScenario(const Scenario& sc, const Backend& backend,
                         std::shared_ptr<const format::ModelWeights> weights, int threads,
                         bool check_oracle) {
  struct Conv {
    Tokens history;
    int64_t last_row = -1;  // index into rec.rows of the last position's row, -1 when none
  };
  const int64_t vocab = backend.config().vocab_size;
  Recording rec;
  std::unique_ptr<Driver> driver = MakeDriver(sc.driver, backend, weights, threads);
  std::map<std::string, Conv> convs = {{"main", Conv{}}};
  for (size_t i = 0; i < sc.steps.size(); ++i) {
    const Step& step = sc.steps[i];
    const size_t begin = rec.rows.size();
    try {
      Conv& conv = convs[step.conversation];
      auto append = [&](const Tokens& tokens, int64_t chosen_by) {
        const Logits logits = driver->Append(step.conversation, tokens, nullptr);
        KVDIFF_CHECK(logits.rows() == static_cast<int64_t>(tokens.size()) && logits.cols() == vocab,
                     "backend {} returned logits [{}, {}] for {} tokens; expected [{}, {}]",
                     backend.Name(), logits.rows(), logits.cols(), tokens.size(), tokens.size(),
                     vocab);
        for (size_t r = 0; r < tokens.size(); ++r) {
          conv.history.push_back(tokens[r]);
          RecordedRow row;
          row.step = static_cast<int64_t>(i);
          row.row = static_cast<int64_t>(rec.rows.size() - begin);
          row.conversation = step.conversation;
          row.position = static_cast<int64_t>(conv.history.size()) - 1;
          row.token = tokens[r];
          row.chosen_by = chosen_by;
          row.logits.assign(logits.row(r).data(), logits.row(r).data() + vocab);
          rec.rows.push_back(std::move(row));
        }
        conv.last_row = static_cast<int64_t>(rec.rows.size()) - 1;
      };
      switch (step.op) {
        case Op::kNewConversation:
          driver->NewConversation(step.name);
          conv = Conv{};
          break;
        case Op::kPrefill: {
          std::vector<int64_t> chunks = step.chunks;
          if (chunks.empty()) chunks = {static_cast<int64_t>(step.tokens.size())};
          size_t offset = 0;
          for (int64_t size : chunks) {
            append(Tokens(step.tokens.begin() + offset, step.tokens.begin() + offset + size), -1);
            offset += size;
          }
          break;
        }
        case Op::kDecode:
          for (int64_t k = 0; k < step.n; ++k) {
            KVDIFF_CHECK(conv.last_row >= 0, "decode: no previous row to take the argmax of");
            const int64_t next = Argmax(rec.rows[conv.last_row].logits.data(), vocab);
            KVDIFF_CHECK(next >= 0, "decode: the previous row has no finite logit to choose");
            append({static_cast<Token>(next)}, conv.last_row);
          }
          break;
        case Op::kTruncate:
          driver->Truncate(step.conversation, step.length);
          if (static_cast<int64_t>(conv.history.size()) != step.length) conv.last_row = -1;
          conv.history.resize(step.length);
          break;
        case Op::kFork:
          driver->Fork(step.from, step.to);
          conv = convs[step.from];
          break;
        case Op::kReset:
          driver->Reset(step.conversation);
          conv = Conv{};
          break;
      }
      if (check_oracle && rec.rows.size() > begin) {
        // Row p of a causal forward depends on tokens 0..p only: one ForwardFull over the history
        // up to the step's last row is the oracle of all its rows.
        const int64_t last = rec.rows.back().position;
        const Tokens prefix(conv.history.begin(), conv.history.begin() + last + 1);
        const Logits full = backend.ForwardFull(prefix);
        KVDIFF_CHECK(full.rows() == last + 1 && full.cols() == vocab,
                     "backend {} ForwardFull returned [{}, {}]; expected [{}, {}]", backend.Name(),
                     full.rows(), full.cols(), last + 1, vocab);
        for (size_t k = begin; k < rec.rows.size(); ++k) {
          RecordedRow& r = rec.rows[k];
          r.vs_oracle =
              CompareRows(r.logits.data(), full.row(r.position).data(), vocab, sc.tolerance_abs);
        }
      }
    } catch (const std::exception& e) {
      rec.error = fmt::format("step {} {}: {}", i, step.ParamString(), e.what());
      return rec;
    }
  }
  return rec;
}

// ---------------------------------------------------------------------------------------------
// regen

std::string GoldenChange::Summary() const {
  if (is_new) return fmt::format("new golden ({} rows)", rows_total);
  std::vector<std::string> parts;
  if (rows_changed > 0) {
    parts.push_back(fmt::format("{} of {} rows changed, largest change {}{}", rows_changed,
                                rows_total, FormatDiff(largest_change),
                                largest_where.empty() ? "" : " at " + largest_where));
    parts.push_back(
        fmt::format("{} token{} changed", tokens_changed, tokens_changed == 1 ? "" : "s"));
  }
  if (!header_fields.empty())
    parts.push_back(fmt::format("header: {}", fmt::join(header_fields, ", ")));
  if (parts.empty()) {
    return fmt::format("{} rows, nothing moved (largest change {})", rows_total,
                       FormatDiff(largest_change));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

GoldenChange DiffGolden(const Golden& a, const Golden& b) {
  GoldenChange c;
  c.rows_total = static_cast<int64_t>(b.rows.size());
  auto header = [&c](const char* name, bool same) {
    if (!same) c.header_fields.push_back(name);
  };
  header("scenario", a.scenario == b.scenario);
  header("scenario_sha256", a.scenario_sha256 == b.scenario_sha256);
  header("model", a.model == b.model);
  header("model_files", a.model_files == b.model_files);
  header("model_description", a.model_description == b.model_description);
  header("vocab_size", a.vocab_size == b.vocab_size);
  header("backend", a.backend == b.backend);
  header("dtype", a.dtype == b.dtype);
  header("driver", a.driver == b.driver);
  header("tolerance", a.tolerance == b.tolerance);
  header("top_k", a.top_k == b.top_k);
  header("kvdiff_version", a.kvdiff_version == b.kvdiff_version);
  header("regenerate", a.regenerate == b.regenerate);
  header("rows_file", a.rows_file == b.rows_file);
  if (a.rows.size() != b.rows.size() || a.vocab_size != b.vocab_size) {
    header("rows", false);
    c.rows_changed = c.rows_total;
    return c;
  }
  const double noise = kGoldenNoiseFraction * b.tolerance;
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const GoldenRow& x = a.rows[i];
    const GoldenRow& y = b.rows[i];
    bool changed = x.step != y.step || x.row != y.row || x.conversation != y.conversation ||
                   x.position != y.position || x.full != y.full || x.top_k.size() != y.top_k.size();
    if (x.token != y.token || x.greedy != y.greedy) {
      ++c.tokens_changed;
      changed = true;
    }
    double largest = std::max(std::fabs(x.max - y.max), std::fabs(x.min - y.min));
    std::map<Token, float> xs(x.top_k.begin(), x.top_k.end());
    for (const auto& [id, logit] : y.top_k) {
      auto it = xs.find(id);
      if (it == xs.end()) {
        changed = true;  // a different top-k set
      } else {
        largest = std::max(largest, std::fabs(double(it->second) - logit));
      }
    }
    if (!y.full.empty()) {
      auto fa = a.full_rows.find(x.full);
      auto fb = b.full_rows.find(y.full);
      const double d = (fa == a.full_rows.end() || fb == b.full_rows.end())
                           ? INFINITY
                           : MaxAbsDiff(fa->second, fb->second);
      if (std::isinf(d))
        changed = true;
      else
        largest = std::max(largest, d);
    }
    const DigestTolerance t = DigestTolerances(b.tolerance, b.vocab_size, y.sum_sq);
    if (largest > noise || std::fabs(x.sum - y.sum) > kGoldenNoiseFraction * t.sum ||
        std::fabs(x.sum_sq - y.sum_sq) > kGoldenNoiseFraction * t.sum_sq) {
      changed = true;
    }
    if (largest > c.largest_change) {
      c.largest_change = largest;
      c.largest_where = Where(y);
    }
    if (changed) ++c.rows_changed;
  }
  return c;
}

std::string RegenStatusName(RegenStatus s) {
  switch (s) {
    case RegenStatus::kUnchanged:
      return "unchanged";
    case RegenStatus::kWritten:
      return "written";
    case RegenStatus::kWouldChange:
      return "would change";
    case RegenStatus::kRefused:
      return "REFUSED";
    case RegenStatus::kSkipped:
      return "skip";
    case RegenStatus::kError:
      return "ERROR";
  }
  return "?";
}

RegenResult RegenGoldenSet(const GoldenPaths& paths, const RegenOptions& options) {
  RegenResult result;
  result.paths = paths;
  try {
    GoldenInput in = LoadGoldenInput(paths.scenario);
    if (!in.missing.empty()) {
      result.status = RegenStatus::kSkipped;
      result.message = in.missing;
      return result;
    }
    // The golden on disk, if any and readable, with its rows when the rows file matches it.
    std::optional<Golden> before;
    std::string before_problem;
    bool rows_file_matches = false;
    if (fs::exists(paths.golden)) {
      try {
        before = ParseGolden(ReadBytes(paths.golden), paths.golden.string());
        if (fs::exists(paths.rows) && Sha256File(paths.rows) == before->rows_sha256) {
          LoadFullRows(*before, paths.rows);
          rows_file_matches = true;
        }
      } catch (const InputError& e) {
        before.reset();
        before_problem = e.what();
      }
    }
    const std::string backend_name = !options.backend.empty() ? options.backend
                                     : before                 ? before->backend
                                                              : std::string(kGoldenDefaultBackend);
    KVDIFF_CHECK(Available(backend_name),
                 "{}: the golden is made with backend {}, which this kvdiff lacks (available: {}); "
                 "regenerate with a kvdiff built with LibTorch ({} still works against impl)",
                 paths.golden.string(), backend_name, fmt::join(AvailableBackends(), ", "),
                 "kvdiff golden verify");
    const std::string why = DriverNotApplicable(in.scenario.driver, backend_name);
    KVDIFF_CHECK(why.empty(), "{}: {}", paths.scenario.string(), why);
    const auto backend = MakeBackend(backend_name, in.weights, options.threads);
    const Recording rec = RecordScenario(in.scenario, *backend, in.weights, options.threads, true);
    if (!rec.error.empty()) {
      result.status = RegenStatus::kRefused;
      result.message = fmt::format("backend {} failed at {}", backend_name, rec.error);
      return result;
    }
    KVDIFF_CHECK(!rec.rows.empty(), "{}: the scenario produces no logits rows; nothing to pin",
                 paths.scenario.string());
    // A golden must never pin a bug: the backend's cached rows must equal its own uncached ones.
    for (const RecordedRow& r : rec.rows) {
      if (r.vs_oracle.within_tolerance) continue;
      const Step& step = in.scenario.steps[r.step];
      result.status = RegenStatus::kRefused;
      result.message = fmt::format(
          "backend {} disagrees with itself: at step {} {} row {} (conversation {}, position {}, "
          "input token {}) its cached logits differ from its uncached ForwardFull by {} at logit "
          "{} (tolerance {}); a golden must never pin a bug, so nothing was written",
          backend_name, r.step, step.ParamString(), r.row, r.conversation, r.position, r.token,
          FormatDiff(r.vs_oracle.max_abs_diff), r.vs_oracle.max_diff_index,
          FormatDiff(in.scenario.tolerance_abs));
      return result;
    }
    Golden now = MakeGolden(paths, in, rec, backend_name);
    for (size_t k = 0; k < rec.rows.size(); ++k) {
      const int64_t chooser = rec.rows[k].chosen_by;
      if (chooser < 0) continue;
      const GoldenRow& g = now.rows[chooser];
      if (g.top_k.size() < 2) continue;
      const double margin = double(g.top_k[0].second) - g.top_k[1].second;
      if (margin <= 2 * now.tolerance) {
        result.warnings.push_back(fmt::format(
            "{}: the greedy choice of {} (token {} over {}) has a margin of {}, within twice the "
            "tolerance: another backend may choose differently there",
            paths.golden.string(), Where(g), g.top_k[0].first, g.top_k[1].first,
            FormatDiff(margin)));
      }
    }
    const std::string rows_bytes = RowsFileBytes(now);
    now.rows_sha256 = Sha256Hex(rows_bytes);
    const std::string text = GoldenToText(now);

    if (before) {
      result.change = DiffGolden(*before, now);
      // The same values written by this kvdiff differently (a format change): rewrite.
      if (GoldenToText(*before) != ReadBytes(paths.golden)) {
        result.change.header_fields.push_back("text format");
      }
      if (!rows_file_matches) result.change.header_fields.push_back("rows file (missing or stale)");
    } else {
      result.change.is_new = true;
      result.change.rows_total = static_cast<int64_t>(now.rows.size());
      if (!before_problem.empty()) {
        result.change.is_new = false;
        result.change.rows_changed = result.change.rows_total;
        result.change.header_fields.push_back("unreadable before (" + before_problem + ")");
      }
    }
    if (!result.change.Any()) {
      result.status = RegenStatus::kUnchanged;  // nothing written: same bytes, same mtime
      return result;
    }
    if (options.check_only) {
      result.status = RegenStatus::kWouldChange;
      return result;
    }
    // Rows first, then the JSON that names their hash: a kill between the two leaves a JSON whose
    // rows_sha256 does not match, which verify reports and the next regen repairs.
    if (!fs::exists(paths.rows) || ReadBytes(paths.rows) != rows_bytes) {
      format::WriteFileAtomically(paths.rows, rows_bytes);
    }
    if (!fs::exists(paths.golden) || ReadBytes(paths.golden) != text) {
      format::WriteFileAtomically(paths.golden, text);
    }
    result.status = RegenStatus::kWritten;
  } catch (const InputError& e) {
    result.status = RegenStatus::kError;
    result.message = e.what();
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// verify

std::string CompareWithGolden(const GoldenRow& g, const std::vector<float>* full,
                              const RecordedRow& r, double tol, double* diff_out) {
  const int64_t vocab = static_cast<int64_t>(r.logits.size());
  const float* a = r.logits.data();
  double worst = 0;
  auto done = [&](std::string detail) {
    if (diff_out) *diff_out = worst;
    return detail;
  };
  if (r.token != g.token) {
    worst = INFINITY;
    return done(
        fmt::format("input token {}, the golden fed {} (an earlier greedy choice differed: the "
                    "histories split)",
                    r.token, g.token));
  }
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isfinite(a[i])) {
      worst = INFINITY;
      return done(fmt::format("logit {} is {} (not finite)", i, a[i]));
    }
  }
  // The golden's top-k logits, id by id.
  for (size_t k = 0; k < g.top_k.size(); ++k) {
    const auto [id, expected] = g.top_k[k];
    const double d = std::fabs(double(a[id]) - double(expected));
    worst = std::max(worst, d);
    if (d > tol) {
      return done(
          fmt::format("logit of token {} (golden rank {}) is {}, golden {}: |diff| {} > "
                      "tolerance {}",
                      id, k + 1, a[id], expected, FormatDiff(d), FormatDiff(tol)));
    }
  }
  // A token outside the golden's top-k had a golden logit <= its k-th; rising above that by more
  // than the tolerance is a difference beyond the tolerance.
  const GoldenRow mine = SummarizeRow(r.logits, static_cast<int>(g.top_k.size()));
  std::set<Token> golden_ids;
  for (const auto& [id, logit] : g.top_k) golden_ids.insert(id);
  const double kth = g.top_k.back().second;
  for (const auto& [id, logit] : mine.top_k) {
    if (golden_ids.count(id) || static_cast<int64_t>(g.top_k.size()) >= vocab) continue;
    if (double(logit) - kth > tol) {
      return done(
          fmt::format("token {} has logit {}, above the golden's rank-{} logit {} by {} "
                      "> tolerance {}, yet is not in the golden's top {}",
                      id, logit, g.top_k.size(), kth, FormatDiff(double(logit) - kth),
                      FormatDiff(tol), g.top_k.size()));
    }
  }
  const DigestTolerance t = DigestTolerances(tol, vocab, g.sum_sq);
  if (std::fabs(mine.sum - g.sum) > t.sum) {
    return done(fmt::format(
        "sum of the {} logits is {}, golden {}: |diff| {} > {} (vocab x "
        "tolerance)",
        vocab, mine.sum, g.sum, FormatDiff(std::fabs(mine.sum - g.sum)), FormatDiff(t.sum)));
  }
  if (std::fabs(mine.sum_sq - g.sum_sq) > t.sum_sq) {
    return done(fmt::format(
        "sum of squares of the {} logits is {}, golden {}: |diff| {} > {} (tolerance x (2 "
        "sqrt(vocab x sum_sq) + vocab x tolerance))",
        vocab, mine.sum_sq, g.sum_sq, FormatDiff(std::fabs(mine.sum_sq - g.sum_sq)),
        FormatDiff(t.sum_sq)));
  }
  if (std::fabs(mine.max - g.max) > t.max) {
    return done(fmt::format("max logit {}, golden {}: |diff| {} > tolerance {}", mine.max, g.max,
                            FormatDiff(std::fabs(mine.max - g.max)), FormatDiff(t.max)));
  }
  if (std::fabs(mine.min - g.min) > t.max) {
    return done(fmt::format("min logit {}, golden {}: |diff| {} > tolerance {}", mine.min, g.min,
                            FormatDiff(std::fabs(mine.min - g.min)), FormatDiff(t.max)));
  }
  if (mine.greedy != g.greedy) {
    // Reached only on a near-tie (every checked logit within tolerance), which is not a failure
    // of this row; the next decode row will show whether the histories split.
  }
  if (full) {
    const RowComparison c = CompareRows(a, full->data(), vocab, tol);
    worst = std::max(worst, c.max_abs_diff);
    if (!c.within_tolerance) {
      return done(fmt::format("full row: logit {} is {}, golden {}: |diff| {} > tolerance {}",
                              c.max_diff_index, a[c.max_diff_index], (*full)[c.max_diff_index],
                              FormatDiff(c.max_abs_diff), FormatDiff(tol)));
    }
  }
  return done("");
}

namespace {

GoldenCheck CheckBackend(const GoldenInput& in, const Golden& g, const std::string& name,
                         int threads) {
  GoldenCheck c;
  c.backend = name;
  const std::string why = DriverNotApplicable(in.scenario.driver, name);
  if (!why.empty()) {
    c.status = PathStatus::kSkipped;
    c.message = why;
    return c;
  }
  Recording rec;
  try {
    const auto backend = MakeBackend(name, in.weights, threads);
    rec = RecordScenario(in.scenario, *backend, in.weights, threads, false);
  } catch (const std::exception& e) {
    c.status = PathStatus::kError;
    c.message = e.what();
    return c;
  }
  const size_t n = std::min(rec.rows.size(), g.rows.size());
  for (size_t k = 0; k < n; ++k) {
    const RecordedRow& r = rec.rows[k];
    const GoldenRow& gr = g.rows[k];
    double diff = 0;
    std::string detail;
    if (r.step != gr.step || r.row != gr.row || r.position != gr.position ||
        r.conversation != gr.conversation) {
      detail = fmt::format(
          "the replay's row {} is step {} row {} (conversation {}, position {}); "
          "the golden's is step {} row {} (conversation {}, position {})",
          k, r.step, r.row, r.conversation, r.position, gr.step, gr.row, gr.conversation,
          gr.position);
      diff = INFINITY;
    } else {
      const std::vector<float>* full = gr.full.empty() ? nullptr : &g.full_rows.at(gr.full);
      detail = CompareWithGolden(gr, full, r, g.tolerance, &diff);
    }
    ++c.rows_compared;
    if (!(diff <= c.worst_diff)) c.worst_diff = diff;
    if (!detail.empty() && !c.first) {
      c.status = PathStatus::kFail;
      c.first = GoldenMismatch{gr.step,     in.scenario.steps[gr.step].ParamString(),
                               gr.row,      gr.conversation,
                               gr.position, gr.token,
                               detail,      diff};
    }
  }
  if (!rec.error.empty()) {
    if (c.status == PathStatus::kPass) c.status = PathStatus::kError;
    c.message = fmt::format("backend {} failed at {}", name, rec.error);
  } else if (rec.rows.size() != g.rows.size()) {
    c.status = PathStatus::kFail;
    c.message = fmt::format("the replay produced {} rows; the golden has {}", rec.rows.size(),
                            g.rows.size());
  }
  return c;
}

GoldenSetReport VerifySet(const GoldenPaths& p, const std::vector<std::string>& backends,
                          int threads) {
  GoldenSetReport rep;
  rep.paths = p;
  try {
    KVDIFF_CHECK(fs::exists(p.scenario), "{}: no such scenario file", p.scenario.string());
    KVDIFF_CHECK(fs::exists(p.golden),
                 "{}: no golden file; create it with `kvdiff golden regen {}`", p.golden.string(),
                 p.scenario.string());
    Golden g = ParseGolden(ReadBytes(p.golden), p.golden.string());
    rep.made_with = g.backend;
    rep.tolerance = g.tolerance;
    rep.model = g.model.dump();
    GoldenInput in = LoadGoldenInput(p.scenario);
    if (!in.missing.empty()) {
      rep.skipped = in.missing;
      return rep;
    }
    const std::string regen = fmt::format("run `kvdiff golden regen {}`", p.scenario.string());
    if (in.scenario_sha256 != g.scenario_sha256) {
      rep.stale = fmt::format(
          "{} was edited after its golden was made (sha256 {}, the golden "
          "recorded {}); {}",
          p.scenario.string(), in.scenario_sha256, g.scenario_sha256, regen);
    } else if (in.model_files != g.model_files) {
      rep.stale = fmt::format(
          "the model files differ from those the golden was made with ({} "
          "now, {} recorded); {}",
          json(in.model_files).dump(), json(g.model_files).dump(), regen);
    } else if (in.weights->config.vocab_size != g.vocab_size) {
      rep.stale = fmt::format("the model's vocab_size is {}, the golden's {}; {}",
                              in.weights->config.vocab_size, g.vocab_size, regen);
    } else if (!fs::exists(p.rows) || Sha256File(p.rows) != g.rows_sha256) {
      rep.stale = fmt::format(
          "{} is missing or does not match the rows_sha256 of {} (an "
          "interrupted regen?); {}",
          p.rows.string(), p.golden.string(), regen);
    }
    if (!rep.stale.empty()) return rep;
    LoadFullRows(g, p.rows);
    for (const std::string& name : backends)
      rep.checks.push_back(CheckBackend(in, g, name, threads));
  } catch (const InputError& e) {
    rep.input_error = e.what();
  }
  return rep;
}


std::string MismatchText(const GoldenSetReport& s, const GoldenCheck& c) {
  if (c.first) {
    const GoldenMismatch& m = *c.first;
    return fmt::format(
        "{}: {} differs from the golden (made with {}) at step {} {}, row {} "
        "(conversation {}, position {}, input token {}): {}",
        s.paths.golden.string(), c.backend, s.made_with, m.step, m.params, m.row, m.conversation,
        m.position, m.token, m.detail);
  }
  return fmt::format("{}: {}: {}", s.paths.golden.string(), c.backend, c.message);
}

// One line per problem of a set (empty when it passed or was skipped).
std::vector<std::string> Problems(const GoldenSetReport& s) {
  std::vector<std::string> out;
  if (!s.input_error.empty()) out.push_back(fmt::format("error: {}", s.input_error));
  if (!s.stale.empty())
    out.push_back(fmt::format("{}: stale golden: {}", s.paths.golden.string(), s.stale));
  for (const GoldenCheck& c : s.checks) {
    if (c.status == PathStatus::kFail || c.status == PathStatus::kError) {
      out.push_back(MismatchText(s, c));
      if (c.first && !c.message.empty()) out.push_back(fmt::format("  also: {}", c.message));
    }
  }
  return out;
}

json CheckToJson(const GoldenCheck& c) {
  json j = {{"backend", c.backend},
            {"status", PathStatusName(c.status)},
            {"rows_compared", c.rows_compared},
            {"worst_diff", Number(c.worst_diff)}};
  if (!c.message.empty()) j["message"] = c.message;
  if (c.first) {
    j["first_mismatch"] = {{"step", c.first->step},         {"params", c.first->params},
                           {"row", c.first->row},           {"conversation", c.first->conversation},
                           {"position", c.first->position}, {"token", c.first->token},
                           {"detail", c.first->detail},     {"diff", Number(c.first->diff)}};
  } else {
    j["first_mismatch"] = nullptr;
  }
  return j;
}

}  // namespace

bool GoldenSetReport::Passed() const {
  if (!input_error.empty() || !stale.empty()) return false;
  for (const GoldenCheck& c : checks)
    if (c.status == PathStatus::kFail || c.status == PathStatus::kError) return false;
  return true;
}

int VerifyReport::ExitCode() const {
  int code = 0;
  for (const GoldenSetReport& s : sets) {
    if (!s.input_error.empty()) return 2;
    if (!s.Passed()) code = 1;
  }
  return code;
}

VerifyReport VerifyGoldens(const std::vector<GoldenPaths>& sets,
                           const std::vector<std::string>& requested, int threads) {
  const auto start = std::chrono::steady_clock::now();
  VerifyReport report;
  report.backends = requested.empty() ? DefaultBackends() : requested;
  for (const std::string& b : report.backends) {
    KVDIFF_CHECK(Available(b), "--backends: {} is not available in this build (available: {})", b,
                 fmt::join(AvailableBackends(), ", "));
  }
  for (const GoldenPaths& p : sets) report.sets.push_back(VerifySet(p, report.backends, threads));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::string VerifyReport::ToTerminal(bool color) const {
  std::string out =
      Paint(fmt::format("kvdiff golden verify: {} golden set{}, backends {}", sets.size(),
                        sets.size() == 1 ? "" : "s", fmt::join(backends, ", ")),
            kBold, color) +
      "\n\n";
  size_t width = 6;
  for (const auto& s : sets) width = std::max(width, s.paths.golden.string().size());
  out += fmt::format("{:<{}}  {:<7}", "golden", width, "made by");
  for (const auto& b : backends) out += fmt::format("  {:<14}", b);
  out += "\n";
  int64_t failed = 0, skipped = 0, rows = 0;
  double worst = 0;
  for (const auto& s : sets) {
    out += fmt::format("{:<{}}  {:<7}", s.paths.golden.string(), width,
                       s.made_with.empty() ? "?" : s.made_with);
    if (!s.input_error.empty()) {
      out += "  " + Paint("ERROR", kRed, color);
    } else if (!s.stale.empty()) {
      out += "  " + Paint("STALE", kRed, color);
    } else if (!s.skipped.empty()) {
      out += "  " + Paint("skip: model data absent", kYellow, color);
      ++skipped;
    }
    for (const auto& c : s.checks) {
      std::string cell = PathStatusName(c.status);
      if (c.status == PathStatus::kPass || c.status == PathStatus::kFail) {
        cell += " " + FormatDiff(c.worst_diff);
      }
      const char* colour = c.status == PathStatus::kPass      ? kGreen
                           : c.status == PathStatus::kSkipped ? kYellow
                                                              : kRed;
      out += "  " + Paint(fmt::format("{:<14}", cell), colour, color);
      rows += c.rows_compared;
      if (!(c.worst_diff <= worst)) worst = c.worst_diff;
    }
    out += "\n";
    if (!s.Passed()) ++failed;
  }
  out += "\n";
  for (const auto& s : sets) {
    if (!s.skipped.empty())
      out +=
          Paint(fmt::format("skip: {}: {}", s.paths.golden.string(), s.skipped), kYellow, color) +
          "\n";
    for (const auto& c : s.checks) {
      if (c.status == PathStatus::kSkipped) {
        out +=
            Paint(fmt::format("skip: {} on {}: {}", s.paths.golden.string(), c.backend, c.message),
                  kYellow, color) +
            "\n";
      }
    }
  }
  for (const auto& s : sets) {
    for (const auto& line : Problems(s)) out += Paint(line, kRed, color) + "\n";
  }
  const std::string verdict =
      failed == 0 ? Paint("PASS", kGreen, color) : Paint("FAIL", kRed, color);
  out += fmt::format(
      "{}: {} of {} golden sets failed, {} skipped; {} rows compared, worst "
      "difference {} ({:.2f} s)\n",
      verdict, failed, sets.size(), skipped, rows, FormatDiff(worst), seconds);
  return out;
}

json VerifyReport::ToJson() const {
  json jsets = json::array();
  int64_t rows = 0;
  double worst = 0;
  for (const auto& s : sets) {
    json checks = json::array();
    for (const auto& c : s.checks) {
      checks.push_back(CheckToJson(c));
      rows += c.rows_compared;
      if (!(c.worst_diff <= worst)) worst = c.worst_diff;
    }
    json j = {{"golden", s.paths.golden.string()},
              {"scenario", s.paths.scenario.string()},
              {"rows_file", s.paths.rows.string()},
              {"made_with", s.made_with},
              {"tolerance", {{"abs", s.tolerance}}},
              {"passed", s.Passed()},
              {"checks", checks}};
    if (!s.model.empty()) j["model"] = json::parse(s.model);
    if (!s.skipped.empty()) j["skipped"] = s.skipped;
    if (!s.input_error.empty()) j["error"] = s.input_error;
    if (!s.stale.empty()) j["stale"] = s.stale;
    jsets.push_back(j);
  }
  std::vector<std::string> problems;
  for (const auto& s : sets)
    for (const auto& p : Problems(s)) problems.push_back(p);
  return {{"kvdiff_version", KVDIFF_VERSION},
          {"command", "golden verify"},
          {"backends", backends},
          {"passed", ExitCode() == 0},
          {"exit_code", ExitCode()},
          {"rows_compared", rows},
          {"worst_diff", Number(worst)},
          {"seconds", seconds},
          {"problems", problems},
          {"sets", jsets}};
}

std::string VerifyReport::ToJUnit() const {
  // One <testsuite> per golden set, one <testcase> per backend; a set that cannot be read or is
  // stale is one failing testcase named after the file.
  std::string suites;
  int64_t tests = 0, failures = 0, errors = 0;
  for (const auto& s : sets) {
    // classname: the set's path as dotted package names ("kvdiff.golden.golden.tiny.fork"), as CI
    // systems group testcases by the dots.
    std::string dotted = (s.paths.golden.parent_path() / s.paths.scenario.stem()).string();
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    const std::string suite = "kvdiff.golden." + dotted;
    std::string cases;
    int64_t st = 0, sf = 0, se = 0, ss = 0;
    auto add_case = [&](const std::string& name, const std::string& body) {
      ++st;
      cases += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"0\"",
                           XmlEscape(suite), XmlEscape(name));
      cases += body.empty() ? "/>\n" : ">\n" + body + "    </testcase>\n";
    };
    auto failure = [](const char* tag, const char* type, const std::string& text) {
      return fmt::format("      <{} type=\"{}\" message=\"{}\">{}</{}>\n", tag, type,
                         XmlEscape(text.substr(0, text.find('\n'))), XmlEscape(text), tag);
    };
    if (!s.input_error.empty()) {
      ++se;
      add_case("read", failure("error", "input_error", s.input_error));
    } else if (!s.stale.empty()) {
      ++sf;
      add_case("current", failure("failure", "stale_golden", s.stale));
    } else if (!s.skipped.empty()) {
      ++ss;
      add_case("model", fmt::format("      <skipped message=\"{}\"/>\n", XmlEscape(s.skipped)));
    }
    for (const auto& c : s.checks) {
      if (c.status == PathStatus::kFail || c.status == PathStatus::kError) {
        ++sf;
        add_case(c.backend,
                 failure("failure", c.status == PathStatus::kFail ? "mismatch" : "backend_error",
                         MismatchText(s, c)));
      } else if (c.status == PathStatus::kSkipped) {
        ++ss;
        add_case(c.backend, fmt::format("      <skipped message=\"{}\"/>\n", XmlEscape(c.message)));
      } else {
        add_case(c.backend, "");
      }
    }
    suites += fmt::format(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" "
        "time=\"0\">\n",
        XmlEscape(s.paths.golden.string()), st, sf, se, ss);
    suites += "    <properties>\n";
    suites +=
        fmt::format("      <property name=\"made_with\" value=\"{}\"/>\n", XmlEscape(s.made_with));
    suites += fmt::format("      <property name=\"tolerance_abs\" value=\"{}\"/>\n", s.tolerance);
    suites += "    </properties>\n" + cases + "  </testsuite>\n";
    tests += st;
    failures += sf;
    errors += se;
  }
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"kvdiff golden verify\" "
      "tests=\"{}\" failures=\"{}\" errors=\"{}\" time=\"{:.3f}\">\n{}</testsuites>\n",
      tests, failures, errors, seconds, suites);
}

}  // namespace kvdiff::harness
