// A batch step in a scenario file, read and written (scenario.cc calls these for "op": "batch").
//   {"op": "batch", "items": [{"conversation": "a", "tokens": [5, 6, 7], "logits": "last"},
//                             {"conversation": "b", "decode": true}]}
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "harness/scenario/scenario.h"

namespace kvdiff::harness {

// `where` is "steps[i]"; every refusal names the item and the field.
Step ParseBatchStep(const nlohmann::json& step, const std::string& where);
nlohmann::json BatchItemsToJson(const Step& step);

}  // namespace kvdiff::harness
