// The llama.cpp engine's options: parsed in full before llama.cpp is called (engine.h: never ignore
// an option).
#include "engines/llama_cpp/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "format/error.h"

namespace kvdiff::llama_cpp {
namespace {

int64_t ParseInt(const std::string& key, const std::string& value, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < lo || v > hi) {
    throw kvdiff::InputError(
        fmt::format("option {}={}: expected an integer in [{}, {}]", key, value, lo, hi));
  }
  return v;
}

BatchFault ParseFault(const std::string& value) {
  if (value == "none") return BatchFault::kNone;
  if (value == "batch-shared-positions") return BatchFault::kSharedPositions;
  if (value == "batch-rows-swapped") return BatchFault::kRowsSwapped;
  if (value == "batch-one-seq") return BatchFault::kOneSeq;
  throw kvdiff::InputError(
      fmt::format("option fault={}: expected none, batch-shared-positions, batch-rows-swapped or "
                  "batch-one-seq (test-only faults of append_batch)",
                  value));
}

}  // namespace

bool IsQuantized(const std::string& kv) { return kv == "q8_0" || kv == "q4_0"; }

Options ParseOptions(const char* text) {
  Options o;
  std::string all = text ? text : "";
  for (char& c : all) {
    if (c == '\n') c = ',';
  }
  size_t start = 0;
  while (start <= all.size()) {
    const size_t comma = std::min(all.find(',', start), all.size());
    const std::string item = all.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw kvdiff::InputError(fmt::format("option '{}': expected key=value", item));
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "kv") {
      if (value != "f32" && value != "f16" && value != "q8_0" && value != "q4_0") {
        throw kvdiff::InputError(
            fmt::format("option kv={}: expected f32, f16, q8_0 or q4_0", value));
      }
      o.kv = value;
    } else if (key == "flash_attn") {
      if (value != "on" && value != "off") {
        throw kvdiff::InputError(fmt::format("option flash_attn={}: expected on or off", value));
      }
      o.flash_attn = value == "on";
    } else if (key == "threads") {
      o.threads = static_cast<int>(ParseInt(key, value, 1, 512));
    } else if (key == "weights") {
      if (value == "f32") {
        o.weights = kvdiff::format::DType::kF32;
      } else if (value == "bf16") {
        o.weights = kvdiff::format::DType::kBF16;
      } else if (value == "f16") {
        o.weights = kvdiff::format::DType::kF16;
      } else {
        throw kvdiff::InputError(
            fmt::format("option weights={}: expected f32, bf16 or f16", value));
      }
    } else if (key == "max_length") {
      o.max_length = ParseInt(key, value, 1, 1 << 20);
    } else if (key == "sessions") {
      o.sessions = ParseInt(key, value, 1, 64);
    } else if (key == "ubatch") {
      o.ubatch = ParseInt(key, value, 1, 1 << 20);
    } else if (key == "batch") {
      o.batch = ParseInt(key, value, 1, 1 << 26);
    } else if (key == "fault") {
      o.fault = ParseFault(value);
    } else {
      throw kvdiff::InputError(
          fmt::format("unknown option '{}' (llama.cpp knows: kv, flash_attn, threads, weights, "
                      "max_length, sessions, ubatch, batch, fault)",
                      key));
    }
  }
  if (IsQuantized(o.kv) && !o.flash_attn) {
    throw kvdiff::InputError(fmt::format(
        "option kv={} needs flash_attn=on (llama.cpp quantizes the V cache only inside flash "
        "attention)",
        o.kv));
  }
  return o;
}

}  // namespace kvdiff::llama_cpp
