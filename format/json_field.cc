#include "format/json_field.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "format/error.h"
#include "format/json_document.h"

namespace kvdiff::format {
namespace {

using nlohmann::json;

std::string FieldName(const std::string& path, const JsonFieldWords& words) {
  return fmt::format(fmt::runtime(words.field), path);
}

// Throws "{field}: expected {what}, {found} {value}" unless ok.
void Expect(bool ok, const json& value, const std::string& path, const char* what,
            const JsonFieldWords& words) {
  if (ok) return;
  throw InputError(fmt::format("{}: expected {}, {} {}", FieldName(path, words), what, words.found,
                               DescribeJsonValue(value, words)));
}

}  // namespace

std::string JsonPath(const std::string& where, const std::string& key) {
  return where.empty() ? key : where + "." + key;
}

std::string DescribeJsonValue(const json& value, const JsonFieldWords& words) {
  const std::string snippet = JsonSnippet(value, words.snippet_chars);
  return words.with_type ? fmt::format("{} {}", value.type_name(), snippet) : snippet;
}

const json& RequiredJsonField(const json& object, const std::string& key,
                              const std::string& where) {
  KVDIFF_CHECK(object.is_object() && object.contains(key), "{}: missing field \"{}\"", where, key);
  return object.at(key);
}

const json* OptionalJsonField(const json& object, const std::string& key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::string JsonString(const json& value, const std::string& path, const JsonFieldWords& words) {
  Expect(value.is_string(), value, path, "a string", words);
  return value.get<std::string>();
}

int64_t JsonInt(const json& value, const std::string& path, const JsonFieldWords& words) {
  // 576.0 is not an integer: the writers write integers, and a float is a sign of a wrong file.
  Expect(value.is_number_integer(), value, path, "an integer", words);
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  if (value.is_number_unsigned() && value.get<uint64_t>() > kMax) {
    throw InputError(fmt::format(
        fmt::runtime(words.too_large), fmt::arg("field", FieldName(path, words)),
        fmt::arg("value", JsonSnippet(value, words.snippet_chars)), fmt::arg("max", kMax)));
  }
  return value.get<int64_t>();
}

double JsonNumber(const json& value, const std::string& path, const JsonFieldWords& words) {
  Expect(value.is_number(), value, path, "a number", words);
  return value.get<double>();
}

bool JsonBool(const json& value, const std::string& path, const JsonFieldWords& words) {
  Expect(value.is_boolean(), value, path, "true or false", words);
  return value.get<bool>();
}

std::string RequiredJsonString(const json& object, const std::string& key, const std::string& where,
                               const JsonFieldWords& words) {
  return JsonString(RequiredJsonField(object, key, where), JsonPath(where, key), words);
}

int64_t RequiredJsonInt(const json& object, const std::string& key, const std::string& where,
                        const JsonFieldWords& words) {
  return JsonInt(RequiredJsonField(object, key, where), JsonPath(where, key), words);
}

void RefuseUnknownJsonFields(const json& object, const std::string& where,
                             const std::vector<std::string>& allowed) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    throw InputError(fmt::format("{}: unknown field \"{}\" (expected one of: {})", where, key,
                                 fmt::join(allowed, ", ")));
  }
}

}  // namespace kvdiff::format
