#include "format/config.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "format/error.h"
#include "format/input_file.h"
#include "format/json_document.h"
#include "format/json_field.h"

namespace kvdiff::format {
namespace {

using nlohmann::json;

// Every size must also fit the int indices of the kernels; nothing real comes near 2^31.
constexpr int64_t kMaxDimension = int64_t{1} << 31;

// config.json's messages: `config.json field "rope_theta": expected a number, found string "x"`.
constexpr JsonFieldWords kConfigWords{"config.json field \"{}\"", "found", true, 57,
                                      "{field}: integer {value} is out of range"};

std::string Describe(const json& value) { return DescribeJsonValue(value, kConfigWords); }

const json* Find(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

int64_t IntegerValue(const json& value, const std::string& field) {
  return JsonInt(value, field, kConfigWords);
}

int64_t RequiredInt(const json& object, const char* field) {
  const json* value = OptionalJsonField(object, field);
  KVDIFF_CHECK(value != nullptr, "config.json: missing required field \"{}\" (expected an integer)",
               field);
  return IntegerValue(*value, field);
}

double NumberValue(const json& value, const std::string& field) {
  return JsonNumber(value, field, kConfigWords);
}

double OptionalNumber(const json& object, const char* field, double fallback) {
  const json* value = OptionalJsonField(object, field);
  return value ? NumberValue(*value, field) : fallback;
}

// bos/eos: an integer, null (-1: none), or for eos a list (some HF configs list several stop ids;
// the first one is the primary).
int64_t TokenId(const json& object, const char* field, int64_t fallback) {
  const json* value = Find(object, field);
  if (value == nullptr) return fallback;
  if (value->is_null()) return -1;
  if (value->is_array()) {
    KVDIFF_CHECK(!value->empty() && (*value)[0].is_number_integer(),
                 "config.json field \"{}\": expected an integer or a non-empty list of integers, "
                 "found {}",
                 field, Describe(*value));
    return IntegerValue((*value)[0], std::string(field) + "[0]");
  }
  return IntegerValue(*value, field);
}

RopeScaling ParseRopeScaling(const json& value) {
  KVDIFF_CHECK(value.is_object(),
               "config.json field \"rope_scaling\": expected null or an object, "
               "found {}",
               Describe(value));
  RopeScaling scaling;
  const json* type = Find(value, "rope_type");
  if (type == nullptr) type = Find(value, "type");  // older transformers spelling
  KVDIFF_CHECK(type != nullptr && type->is_string(),
               "config.json field \"rope_scaling.rope_type\": expected a string (\"llama3\"), "
               "found {}",
               type ? Describe(*type) : std::string("nothing"));
  scaling.type = type->get<std::string>();
  // Refused, never ignored: running "linear" or "yarn" as unscaled RoPE would give wrong logits
  // that still look plausible.
  KVDIFF_CHECK(scaling.type == "llama3",
               "config.json field \"rope_scaling\": unsupported rope scaling type \"{}\" "
               "(kvdiff implements only \"llama3\", or null for none)",
               scaling.type);
  auto required_number = [&](const char* key) {
    const json* v = Find(value, key);
    KVDIFF_CHECK(v != nullptr && !v->is_null(),
                 "config.json field \"rope_scaling.{}\": missing (expected a number for llama3 "
                 "scaling)",
                 key);
    return NumberValue(*v, std::string("rope_scaling.") + key);
  };
  scaling.factor = required_number("factor");
  scaling.low_freq_factor = required_number("low_freq_factor");
  scaling.high_freq_factor = required_number("high_freq_factor");
  const json* orig = Find(value, "original_max_position_embeddings");
  KVDIFF_CHECK(orig != nullptr && !orig->is_null(),
               "config.json field \"rope_scaling.original_max_position_embeddings\": missing "
               "(expected an integer for llama3 scaling)");
  scaling.original_max_position_embeddings =
      IntegerValue(*orig, "rope_scaling.original_max_position_embeddings");
  return scaling;
}

// Features of other architectures that share Llama's config keys. Each changes the arithmetic, so
// a config that turns one on is refused rather than run as a plain Llama.
void RefuseUnsupportedFeatures(const json& root) {
  if (const json* v = Find(root, "model_type"); v && v->is_string()) {
    // Mistral is Llama with a sliding window: the same tensors, the same forward otherwise.
    KVDIFF_CHECK(v->get<std::string>() == "llama" || v->get<std::string>() == "mistral",
                 "config.json field \"model_type\": expected \"llama\" or \"mistral\", found "
                 "\"{}\"",
                 v->get<std::string>());
  }
  if (const json* v = Find(root, "hidden_act"); v && !v->is_null()) {
    KVDIFF_CHECK(v->is_string() && v->get<std::string>() == "silu",
                 "config.json field \"hidden_act\": kvdiff implements only \"silu\", found {}",
                 Describe(*v));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (const json* v = Find(root, key); v && !v->is_null()) {
      KVDIFF_CHECK(v->is_boolean(), "config.json field \"{}\": expected a boolean, found {}", key,
                   Describe(*v));
      KVDIFF_CHECK(!v->get<bool>(),
                   "config.json field \"{}\": true is not supported (kvdiff's Llama has no biases)",
                   key);
    }
  }
}

// sliding_window: an integer W >= 1, or null/absent (0: none). Qwen2 configs carry a window with
// "use_sliding_window": false, which transformers reads as no window at all.
int64_t SlidingWindow(const json& root) {
  if (const json* use = Find(root, "use_sliding_window"); use != nullptr && !use->is_null()) {
    KVDIFF_CHECK(use->is_boolean(),
                 "config.json field \"use_sliding_window\": expected a boolean, found {}",
                 Describe(*use));
    if (!use->get<bool>()) return 0;
  }
  const json* w = Find(root, "sliding_window");
  if (w == nullptr || w->is_null()) return 0;
  const int64_t window = IntegerValue(*w, "sliding_window");
  KVDIFF_CHECK(window >= 1,
               "config.json field \"sliding_window\": expected a positive integer (or null for "
               "none), found {}",
               window);
  return window;
}

void CheckPositive(int64_t value, const char* field) {
  KVDIFF_CHECK(value > 0, "config.json field \"{}\": expected a positive integer, found {}", field,
               value);
  KVDIFF_CHECK(value < kMaxDimension, "config.json field \"{}\": {} is too large (limit {})", field,
               value, kMaxDimension - 1);
}

}  // namespace

void LlamaConfig::Validate() const {
  CheckPositive(hidden_size, "hidden_size");
  CheckPositive(intermediate_size, "intermediate_size");
  CheckPositive(num_hidden_layers, "num_hidden_layers");
  CheckPositive(num_attention_heads, "num_attention_heads");
  CheckPositive(num_key_value_heads, "num_key_value_heads");
  CheckPositive(head_dim, "head_dim");
  CheckPositive(vocab_size, "vocab_size");
  CheckPositive(max_position_embeddings, "max_position_embeddings");
  KVDIFF_CHECK(num_hidden_layers <= kMaxLayers,
               "config.json field \"num_hidden_layers\": {} is more than kvdiff accepts ({})",
               num_hidden_layers, kMaxLayers);
  KVDIFF_CHECK(max_position_embeddings <= kMaxPositions,
               "config.json field \"max_position_embeddings\": {} is more than kvdiff accepts ({})",
               max_position_embeddings, kMaxPositions);
  // -1 stands for null; any other id must be a token of the vocabulary.
  for (const auto& [id, field] :
       {std::pair{bos_token_id, "bos_token_id"}, std::pair{eos_token_id, "eos_token_id"}}) {
    KVDIFF_CHECK(id == -1 || (id >= 0 && id < vocab_size),
                 "config.json field \"{}\": {} is not a token id of vocab_size {} (0..{}, or null)",
                 field, id, vocab_size, vocab_size - 1);
  }
  KVDIFF_CHECK(num_attention_heads % num_key_value_heads == 0,
               "config.json field \"num_key_value_heads\": {} does not divide num_attention_heads "
               "{} (grouped-query attention needs a whole number of query heads per KV head)",
               num_key_value_heads, num_attention_heads);
  KVDIFF_CHECK(head_dim % 2 == 0,
               "config.json field \"head_dim\": expected an even number (RoPE rotates pairs of "
               "dimensions), found {}",
               head_dim);
  KVDIFF_CHECK(QDim() < kMaxDimension,
               "config.json fields \"num_attention_heads\" x \"head_dim\": {} x {} is too large",
               num_attention_heads, head_dim);
  KVDIFF_CHECK(std::isfinite(rope_theta) && rope_theta > 0,
               "config.json field \"rope_theta\": expected a positive finite number, found {}",
               rope_theta);
  KVDIFF_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps > 0,
               "config.json field \"rms_norm_eps\": expected a positive finite number, found {}",
               rms_norm_eps);
  KVDIFF_CHECK(torch_dtype == "float32" || torch_dtype == "bfloat16" || torch_dtype == "float16" ||
                   torch_dtype == "float64",
               "config.json field \"torch_dtype\": expected \"float32\", \"bfloat16\", \"float16\" "
               "or \"float64\", found \"{}\"",
               torch_dtype);
  KVDIFF_CHECK(sliding_window >= 0,
               "config.json field \"sliding_window\": expected a positive integer (or null for "
               "none), found {}",
               sliding_window);
  KVDIFF_CHECK(sliding_window <= max_position_embeddings,
               "config.json field \"sliding_window\": {} is larger than max_position_embeddings "
               "{} (a window larger than the context)",
               sliding_window, max_position_embeddings);
  if (rope_scaling) {
    const RopeScaling& s = *rope_scaling;
    KVDIFF_CHECK(s.type == "llama3",
                 "config.json field \"rope_scaling\": unsupported rope scaling type \"{}\" "
                 "(kvdiff implements only \"llama3\", or null for none)",
                 s.type);
    KVDIFF_CHECK(std::isfinite(s.factor) && s.factor >= 1,
                 "config.json field \"rope_scaling.factor\": expected a number >= 1, found {}",
                 s.factor);
    KVDIFF_CHECK(std::isfinite(s.low_freq_factor) && s.low_freq_factor > 0,
                 "config.json field \"rope_scaling.low_freq_factor\": expected a positive number, "
                 "found {}",
                 s.low_freq_factor);
    // The smoothing interpolates between the two wavelengths; equal factors would divide by zero.
    KVDIFF_CHECK(std::isfinite(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor,
                 "config.json field \"rope_scaling.high_freq_factor\": expected a number greater "
                 "than low_freq_factor {}, found {}",
                 s.low_freq_factor, s.high_freq_factor);
    KVDIFF_CHECK(s.original_max_position_embeddings > 0,
                 "config.json field \"rope_scaling.original_max_position_embeddings\": expected a "
                 "positive integer, found {}",
                 s.original_max_position_embeddings);
  }
}

LlamaConfig ParseConfig(const std::string& json_text) {
  const json root = ParseJsonDocument(json_text, "config.json");
  KVDIFF_CHECK(root.is_object(), "config.json: expected a JSON object at the top level, found {}",
               Describe(root));
  RefuseUnsupportedFeatures(root);

  LlamaConfig c;
  c.hidden_size = RequiredInt(root, "hidden_size");
  c.intermediate_size = RequiredInt(root, "intermediate_size");
  c.num_hidden_layers = RequiredInt(root, "num_hidden_layers");
  c.num_attention_heads = RequiredInt(root, "num_attention_heads");
  c.vocab_size = RequiredInt(root, "vocab_size");
  c.max_position_embeddings = RequiredInt(root, "max_position_embeddings");

  const json* kv = Find(root, "num_key_value_heads");
  c.num_key_value_heads = (kv == nullptr || kv->is_null())
                              ? c.num_attention_heads  // transformers: plain multi-head attention
                              : IntegerValue(*kv, "num_key_value_heads");

  const json* head_dim = Find(root, "head_dim");
  if (head_dim == nullptr || head_dim->is_null()) {
    CheckPositive(c.num_attention_heads, "num_attention_heads");
    KVDIFF_CHECK(c.hidden_size % c.num_attention_heads == 0,
                 "config.json field \"num_attention_heads\": {} does not divide hidden_size {} "
                 "(head_dim is not given, so it would be hidden_size / num_attention_heads)",
                 c.num_attention_heads, c.hidden_size);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  } else {
    c.head_dim = IntegerValue(*head_dim, "head_dim");
  }

  c.rope_theta = OptionalNumber(root, "rope_theta", 10000.0);
  c.rms_norm_eps = OptionalNumber(root, "rms_norm_eps", 1e-6);  // LlamaConfig's default

  if (const json* rs = Find(root, "rope_scaling"); rs != nullptr && !rs->is_null()) {
    const json* type = rs->is_object() ? Find(*rs, "rope_type") : nullptr;
    if (rs->is_object() && type == nullptr) type = Find(*rs, "type");
    if (type != nullptr && type->is_string() && type->get<std::string>() == "default") {
      // transformers' name for the unscaled rotary embedding.
    } else {
      c.rope_scaling = ParseRopeScaling(*rs);
    }
  }

  if (const json* tie = Find(root, "tie_word_embeddings"); tie != nullptr && !tie->is_null()) {
    KVDIFF_CHECK(tie->is_boolean(),
                 "config.json field \"tie_word_embeddings\": expected a boolean, found {}",
                 Describe(*tie));
    c.tie_word_embeddings = tie->get<bool>();
  } else {
    c.tie_word_embeddings = false;  // LlamaConfig's default
  }
  c.bos_token_id = TokenId(root, "bos_token_id", 1);
  c.eos_token_id = TokenId(root, "eos_token_id", 2);
  c.sliding_window = SlidingWindow(root);

  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  const json* dtype = Find(root, "torch_dtype");
  const char* dtype_field = "torch_dtype";
  if (dtype == nullptr || dtype->is_null()) {
    dtype = Find(root, "dtype");
    dtype_field = "dtype";
  }
  if (dtype != nullptr && !dtype->is_null()) {
    KVDIFF_CHECK(dtype->is_string(), "config.json field \"{}\": expected a string, found {}",
                 dtype_field, Describe(*dtype));
    c.torch_dtype = dtype->get<std::string>();
  } else {
    c.torch_dtype = "float32";
  }

  c.Validate();
  return c;
}

namespace {

// ParseConfig's error, its "config.json" replaced by `source`: "config.json field \"x\": ..."
// becomes "DIR/config.json field \"x\": ...", not "DIR/config.json: config.json field ...".
[[noreturn]] void RethrowNamingSource(const InputError& e, const std::string& source) {
  const std::string message = e.what();
  const std::string prefix = "config.json";
  if (message.rfind(prefix, 0) == 0) throw InputError(source + message.substr(prefix.size()));
  throw InputError(fmt::format("{}: {}", source, message));
}

// The keys ParseConfig reads (RefuseUnsupportedFeatures included) and ConfigToJson writes.
const char* const kConfigFields[] = {"architectures",
                                     "model_type",
                                     "hidden_act",
                                     "attention_bias",
                                     "mlp_bias",
                                     "hidden_size",
                                     "intermediate_size",
                                     "num_hidden_layers",
                                     "num_attention_heads",
                                     "num_key_value_heads",
                                     "head_dim",
                                     "vocab_size",
                                     "max_position_embeddings",
                                     "rope_theta",
                                     "rope_scaling",
                                     "rms_norm_eps",
                                     "tie_word_embeddings",
                                     "bos_token_id",
                                     "eos_token_id",
                                     "torch_dtype",
                                     "dtype",
                                     "sliding_window",
                                     "use_sliding_window"};
const char* const kRopeScalingFields[] = {"rope_type",        "type",
                                          "factor",           "low_freq_factor",
                                          "high_freq_factor", "original_max_position_embeddings"};

template <size_t N>
void RefuseUnknownKeys(const json& object, const char* const (&known)[N],
                       const std::string& where) {
  RefuseUnknownJsonFields(object, where, {std::begin(known), std::end(known)});
}

}  // namespace

LlamaConfig LoadConfig(const std::filesystem::path& config_json) {
  const std::string text = ReadInputFile(config_json, "config file");
  try {
    return ParseConfig(text);
  } catch (const InputError& e) {
    RethrowNamingSource(e, config_json.string());
  }
}

LlamaConfig ParseConfigStrict(const std::string& json_text, const std::string& source) {
  try {
    const json root = ParseJsonDocument(json_text, "config.json");
    if (root.is_object()) {
      RefuseUnknownKeys(root, kConfigFields, "config.json");
      if (const json* rs = Find(root, "rope_scaling"); rs && rs->is_object()) {
        RefuseUnknownKeys(*rs, kRopeScalingFields, "config.json field \"rope_scaling\"");
      }
    }
    return ParseConfig(json_text);
  } catch (const InputError& e) {
    RethrowNamingSource(e, source);
  }
}

std::string ConfigToJson(const LlamaConfig& config) {
  // nlohmann's default object is a std::map, so keys come out sorted: a stable order,
  // byte-identical files. The extra HF keys (architectures, model_type, hidden_act, biases) make
  // the directory loadable by transformers as it is.
  json j;
  // A windowed model is written as Mistral (Llama with a sliding window), so that transformers
  // applies the window: its LlamaConfig ignores sliding_window. Only then is the key written, so
  // a full-attention model's file stays byte-identical.
  j["architectures"] = json::array({config.Windowed() ? "MistralForCausalLM" : "LlamaForCausalLM"});
  j["model_type"] = config.Windowed() ? "mistral" : "llama";
  if (config.Windowed()) j["sliding_window"] = config.sliding_window;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["hidden_size"] = config.hidden_size;
  j["intermediate_size"] = config.intermediate_size;
  j["num_hidden_layers"] = config.num_hidden_layers;
  j["num_attention_heads"] = config.num_attention_heads;
  j["num_key_value_heads"] = config.num_key_value_heads;
  j["head_dim"] = config.head_dim;
  j["vocab_size"] = config.vocab_size;
  j["max_position_embeddings"] = config.max_position_embeddings;
  j["rope_theta"] = config.rope_theta;
  if (config.rope_scaling) {
    const RopeScaling& s = *config.rope_scaling;
    j["rope_scaling"] = {{"rope_type", s.type},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = config.rms_norm_eps;
  j["tie_word_embeddings"] = config.tie_word_embeddings;
  j["bos_token_id"] = config.bos_token_id < 0 ? json(nullptr) : json(config.bos_token_id);
  j["eos_token_id"] = config.eos_token_id < 0 ? json(nullptr) : json(config.eos_token_id);
  j["torch_dtype"] = config.torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace kvdiff::format
