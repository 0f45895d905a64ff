// The hyperparameters of a Llama GGUF, checked by kvdiff before llama.cpp reads the file: llama.cpp
// aborts the whole process (GGML_ASSERT) on 0 or 2^31 layers or a NaN epsilon instead of refusing.
#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <type_traits>

#include "format/config.h"
#include "format/error.h"
#include "format/gguf.h"

namespace kvdiff::format {
namespace {

// A whole-number value of any integer type, or nullopt when the key is absent.
std::optional<int64_t> Integer(const GgufHeader& h, const std::filesystem::path& path,
                               const std::string& key) {
  const GgufKv* kv = h.Find(key);
  if (!kv) return std::nullopt;
  return std::visit(
      [&](const auto& v) -> int64_t {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          KVDIFF_CHECK(v <= static_cast<T>(INT64_MAX), "{}: {} is {}, more than kvdiff accepts",
                       path.string(), key, v);
          return static_cast<int64_t>(v);
        } else {
          throw InputError(fmt::format("{}: {}: expected an integer", path.string(), key));
        }
      },
      kv->value);
}

// An integer key that must be present and within [lo, hi].
int64_t Bounded(const GgufHeader& h, const std::filesystem::path& path, const std::string& key,
                int64_t lo, int64_t hi) {
  const std::optional<int64_t> v = Integer(h, path, key);
  KVDIFF_CHECK(v.has_value(), "{}: missing {} (expected an integer from {} to {})", path.string(),
               key, lo, hi);
  KVDIFF_CHECK(*v >= lo && *v <= hi, "{}: {} is {}, expected {} to {}", path.string(), key, *v, lo,
               hi);
  return *v;
}

// A float key that must be present, finite and positive.
void PositiveFinite(const GgufHeader& h, const std::filesystem::path& path,
                    const std::string& key) {
  const GgufKv* kv = h.Find(key);
  KVDIFF_CHECK(kv && std::holds_alternative<float>(kv->value),
               "{}: missing {} (expected a float32)", path.string(), key);
  const float v = std::get<float>(kv->value);
  KVDIFF_CHECK(std::isfinite(v) && v > 0, "{}: {} is {}, expected a positive finite number",
               path.string(), key, v);
}

}  // namespace

void CheckLlamaGgufHyperparameters(const GgufHeader& h, const std::filesystem::path& path) {
  const GgufKv* arch = h.Find("general.architecture");
  KVDIFF_CHECK(arch && std::holds_alternative<std::string>(arch->value) &&
                   std::get<std::string>(arch->value) == "llama",
               "{}: general.architecture: expected \"llama\"", path.string());
  constexpr int64_t kMaxWidth = int64_t{1} << 20;
  Bounded(h, path, "llama.block_count", 1, kMaxLayers);
  Bounded(h, path, "llama.context_length", 1, kMaxPositions);
  const int64_t hidden = Bounded(h, path, "llama.embedding_length", 1, kMaxWidth);
  Bounded(h, path, "llama.feed_forward_length", 1, kMaxWidth);
  const int64_t heads = Bounded(h, path, "llama.attention.head_count", 1, hidden);
  const int64_t kv_heads = Bounded(h, path, "llama.attention.head_count_kv", 1, heads);
  KVDIFF_CHECK(heads % kv_heads == 0,
               "{}: llama.attention.head_count_kv {} does not divide llama.attention.head_count {}",
               path.string(), kv_heads, heads);
  for (const char* key : {"llama.rope.dimension_count", "llama.attention.key_length",
                          "llama.attention.value_length"}) {
    if (h.Find(key)) Bounded(h, path, key, 1, kMaxWidth);
  }
  if (h.Find("llama.vocab_size")) Bounded(h, path, "llama.vocab_size", 1, INT32_MAX);
  PositiveFinite(h, path, "llama.attention.layer_norm_rms_epsilon");
  if (h.Find("llama.rope.freq_base")) PositiveFinite(h, path, "llama.rope.freq_base");
}

}  // namespace kvdiff::format
