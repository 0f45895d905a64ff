// Checkpoints on disk (model_files.h): a directory opened and every tensor checked against its
// config.json, loaded, inspected from the headers alone, or saved. The presets and the random
// weights are in random_model.cc.
#include "format/model_files.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "format/affixes.h"
#include "format/error.h"
#include "format/input_file.h"
#include "format/json_document.h"

namespace kvdiff::format {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kShardIndex = "model.safetensors.index.json";

// Tensors a real checkpoint may carry that the forward pass does not use. transformers drops them
// too: it re-ties lm_head to the embedding after loading, and recomputes inv_freq from config.json.
bool IsIgnorable(const std::string& name, const LlamaConfig& config) {
  if (name == "lm_head.weight" && config.tie_word_embeddings) return true;
  return EndsWith(name, ".rotary_emb.inv_freq");
}

// The safetensors files of a checkpoint directory, opened, and which file holds which tensor.
struct Checkpoint {
  LlamaConfig config;
  std::vector<std::filesystem::path> paths;
  std::vector<SafetensorsFile> files;
  std::map<std::string, size_t> file_of;  // tensor name -> index into files
  std::vector<std::string> ignored;
};

Checkpoint OpenCheckpoint(const std::filesystem::path& dir) {
  KVDIFF_CHECK(std::filesystem::exists(dir), "model directory {} does not exist", dir.string());
  KVDIFF_CHECK(std::filesystem::is_directory(dir),
               "model path {} is not a directory (expected a directory with config.json and "
               "model.safetensors)",
               dir.string());
  Checkpoint ck;
  ck.config = LoadConfig(dir / "config.json");

  if (std::filesystem::exists(dir / kSingleFile)) {
    ck.paths.push_back(dir / kSingleFile);
  } else if (std::filesystem::exists(dir / kShardIndex)) {
    // Sharded: {"weight_map": {"tensor name": "model-00001-of-00002.safetensors", ...}}.
    const std::filesystem::path index_path = dir / kShardIndex;
    const nlohmann::json index =
        ParseJsonDocument(ReadInputFile(index_path, "safetensors index"), index_path.string());
    KVDIFF_CHECK(
        index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
        "{}: expected an object with a \"weight_map\" object", index_path.string());
    std::set<std::string> shard_names;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      KVDIFF_CHECK(shard.is_string(), "{}: weight_map entry \"{}\" must be a file name, found {}",
                   index_path.string(), name, JsonSnippet(shard));
      const std::string file = shard.get<std::string>();
      KVDIFF_CHECK(file.find('/') == std::string::npos && file != ".." && !file.empty(),
                   "{}: weight_map entry \"{}\" names \"{}\", not a file in the model directory",
                   index_path.string(), name, file);
      shard_names.insert(file);
    }
    for (const std::string& file : shard_names) ck.paths.push_back(dir / file);
  } else {
    throw InputError(fmt::format("model directory {} has no {} (nor a sharded {})", dir.string(),
                                 kSingleFile, kShardIndex));
  }

  for (size_t i = 0; i < ck.paths.size(); ++i) {
    ck.files.push_back(SafetensorsFile::Open(ck.paths[i]));
    for (const auto& [name, view] : ck.files.back().tensors()) {
      auto [it, inserted] = ck.file_of.emplace(name, i);
      KVDIFF_CHECK(inserted, "tensor \"{}\" is in both {} and {}", name,
                   ck.paths[it->second].string(), ck.paths[i].string());
    }
  }

  // Validate every name and shape against the config before any data is read.
  const std::vector<TensorSpec> expected = ExpectedTensors(ck.config);
  std::set<std::string> expected_names;
  std::vector<std::string> missing;
  for (const TensorSpec& spec : expected) {
    expected_names.insert(spec.name);
    auto it = ck.file_of.find(spec.name);
    if (it == ck.file_of.end()) {
      missing.push_back(
          fmt::format("\"{}\" (expected shape {})", spec.name, ShapeString(spec.shape)));
      continue;
    }
    const TensorView& view = ck.files[it->second].Get(spec.name);
    KVDIFF_CHECK(
        view.shape == spec.shape, "{}: tensor \"{}\" has shape {}, but config.json implies {}",
        ck.paths[it->second].string(), spec.name, ShapeString(view.shape), ShapeString(spec.shape));
  }
  if (!missing.empty()) {
    std::string hint;
    if (!ck.config.tie_word_embeddings && ck.file_of.count("lm_head.weight") == 0 &&
        missing.size() == 1) {
      hint = " (config.json says tie_word_embeddings is false, so the head must be stored)";
    }
    throw InputError(fmt::format(
        "{}: missing tensor {}{}{}", ck.paths.front().string(), missing.front(),
        missing.size() > 1 ? fmt::format(" and {} more", missing.size() - 1) : std::string(),
        hint));
  }
  for (const auto& [name, index] : ck.file_of) {
    if (expected_names.count(name) != 0) continue;
    if (IsIgnorable(name, ck.config)) {
      ck.ignored.push_back(name);
      continue;
    }
    throw InputError(fmt::format(
        "{}: unexpected tensor \"{}\" of shape {} (not part of a Llama with this config.json: "
        "{} layers, tie_word_embeddings {})",
        ck.paths[index].string(), name, ShapeString(ck.files[index].Get(name).shape),
        ck.config.num_hidden_layers, ck.config.tie_word_embeddings));
  }
  return ck;
}

}  // namespace

