#include "harness/scenario/scenario.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "format/error.h"
#include "format/input_file.h"
#include "format/json_document.h"
#include "format/json_field.h"
#include "harness/backend/registry.h"
#include "harness/scenario/batch_step.h"
#include "harness/scenario/shape_params.h"

namespace kvdiff::harness {
namespace {

using format::JsonSnippet;
using nlohmann::json;

std::string TypeName(const json& value) { return value.type_name(); }

// A scenario's messages name the type found: `steps[2].n: expected an integer, got string "x"`.
constexpr format::JsonFieldWords kScenarioWords{"{}", "got", true};

// Refuses every key of obj not in allowed, naming the place and listing what is allowed.
void CheckKeys(const json& obj, const std::string& where, const std::set<std::string>& allowed) {
  format::RefuseUnknownJsonFields(obj, where, {allowed.begin(), allowed.end()});
}

int64_t GetInt(const json& obj, const std::string& key, const std::string& where, int64_t min) {
  const int64_t value = format::RequiredJsonInt(obj, key, where, kScenarioWords);
  KVDIFF_CHECK(value >= min, "{}.{}: expected an integer >= {}, got {}", where, key, min, value);
  return value;
}

std::string GetString(const json& obj, const std::string& key, const std::string& where) {
  return format::RequiredJsonString(obj, key, where, kScenarioWords);
}

std::string GetName(const json& obj, const std::string& key, const std::string& where) {
  std::string name = GetString(obj, key, where);
  KVDIFF_CHECK(!name.empty(), "{}.{}: a conversation name must not be empty", where, key);
  return name;
}

void Require(const json& obj, const std::string& key, const std::string& where,
             const std::string& op) {
  KVDIFF_CHECK(obj.contains(key), "{}: \"{}\" needs the field \"{}\"", where, op, key);
}

Op ParseOp(const std::string& name, const std::string& where) {
  static const std::map<std::string, Op> kOps = {{"new_conversation", Op::kNewConversation},
                                                 {"prefill", Op::kPrefill},
                                                 {"decode", Op::kDecode},
                                                 {"truncate", Op::kTruncate},
                                                 {"fork", Op::kFork},
                                                 {"reset", Op::kReset},
                                                 {"end", Op::kEnd},
                                                 {"batch", Op::kBatch},
                                                 {"shift", Op::kShift}};
  auto it = kOps.find(name);
  KVDIFF_CHECK(it != kOps.end(),
               "{}.op: unknown op \"{}\" (expected new_conversation, prefill, decode, truncate, "
               "fork, reset, end, batch or shift)",
               where, name);
  return it->second;
}

// A chat: [{"role": "user", "content": "..."}, ...], each message exactly these two strings.
std::vector<format::ChatMessage> ParseMessages(const json& m, const std::string& where) {
  KVDIFF_CHECK(m.is_array() && !m.empty(),
               "{}: expected a non-empty array of {{\"role\": ..., \"content\": ...}} objects, got "
               "{}",
               where, TypeName(m));
  std::vector<format::ChatMessage> messages;
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    KVDIFF_CHECK(m[i].is_object(), "{}: expected an object with \"role\" and \"content\", got {}",
                 at, TypeName(m[i]));
    CheckKeys(m[i], at, {"role", "content"});
    KVDIFF_CHECK(m[i].contains("role") && m[i].contains("content"),
                 "{}: a message needs both \"role\" and \"content\"", at);
    messages.push_back({GetString(m[i], "role", at), GetString(m[i], "content", at)});
    KVDIFF_CHECK(!messages.back().role.empty(), "{}.role: must not be empty", at);
  }
  return messages;
}

// A prefill's tokens (or text, or chat messages) and chunk sizes.
Step ParsePrefill(const json& s, const std::string& where, const std::string& conversation) {
  Step step = Step::Prefill(conversation, {});
  KVDIFF_CHECK(s.contains("tokens") + s.contains("text") + s.contains("messages") == 1,
               "{}: \"prefill\" needs exactly one of \"tokens\", \"text\" or \"messages\"", where);
  if (s.contains("tokens")) {
    const json& t = s.at("tokens");
    KVDIFF_CHECK(t.is_array(), "{}.tokens: expected an array of token ids, got {} {}", where,
                 TypeName(t), JsonSnippet(t));
    KVDIFF_CHECK(!t.empty(), "{}.tokens: must not be empty", where);
    for (size_t i = 0; i < t.size(); ++i) {
      KVDIFF_CHECK(
          t[i].is_number_integer() && t[i].get<int64_t>() >= 0 && t[i].get<int64_t>() <= INT32_MAX,
          "{}.tokens[{}]: expected a non-negative integer token id, got {}", where, i,
          JsonSnippet(t[i]));
      step.tokens.push_back(static_cast<Token>(t[i].get<int64_t>()));
    }
  } else if (s.contains("text")) {
    step.text = GetString(s, "text", where);
    KVDIFF_CHECK(!step.text->empty(), "{}.text: must not be empty", where);
  } else {
    step.messages = ParseMessages(s.at("messages"), where + ".messages");
  }
  if (s.contains("chunks")) {
    const json& c = s.at("chunks");
    KVDIFF_CHECK(c.is_array() && !c.empty(),
                 "{}.chunks: expected a non-empty array of chunk sizes, got {}", where,
                 JsonSnippet(c));
    int64_t sum = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      KVDIFF_CHECK(
          c[i].is_number_integer() && c[i].get<int64_t>() >= 1 && c[i].get<int64_t>() <= INT32_MAX,
          "{}.chunks[{}]: expected a chunk size >= 1, got {}", where, i, JsonSnippet(c[i]));
      step.chunks.push_back(c[i].get<int64_t>());
      sum += step.chunks.back();
    }
    if (!step.text && !step.messages) {
      KVDIFF_CHECK(sum == static_cast<int64_t>(step.tokens.size()),
                   "{}.chunks: sizes sum to {} but tokens has {}", where, sum, step.tokens.size());
    }
  }
  return step;
}

