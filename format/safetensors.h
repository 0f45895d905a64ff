// safetensors: 8-byte little-endian header length, a JSON header, then the raw data.
// Read memory-mapped with strict validation; written from float values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvdiff::format {

enum class DType { kF32, kF16, kBF16, kF64 };
const char* DTypeName(DType dtype);         // "F32", "F16", "BF16", "F64"
DType ParseDType(const std::string& name);  // throws InputError naming the unknown dtype
size_t DTypeSize(DType dtype);

// "[2, 3]": a shape as every message spells it.
std::string ShapeString(const std::vector<int64_t>& shape);

struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const std::byte* data;  // points into the mapping
  size_t nbytes;
  int64_t NumElements() const;
};

class SafetensorsFile {
 public:
  // Maps the file and validates the header; throws InputError naming the file and the problem.
  static SafetensorsFile Open(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorView& Get(const std::string& name) const;  // throws InputError when absent
  // The tensor's values converted to float (F32, F16, BF16, F64 accepted).
  std::vector<float> ReadFloat(const std::string& name) const;
  // Releases the pages of a tensor already converted, so loading does not hold two copies.
  void Release(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;  // converted to dtype on write (round to nearest even for 16-bit)
};

// Writes tensors in the order given (offsets follow that order), JSON header keys sorted, header
// padded with spaces to a multiple of 8. Deterministic: same input, same bytes.
// Written to a temporary file in the same directory, then renamed: an interrupted write never
// leaves a half file under `path`.
void WriteSafetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The same, for values that live elsewhere (no copy: a 135M-parameter model is 540 MB of floats).
struct TensorViewToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const float* values = nullptr;
  size_t num_values = 0;
};
void WriteSafetensorsViews(const std::filesystem::path& path,
                           const std::vector<TensorViewToWrite>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// The 16-bit patterns safetensors (and GGUF) store for F16 and BF16: round to nearest even.
uint16_t FloatToF16Bits(float value);
uint16_t FloatToBF16Bits(float value);

// `value` as it reads back after a round trip through dtype (round to nearest even for F16/BF16).
float RoundToDType(float value, DType dtype);

// Writes `contents` to a temporary file beside `path` and renames it over `path`.
void WriteFileAtomically(const std::filesystem::path& path, const std::string& contents);

}  // namespace kvdiff::format