std::vector<TensorSpec> ExpectedTensors(const LlamaConfig& c) {
  const int64_t h = c.hidden_size;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    specs.push_back({p + "input_layernorm.weight", {h}});
    specs.push_back({p + "self_attn.q_proj.weight", {c.QDim(), h}});
    specs.push_back({p + "self_attn.k_proj.weight", {c.KvDim(), h}});
    specs.push_back({p + "self_attn.v_proj.weight", {c.KvDim(), h}});
    specs.push_back({p + "self_attn.o_proj.weight", {h, c.QDim()}});
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, h}});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, h}});
    specs.push_back({p + "mlp.down_proj.weight", {h, c.intermediate_size}});
  }
  specs.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

const Tensor& ModelWeights::Get(const std::string& name) const {
  auto it = tensors.find(name);
  KVDIFF_CHECK(it != tensors.end(), "model has no tensor \"{}\"", name);
  return it->second;
}

const Tensor& ModelWeights::LmHead() const {
  return config.tie_word_embeddings ? Get("model.embed_tokens.weight") : Get("lm_head.weight");
}

int64_t ModelWeights::NumParameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += static_cast<int64_t>(t.data.size());
  return n;
}

ModelFileInfo InspectModel(const std::filesystem::path& dir) {
  Checkpoint ck = OpenCheckpoint(dir);
  ModelFileInfo info;
  info.config = ck.config;
  info.safetensors_files = ck.paths;
  for (const auto& path : ck.paths) info.file_bytes += std::filesystem::file_size(path);
  for (const TensorSpec& spec : ExpectedTensors(ck.config)) {
    const TensorView& view = ck.files[ck.file_of.at(spec.name)].Get(spec.name);
    info.tensors_by_dtype[DTypeName(view.dtype)] += 1;
    info.num_tensors += 1;
    info.num_parameters += view.NumElements();
  }
  info.ignored_tensors = ck.ignored;
  return info;
}

ModelWeights LoadModel(const std::filesystem::path& dir) {
  Checkpoint ck = OpenCheckpoint(dir);
  ModelWeights model;
  model.config = ck.config;
  bool first = true;
  for (const TensorSpec& spec : ExpectedTensors(ck.config)) {
    const SafetensorsFile& file = ck.files[ck.file_of.at(spec.name)];
    if (first) model.dtype_on_disk = file.Get(spec.name).dtype;  // the embedding's dtype
    first = false;
    Tensor t;
    t.shape = spec.shape;
    t.data = file.ReadFloat(spec.name);
    file.Release(spec.name);  // the float copy replaces the mapped pages
    model.tensors.emplace(spec.name, std::move(t));
  }
  return model;
}

void SaveModel(const std::filesystem::path& dir, const ModelWeights& model, DType dtype) {
  LlamaConfig config = model.config;
  switch (dtype) {
    case DType::kF32:
      config.torch_dtype = "float32";
      break;
    case DType::kF16:
      config.torch_dtype = "float16";
      break;
    case DType::kBF16:
      config.torch_dtype = "bfloat16";
      break;
    case DType::kF64:
      config.torch_dtype = "float64";
      break;
  }
  config.Validate();
  std::vector<TensorViewToWrite> views;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    auto it = model.tensors.find(spec.name);
    KVDIFF_CHECK(it != model.tensors.end(), "SaveModel: the model has no tensor \"{}\"", spec.name);
    const Tensor& t = it->second;
    KVDIFF_CHECK(t.shape == spec.shape, "SaveModel: tensor \"{}\" has shape {}, expected {}",
                 spec.name, ShapeString(t.shape), ShapeString(spec.shape));
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    KVDIFF_CHECK(t.data.size() == n, "SaveModel: tensor \"{}\" of shape {} holds {} values",
                 spec.name, ShapeString(t.shape), t.data.size());
    views.push_back({spec.name, dtype, spec.shape, t.data.data(), t.data.size()});
  }
  for (const auto& [name, t] : model.tensors) {
    KVDIFF_CHECK(name != "lm_head.weight" || !config.tie_word_embeddings,
                 "SaveModel: the model is tied (tie_word_embeddings) but holds lm_head.weight");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  KVDIFF_CHECK(std::filesystem::is_directory(dir), "cannot create the model directory {}{}",
               dir.string(), ec ? ": " + ec.message() : std::string());
  WriteFileAtomically(dir / "config.json", ConfigToJson(config));
  // "format": "pt" is what transformers expects in a PyTorch checkpoint's metadata.
  WriteSafetensorsViews(dir / kSingleFile, views, {{"format", "pt"}});
}

}  // namespace kvdiff::format