// Every op's fields, read and checked; the step is built by its named constructor.
Step ParseStep(const json& s, size_t index) {
  const std::string where = fmt::format("steps[{}]", index);
  KVDIFF_CHECK(s.is_object(), "{}: expected an object, got {} {}", where, TypeName(s),
               JsonSnippet(s));
  KVDIFF_CHECK(s.contains("op"), "{}: missing field \"op\"", where);
  const Op op_kind = ParseOp(GetString(s, "op", where), where);
  const std::string op = OpName(op_kind);
  auto conversation = [&] {
    return s.contains("conversation") ? GetName(s, "conversation", where) : std::string("main");
  };
  switch (op_kind) {
    case Op::kNewConversation:
      CheckKeys(s, where, {"op", "name"});
      Require(s, "name", where, op);
      return Step::NewConversation(GetName(s, "name", where));
    case Op::kPrefill:
      CheckKeys(s, where, {"op", "conversation", "tokens", "text", "messages", "chunks"});
      return ParsePrefill(s, where, conversation());
    case Op::kDecode:
      CheckKeys(s, where, {"op", "conversation", "n"});
      Require(s, "n", where, op);
      return Step::Decode(conversation(), GetInt(s, "n", where, 1));
    case Op::kTruncate:
      CheckKeys(s, where, {"op", "conversation", "length"});
      Require(s, "length", where, op);
      return Step::Truncate(conversation(), GetInt(s, "length", where, 0));
    case Op::kFork:
      CheckKeys(s, where, {"op", "from", "to"});
      Require(s, "from", where, op);
      Require(s, "to", where, op);
      return Step::Fork(GetName(s, "from", where), GetName(s, "to", where));
    case Op::kReset:
      CheckKeys(s, where, {"op", "conversation"});
      return Step::Reset(conversation());
    case Op::kEnd:
      CheckKeys(s, where, {"op", "conversation"});
      return Step::End(conversation());
    case Op::kBatch:
      return ParseBatchStep(s, where);
    case Op::kShift:
      CheckKeys(s, where, {"op", "conversation", "keep", "discard"});
      Require(s, "keep", where, op);
      Require(s, "discard", where, op);
      return Step::Shift(conversation(), GetInt(s, "keep", where, 0),
                         GetInt(s, "discard", where, 0));
  }
  throw InputError(fmt::format("{}: unknown op", where));
}

// A relative path in a scenario file names a file beside it, not one in the working folder.
std::filesystem::path ResolvePath(const json& obj, const std::string& key, const std::string& where,
                                  const std::filesystem::path& base_dir) {
  std::filesystem::path p = GetString(obj, key, where);
  KVDIFF_CHECK(!p.empty(), "{}.{}: must not be empty", where, key);
  if (p.is_relative() && !base_dir.empty()) p = base_dir / p;
  return p.lexically_normal();
}

