// Reading one field of a JSON document with a message that names the field and says what was
// expected: scenarios, golden files, config.json and tokenizer.json all read their fields here.
// Their messages are pinned word for word (tests, docs/bad-input.md) and were worded apart, so a
// file passes its JsonFieldWords and the checks are written once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvdiff::format {

// How a file's messages name a field and what was found there; the defaults read
// `steps[2].n: expected an integer, got "x"`.
struct JsonFieldWords {
  // The field at `path` ("rope_scaling.factor") as messages name it: fmt pattern with one "{}".
  const char* field = "{}";
  const char* found = "got";  // "... expected an integer, got ..."
  bool with_type = false;     // "got string \"x\"" rather than "got \"x\""
  size_t snippet_chars = 60;  // JsonSnippet's cut
  // An integer beyond int64: named args {field}, {value} and {max}.
  const char* too_large = "{field}: {value} is too large (at most {max})";
};

// "where.key", or key alone when where is empty.
std::string JsonPath(const std::string& where, const std::string& key);
// What a message says was found: the value's snippet, after its type name with with_type.
std::string DescribeJsonValue(const nlohmann::json& value, const JsonFieldWords& words = {});

// object[key]; InputError "{where}: missing field \"{key}\"" when object is no object or lacks it.
const nlohmann::json& RequiredJsonField(const nlohmann::json& object, const std::string& key,
                                        const std::string& where);
// object[key], or nullptr when object is no object, lacks it, or holds null there (HF configs and
// tokenizer.json files write null for "unset").
const nlohmann::json* OptionalJsonField(const nlohmann::json& object, const std::string& key);

// The value at `path` as each type; InputError "{field}: expected a string, {found} {value}" (an
// integer, a number, true or false) otherwise, and for an integer beyond int64 (too_large).
std::string JsonString(const nlohmann::json& value, const std::string& path,
                       const JsonFieldWords& words = {});
int64_t JsonInt(const nlohmann::json& value, const std::string& path,
                const JsonFieldWords& words = {});
double JsonNumber(const nlohmann::json& value, const std::string& path,
                  const JsonFieldWords& words = {});
bool JsonBool(const nlohmann::json& value, const std::string& path,
              const JsonFieldWords& words = {});

// RequiredJsonField(object, key, where) read as a string or an integer at path where.key.
std::string RequiredJsonString(const nlohmann::json& object, const std::string& key,
                               const std::string& where, const JsonFieldWords& words = {});
int64_t RequiredJsonInt(const nlohmann::json& object, const std::string& key,
                        const std::string& where, const JsonFieldWords& words = {});

// InputError "{where}: unknown field \"{key}\" (expected one of: a, b, c)", `allowed` listed in
// the order given, for the first key of object not in it: a misspelt field is never ignored.
void RefuseUnknownJsonFields(const nlohmann::json& object, const std::string& where,
                             const std::vector<std::string>& allowed);

}  // namespace kvdiff::format
