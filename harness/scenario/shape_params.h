// A model's shape as text, for ModelSpec::Describe and the campaign's --shapes random
// (harness/campaign/shape_generator.h draws the shapes; this only spells one out, so a scenario can
// describe its inline config without depending on the campaign).
#pragma once

#include <string>

#include "format/config.h"

namespace kvdiff::harness {

// How the query heads share the KV heads: "MHA" (as many KV heads as query heads, one head
// included), "MQA" (one KV head for several), else "GQA n_rep=R".
std::string AttentionKind(const format::LlamaConfig& config);
// Every field a shape draws, as one parameter string:
// "layers=2, heads=8/2kv, head_dim=16, hidden=128, ffn=300, vocab=377, ctx=512, theta=500000,
//  eps=1e-05, tied, llama3(factor=8, low=1, high=4, orig=32)".
std::string ShapeParams(const format::LlamaConfig& config);

}  // namespace kvdiff::harness