// "seed" of a preset or inline config: the random weights' seed, 0 when absent.
uint64_t ParseWeightSeed(const json& m) {
  if (!m.contains("seed")) return 0;
  const json& seed = m.at("seed");
  KVDIFF_CHECK(seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0),
               "model.seed: expected an integer >= 0, got {}", JsonSnippet(seed));
  return seed.get<uint64_t>();
}

// model.scale: the string form ParseRandomModelScale reads ("demanding", "scores=25,logits=300")
// or an object of the same factors, each a number.
format::RandomModelScale ParseModelScale(const json& s) {
  if (s.is_string()) return format::ParseRandomModelScale(s.get<std::string>(), "model.scale");
  KVDIFF_CHECK(s.is_object(),
               "model.scale: expected \"demanding\", \"scores=25,activations=1e19,logits=300\" "
               "or an object like {{\"scores\": 25, \"logits\": 300}}, got {}",
               JsonSnippet(s));
  CheckKeys(s, "model.scale", {"scores", "activations", "logits"});
  format::RandomModelScale scale;
  for (auto [key, field] : {std::pair<const char*, double*>{"scores", &scale.scores},
                            {"activations", &scale.activations},
                            {"logits", &scale.logits}}) {
    if (!s.contains(key)) continue;
    KVDIFF_CHECK(s.at(key).is_number(), "model.scale.{}: expected a number, got {}", key,
                 JsonSnippet(s.at(key)));
    *field = s.at(key).get<double>();
  }
  format::ValidateRandomModelScale(scale, "model.scale");
  return scale;
}

ModelSpec ParseModel(const json& m, const std::filesystem::path& base_dir) {
  KVDIFF_CHECK(m.is_object(),
               "model: expected an object like {{\"preset\": \"tiny\", \"seed\": 3}}, "
               "{{\"path\": \"DIR\"}}, {{\"llama2c\": {{\"checkpoint\": \"FILE.bin\", "
               "\"tokenizer\": \"FILE.bin\"}}}} or {{\"config\": {{...}}, \"seed\": 3}}, got {}",
               JsonSnippet(m));
  ModelSpec spec;
  if (m.contains("path")) {
    CheckKeys(m, "model", {"path"});
    spec.path = ResolvePath(m, "path", "model", base_dir);
  } else if (m.contains("llama2c")) {
    CheckKeys(m, "model", {"llama2c"});
    const json& l = m.at("llama2c");
    KVDIFF_CHECK(l.is_object(),
                 "model.llama2c: expected an object like {{\"checkpoint\": \"FILE.bin\", "
                 "\"tokenizer\": \"FILE.bin\"}}, got {}",
                 JsonSnippet(l));
    CheckKeys(l, "model.llama2c", {"checkpoint", "tokenizer"});
    KVDIFF_CHECK(l.contains("checkpoint"),
                 "model.llama2c: missing field \"checkpoint\" (the llama2.c .bin model file)");
    Llama2cSpec spec_l;
    spec_l.checkpoint = ResolvePath(l, "checkpoint", "model.llama2c", base_dir);
    if (l.contains("tokenizer"))
      spec_l.tokenizer = ResolvePath(l, "tokenizer", "model.llama2c", base_dir);
    spec.llama2c = spec_l;
  } else if (m.contains("config")) {
    CheckKeys(m, "model", {"config", "seed", "scale"});
    if (m.contains("scale")) spec.scale = ParseModelScale(m.at("scale"));
    const json& c = m.at("config");
    KVDIFF_CHECK(c.is_object(),
                 "model.config: expected an object of config.json's fields (\"hidden_size\", "
                 "\"num_attention_heads\", ...), got {}",
                 JsonSnippet(c));
    // config.json's own parser and validator, held to the fields it knows.
    spec.config = format::ParseConfigStrict(c.dump(), "model.config");
    spec.seed = ParseWeightSeed(m);
  } else {
    CheckKeys(m, "model", {"preset", "seed", "scale"});
    if (m.contains("scale")) spec.scale = ParseModelScale(m.at("scale"));
    KVDIFF_CHECK(m.contains("preset"),
                 "model: needs \"preset\" (with \"seed\"), \"path\", \"llama2c\" or "
                 "\"config\" (with \"seed\")");
    spec.preset = GetString(m, "preset", "model");
    spec.seed = ParseWeightSeed(m);
  }
  return spec;
}

}  // namespace

