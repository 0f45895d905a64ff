// The one reader of JSON from outside kvdiff (scenarios, config.json, safetensors headers, golden
// files, tokenizer files, chat messages): nlohmann's parser, dump and destructor all recurse on the
// nesting depth, so a document is pre-scanned, linearly and without recursion, before any of them
// sees it.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kvdiff::format {

// The deepest nesting of arrays and objects accepted. kvdiff's own files nest at most 6 levels
// (a tokenizer.json's normalizer sequences ~5); 64 leaves room and is far below what the parser,
// dump and destructor can recurse through.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` into a JSON value. InputError, prefixed with `what` (e.g. "scenario" or a file
// name), for: nesting deeper than kMaxJsonDepth ("nesting deeper than 64 levels at byte 64"),
// invalid JSON (nlohmann's message, with the byte position), a number out of range ("1e400"), a
// duplicate key in one object ("duplicate key \"steps\"": the last would silently win).
nlohmann::json ParseJsonDocument(std::string_view text, const std::string& what);

// The first `max_chars` characters of `value` as JSON (with "..." when cut), for error messages:
// built element by element, so a huge value is never serialized whole.
std::string JsonSnippet(const nlohmann::json& value, size_t max_chars = 60);

}  // namespace kvdiff::format
