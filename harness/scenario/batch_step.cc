#include "harness/scenario/batch_step.h"

#include <fmt/format.h>

#include <map>

#include "format/error.h"
#include "format/json_document.h"
#include "format/json_field.h"

namespace kvdiff::harness {
namespace {

using format::JsonSnippet;
using nlohmann::json;

constexpr format::JsonFieldWords kScenarioWords{"{}", "got", true};

BatchLogits ParseBatchLogits(const json& value, const std::string& where) {
  static const std::map<std::string, BatchLogits> kNames = {
      {"all", BatchLogits::kAll}, {"last", BatchLogits::kLast}, {"none", BatchLogits::kNone}};
  auto it = value.is_string() ? kNames.find(value.get<std::string>()) : kNames.end();
  KVDIFF_CHECK(it != kNames.end(), "{}: expected \"all\", \"last\" or \"none\", got {}", where,
               JsonSnippet(value));
  return it->second;
}

BatchEntry ParseItem(const json& item, const std::string& where) {
  KVDIFF_CHECK(item.is_object(),
               "{}: expected an object like {{\"conversation\": \"a\", \"tokens\": [1, 2]}} or "
               "{{\"conversation\": \"b\", \"decode\": true}}, got {}",
               where, JsonSnippet(item));
  format::RefuseUnknownJsonFields(item, where, {"conversation", "tokens", "decode", "logits"});
  BatchEntry entry;
  entry.conversation = format::RequiredJsonString(item, "conversation", where, kScenarioWords);
  KVDIFF_CHECK(!entry.conversation.empty(),
               "{}.conversation: a conversation name must not be empty", where);
  const bool decode = item.contains("decode");
  KVDIFF_CHECK(decode != item.contains("tokens"),
               "{}: an item needs exactly one of \"tokens\" (a prompt chunk) or \"decode\": true "
               "(one greedy token)",
               where);
  if (decode) {
    entry.decode = format::JsonBool(item.at("decode"), where + ".decode", kScenarioWords);
    KVDIFF_CHECK(entry.decode,
                 "{}.decode: must be true (an item without tokens feeds one greedy token)", where);
  } else {
    const json& t = item.at("tokens");
    KVDIFF_CHECK(t.is_array() && !t.empty(),
                 "{}.tokens: expected a non-empty array of token ids, got {}", where,
                 JsonSnippet(t));
    for (size_t i = 0; i < t.size(); ++i) {
      KVDIFF_CHECK(
          t[i].is_number_integer() && t[i].get<int64_t>() >= 0 && t[i].get<int64_t>() <= INT32_MAX,
          "{}.tokens[{}]: expected a non-negative integer token id, got {}", where, i,
          JsonSnippet(t[i]));
      entry.tokens.push_back(static_cast<Token>(t[i].get<int64_t>()));
    }
  }
  if (item.contains("logits"))
    entry.logits = ParseBatchLogits(item.at("logits"), where + ".logits");
  return entry;
}

}  // namespace

Step ParseBatchStep(const json& s, const std::string& where) {
  format::RefuseUnknownJsonFields(s, where, {"op", "items"});
  KVDIFF_CHECK(s.contains("items"), "{}: \"batch\" needs the field \"items\"", where);
  const json& items = s.at("items");
  KVDIFF_CHECK(items.is_array() && !items.empty(),
               "{}.items: expected a non-empty array of items (one per conversation in the call), "
               "got {}",
               where, JsonSnippet(items));
  std::vector<BatchEntry> entries;
  for (size_t i = 0; i < items.size(); ++i)
    entries.push_back(ParseItem(items[i], fmt::format("{}.items[{}]", where, i)));
  return Step::Batch(std::move(entries));
}

json BatchItemsToJson(const Step& step) {
  json items = json::array();
  for (const BatchEntry& e : step.items) {
    json item = {{"conversation", e.conversation}};
    if (e.decode)
      item["decode"] = true;
    else
      item["tokens"] = e.tokens;
    if (e.logits != BatchLogits::kAll) item["logits"] = BatchLogitsName(e.logits);
    items.push_back(item);
  }
  return items;
}

}  // namespace kvdiff::harness