std::string ModelSpec::Describe() const {
  if (path) return "path " + path->string();
  if (llama2c) {
    return fmt::format("llama2c {}, {}", llama2c->checkpoint.string(),
                       llama2c->tokenizer ? "tokenizer " + llama2c->tokenizer->string()
                                          : std::string("no tokenizer"));
  }
  const std::string scaled = scale.IsDefault() ? std::string() : ", scale " + scale.ToString();
  if (config) return fmt::format("config({}), seed {}{}", ShapeParams(*config), seed, scaled);
  return fmt::format("preset {}, seed {}{}", preset.value_or("?"), seed, scaled);
}

nlohmann::json ModelSpec::ToJson() const {
  if (path) return {{"path", path->string()}};
  if (llama2c) {
    json l = {{"checkpoint", llama2c->checkpoint.string()}};
    if (llama2c->tokenizer) l["tokenizer"] = llama2c->tokenizer->string();
    return {{"llama2c", l}};
  }
  json out = config ? json{{"config", json::parse(format::ConfigToJson(*config))}, {"seed", seed}}
                    : json{{"preset", preset.value_or("")}, {"seed", seed}};
  if (!scale.IsDefault()) out["scale"] = scale.ToString();
  return out;
}

nlohmann::json Scenario::ToJson() const {
  json steps_json = json::array();
  for (const Step& s : steps) {
    json j = {{"op", OpName(s.op)}};
    switch (s.op) {
      case Op::kNewConversation:
        j["name"] = s.name;
        break;
      case Op::kPrefill:
        j["conversation"] = s.conversation;
        if (s.text) {
          j["text"] = *s.text;
        } else if (s.messages) {
          j["messages"] = json::array();
          for (const format::ChatMessage& m : *s.messages)
            j["messages"].push_back({{"role", m.role}, {"content", m.content}});
        } else
          j["tokens"] = s.tokens;
        if (!s.chunks.empty()) j["chunks"] = s.chunks;
        break;
      case Op::kDecode:
        j["conversation"] = s.conversation;
        j["n"] = s.n;
        break;
      case Op::kTruncate:
        j["conversation"] = s.conversation;
        j["length"] = s.length;
        break;
      case Op::kFork:
        j["from"] = s.from;
        j["to"] = s.to;
        break;
      case Op::kReset:
      case Op::kEnd:
        j["conversation"] = s.conversation;
        break;
      case Op::kBatch:
        j["items"] = BatchItemsToJson(s);
        break;
      case Op::kShift:
        j["conversation"] = s.conversation;
        j["keep"] = s.keep;
        j["discard"] = s.discard;
        break;
    }
    steps_json.push_back(j);
  }
  json out = json::object();
  if (!description.empty()) out["description"] = description;
  out["model"] = model.ToJson();
  out["driver"] = DriverName(driver);
  out["tolerance"] = {{"abs", gate.abs}};
  if (gate.rel > 0) out["tolerance"]["rel"] = gate.rel;
  if (!backends.empty()) out["backends"] = backends;
  out["steps"] = steps_json;
  return out;
}

std::string Scenario::ToText() const {
  const json j = ToJson();
  std::string out = "{\n";
  bool first = true;
  for (const char* key : {"description", "model", "driver", "tolerance", "backends"}) {
    if (!j.contains(key)) continue;
    out += fmt::format("{}  \"{}\": {}", first ? "" : ",\n", key, j.at(key).dump());
    first = false;
  }
  out += ",\n  \"steps\": [\n";
  const json& steps = j.at("steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    out += fmt::format("    {}{}\n", steps[i].dump(), i + 1 < steps.size() ? "," : "");
  }
  return out + "  ]\n}\n";
}

Scenario ParseScenario(const std::string& json_text, const std::filesystem::path& base_dir) {
  const json root = format::ParseJsonDocument(json_text, "scenario");
  KVDIFF_CHECK(root.is_object(), "scenario: expected a JSON object at the top, got {}",
               TypeName(root));
  CheckKeys(root, "scenario", {"description", "model", "tolerance", "backends", "driver", "steps"});
  Scenario sc;
  if (root.contains("description")) sc.description = GetString(root, "description", "scenario");
  KVDIFF_CHECK(root.contains("model"),
               "scenario: missing field \"model\" ({{\"preset\": \"tiny\", \"seed\": 3}}, "
               "{{\"path\": \"DIR\"}}, {{\"llama2c\": {{\"checkpoint\": \"FILE.bin\"}}}} or "
               "{{\"config\": {{...}}, \"seed\": 3}})");
  sc.model = ParseModel(root.at("model"), base_dir);
  if (root.contains("tolerance")) {
    const json& t = root.at("tolerance");
    KVDIFF_CHECK(t.is_object(), "tolerance: expected an object like {{\"abs\": 1e-4}}, got {}",
                 JsonSnippet(t));
    CheckKeys(t, "tolerance", {"abs", "rel"});
    if (t.contains("rel")) {
      KVDIFF_CHECK(t.at("rel").is_number(), "tolerance.rel: expected a number, got {}",
                   JsonSnippet(t.at("rel")));
      sc.gate.rel = t.at("rel").get<double>();
      KVDIFF_CHECK(sc.gate.rel >= 0 && sc.gate.rel < 1 && std::isfinite(sc.gate.rel),
                   "tolerance.rel: expected a number >= 0 and < 1 (a fraction of the row's max "
                   "|logit|), got {}",
                   JsonSnippet(t.at("rel")));
    }
    if (t.contains("abs")) {
      KVDIFF_CHECK(t.at("abs").is_number(), "tolerance.abs: expected a number, got {}",
                   JsonSnippet(t.at("abs")));
      sc.gate.abs = t.at("abs").get<double>();
      KVDIFF_CHECK(sc.gate.abs >= 0 && std::isfinite(sc.gate.abs),
                   "tolerance.abs: expected a finite number >= 0, got {}",
                   JsonSnippet(t.at("abs")));
    }
  }
  if (root.contains("backends")) {
    const json& b = root.at("backends");
    KVDIFF_CHECK(b.is_array() && !b.empty(),
                 "backends: expected a non-empty array like [\"impl\", \"ref\"], got {}",
                 JsonSnippet(b));
    for (size_t i = 0; i < b.size(); ++i) {
      KVDIFF_CHECK(b[i].is_string(), "backends[{}]: expected a backend name, got {}", i,
                   JsonSnippet(b[i]));
      const std::string name = b[i].get<std::string>();
      KVDIFF_CHECK(BackendRegistry::Global().Knows(name),
                   "backends[{}]: unknown backend \"{}\" (expected one of {})", i, name,
                   BackendRegistry::Global().NamesText());
      for (const auto& seen : sc.backends)
        KVDIFF_CHECK(seen != name, "backends[{}]: \"{}\" is listed twice", i, name);
      sc.backends.push_back(name);
    }
  }
  if (root.contains("driver")) sc.driver = ParseDriverName(GetString(root, "driver", "scenario"));
  KVDIFF_CHECK(root.contains("steps"), "scenario: missing field \"steps\"");
  const json& steps = root.at("steps");
  KVDIFF_CHECK(steps.is_array() && !steps.empty(),
               "steps: expected a non-empty array of steps, got {}", JsonSnippet(steps));
  KVDIFF_CHECK(steps.size() <= static_cast<size_t>(kMaxScenarioSteps),
               "steps: {} steps, more than a scenario may have ({})", steps.size(),
               kMaxScenarioSteps);
  for (size_t i = 0; i < steps.size(); ++i) sc.steps.push_back(ParseStep(steps[i], i));
  return sc;
}

Scenario LoadScenario(const std::filesystem::path& file) {
  const std::string text = format::ReadInputFile(file, "scenario");
  Scenario sc;
  try {
    sc = ParseScenario(text, file.parent_path());
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", file.string(), e.what()));
  }
  sc.name = file.stem().string();
  return sc;
}

std::vector<std::string> ParseBackendList(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    KVDIFF_CHECK(!item.empty(), "--backends: empty name in \"{}\" (expected e.g. impl,ref)", list);
    KVDIFF_CHECK(BackendRegistry::Global().Knows(item),
                 "--backends: unknown backend \"{}\" (expected one of {})", item,
                 BackendRegistry::Global().NamesText());
    for (const auto& seen : out)
      KVDIFF_CHECK(seen != item, "--backends: \"{}\" is listed twice", item);
    out.push_back(item);
  }
  KVDIFF_CHECK(!out.empty(), "--backends: no backend named (expected e.g. impl,ref)");
  return out;
}

}  // namespace kvdiff::harness
