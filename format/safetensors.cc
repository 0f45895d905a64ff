// safetensors, written from the format description (https://github.com/huggingface/safetensors):
//   [8 bytes: little-endian u64 N][N bytes: JSON header][data section]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section) plus an optional "__metadata__" object of strings. The reader is as
// strict as the reference implementation: the tensors must tile the data section exactly (no
// overlap, no gap, no trailing bytes), because a file that does not is truncated or corrupt.
// Here: the dtypes and reading; writing is in safetensors_write.cc.
#include "format/safetensors.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "format/error.h"
#include "format/json_document.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvdiff reads and writes safetensors by memcpy and assumes a little-endian host"
#endif
static_assert(std::numeric_limits<float>::is_iec559, "kvdiff needs IEEE-754 float");

namespace kvdiff::format {
namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return BitsFloat(sign | 0x7F800000u | (mantissa << 13));  // inf / nan
  if (exponent != 0) return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsFloat(sign);  // +-0
  // Subnormal half: mantissa * 2^-24, exactly representable as a normal float.
  int shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  mantissa &= 0x3FFu;
  const uint32_t float_exponent = static_cast<uint32_t>(127 - 15 + 1 - shift);
  return BitsFloat(sign | (float_exponent << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or nan: keep a nan a (quiet) nan
    if (abs == 0x7F800000u) return sign | 0x7C00u;
    return sign | 0x7E00u | static_cast<uint16_t>((abs >> 13) & 0x3FFu);
  }
  // 65520 = the midpoint between the largest half (65504) and 2^16: it and above round to inf.
  if (abs >= 0x477FF000u) return sign | 0x7C00u;
  if (abs >= 0x38800000u) {                               // >= 2^-14: a normal half
    const uint32_t rebias = abs - (uint32_t{112} << 23);  // exponent bias 127 -> 15
    const uint32_t lsb = (rebias >> 13) & 1u;
    // Round to nearest, ties to even; a carry into the exponent is the correct result.
    return sign | static_cast<uint16_t>((rebias + 0x0FFFu + lsb) >> 13);
  }
  if (abs < 0x33000000u) return sign;  // < 2^-25 (half of the smallest subnormal): rounds to 0
  // Subnormal half: value = m * 2^-24 with m < 1024. Shift the 24-bit float significand.
  const uint32_t exponent = abs >> 23;  // 102 .. 112
  const uint32_t significand = (abs & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14 .. 24
  uint32_t m = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (m & 1u))) ++m;  // may become the min normal
  return sign | static_cast<uint16_t>(m);
}

float BFloat16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {  // nan: truncating could clear the mantissa into inf
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);  // ties to even; overflow gives inf
}

// Non-negative integer from a JSON value, or an error naming where it was found.
uint64_t NonNegativeInt(const json& value, const std::string& what) {
  KVDIFF_CHECK(
      value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
      "{}: expected a non-negative integer, found {}", what, JsonSnippet(value));
  return value.get<uint64_t>();
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

uint16_t FloatToF16Bits(float value) { return FloatToHalf(value); }
uint16_t FloatToBF16Bits(float value) { return FloatToBFloat16(value); }

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
  }
  return "?";
}

DType ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F64") return DType::kF64;
  throw InputError(
      fmt::format("unsupported dtype \"{}\" (expected one of F32, F16, BF16, F64)", name));
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kF64:
      return 8;
  }
  return 0;
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct SafetensorsFile::Mapping {
  std::string path;
  void* base = nullptr;  // the whole file, read-only
  size_t size = 0;
  ~Mapping() {
    if (base != nullptr) munmap(base, size);
  }
};

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::Open(const std::filesystem::path& path) {
  const std::string file = path.string();
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  KVDIFF_CHECK(fd >= 0, "cannot open safetensors file {}: {}", file, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(fmt::format("cannot read safetensors file {}: not a regular file", file));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw InputError(fmt::format(
        "{}: file is {} bytes, shorter than the 8-byte header length that starts a safetensors "
        "file",
        file, file_size));
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->path = file;
  void* base = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  KVDIFF_CHECK(base != MAP_FAILED, "cannot map safetensors file {}: {}", file,
               std::strerror(mmap_errno));
  mapping->base = base;
  mapping->size = file_size;
  const auto* bytes = static_cast<const std::byte*>(base);

  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  KVDIFF_CHECK(header_len <= file_size - 8,
               "{}: header length {} goes beyond the end of the file ({} bytes, so at most {} "
               "header bytes)",
               file, header_len, file_size, file_size - 8);
  KVDIFF_CHECK(header_len <= kMaxHeaderBytes, "{}: header length {} exceeds the limit of {} bytes",
               file, header_len, kMaxHeaderBytes);
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  const json header = ParseJsonDocument(std::string_view(header_begin, header_len),
                                        fmt::format("{}: the {}-byte header", file, header_len));
  KVDIFF_CHECK(header.is_object(), "{}: the header must be a JSON object, found {}", file,
               header.type_name());

  SafetensorsFile result;
  const std::byte* data = bytes + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  struct Extent {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Extent> extents;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      KVDIFF_CHECK(entry.is_object(), "{}: \"__metadata__\" must be an object of strings, found {}",
                   file, entry.type_name());
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        KVDIFF_CHECK(m.value().is_string(),
                     "{}: \"__metadata__\" entry \"{}\" must be a string, found {}", file, m.key(),
                     JsonSnippet(m.value()));
        result.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor \"{}\"", file, name);
    KVDIFF_CHECK(entry.is_object(),
                 "{}: expected an object with dtype, shape and data_offsets, "
                 "found {}",
                 where, entry.type_name());
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      KVDIFF_CHECK(entry.contains(key), "{}: missing \"{}\"", where, key);
    }
    TensorView view;
    view.name = name;
    KVDIFF_CHECK(entry["dtype"].is_string(), "{}: \"dtype\" must be a string, found {}", where,
                 JsonSnippet(entry["dtype"]));
    try {
      view.dtype = ParseDType(entry["dtype"].get<std::string>());
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", where, e.what()));
    }
    const json& shape = entry["shape"];
    KVDIFF_CHECK(shape.is_array(),
                 "{}: \"shape\" must be a list of non-negative integers, found {}", where,
                 JsonSnippet(shape));
    uint64_t num_elements = 1;
    for (const json& dim : shape) {
      const uint64_t d = NonNegativeInt(dim, where + " shape " + JsonSnippet(shape));
      // Products beyond the file size are certainly wrong; checking here also prevents overflow.
      KVDIFF_CHECK(d == 0 || num_elements <= file_size / d,
                   "{}: shape {} has more elements than the file has bytes", where,
                   JsonSnippet(shape));
      num_elements *= d;
      view.shape.push_back(static_cast<int64_t>(d));
    }
    const json& offsets = entry["data_offsets"];
    KVDIFF_CHECK(offsets.is_array() && offsets.size() == 2,
                 "{}: \"data_offsets\" must be [begin, end], found {}", where,
                 JsonSnippet(offsets));
    const uint64_t begin = NonNegativeInt(offsets[0], where + " data_offsets begin");
    const uint64_t end = NonNegativeInt(offsets[1], where + " data_offsets end");
    KVDIFF_CHECK(begin <= end, "{}: data_offsets [{}, {}] end before they begin", where, begin,
                 end);
    KVDIFF_CHECK(end <= data_size,
                 "{}: data_offsets [{}, {}] out of range: the data section has {} bytes", where,
                 begin, end, data_size);
    const uint64_t expected_bytes = num_elements * DTypeSize(view.dtype);
    KVDIFF_CHECK(end - begin == expected_bytes,
                 "{}: data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {} bytes",
                 where, begin, end, end - begin, ShapeString(view.shape), DTypeName(view.dtype),
                 expected_bytes);
    view.data = data + begin;
    view.nbytes = end - begin;
    auto inserted = result.tensors_.emplace(name, std::move(view));
    extents.push_back({begin, end, &inserted.first->first});
  }

  // The tensors must tile the data section: sorted by offset, each starts where the last ended.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Extent& e : extents) {
    KVDIFF_CHECK(e.begin >= covered,
                 "{}: tensors \"{}\" and \"{}\" overlap: \"{}\" starts at byte {} of the data "
                 "section, before \"{}\" ends at byte {}",
                 file, *previous, *e.name, *e.name, e.begin, *previous, covered);
    KVDIFF_CHECK(e.begin == covered,
                 "{}: gap of {} bytes in the data section before tensor \"{}\" (starts at {}, "
                 "expected {}): the tensors must cover the data section exactly",
                 file, e.begin - covered, *e.name, e.begin, covered);
    covered = e.end;
    previous = e.name;
  }
  KVDIFF_CHECK(covered == data_size,
               "{}: {} trailing bytes after the last tensor (the data section has {} bytes, the "
               "tensors cover {}): the file is not a valid safetensors file",
               file, data_size - covered, data_size, covered);

  result.mapping_ = std::move(mapping);
  return result;
}

const TensorView& SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, v] : tensors_) names.push_back(n);
    std::string listed = fmt::format(
        "{}", fmt::join(names.begin(), names.begin() + std::min<size_t>(names.size(), 8), ", "));
    if (names.size() > 8) listed += fmt::format(", ... ({} in all)", names.size());
    throw InputError(fmt::format("{}: no tensor named \"{}\" (the file has: {})",
                                 mapping_ ? mapping_->path : std::string("safetensors file"), name,
                                 names.empty() ? std::string("no tensors") : listed));
  }
  return it->second;
}

std::vector<float> SafetensorsFile::ReadFloat(const std::string& name) const {
  const TensorView& view = Get(name);
  const size_t n = static_cast<size_t>(view.NumElements());
  std::vector<float> out(n);
  // memcpy per element: the data section need not be aligned (the header length is arbitrary).
  switch (view.dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(out.data(), view.data, n * 4);
      break;
    case DType::kF64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, view.data + 8 * i, 8);
        out[i] = static_cast<float>(d);  // IEEE: round to nearest, out of range gives inf
      }
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, view.data + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      break;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, view.data + 2 * i, 2);
        out[i] = BFloat16ToFloat(b);
      }
      break;
  }
  return out;
}

void SafetensorsFile::Release(const std::string& name) const {
  const TensorView& view = Get(name);
  if (view.nbytes == 0 || !mapping_) return;
  // The mapping is private and never written, so dropping its pages is safe: a later read faults
  // them back in from the file. Whole pages only, including a neighbour's partial page (harmless).
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(view.data);
  const uintptr_t first = start & ~(page - 1);
  const uintptr_t last = (start + view.nbytes + page - 1) & ~(page - 1);
  madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // advisory: ignore errors
}

float RoundToDType(float value, DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return HalfToFloat(FloatToHalf(value));
    case DType::kBF16:
      return BFloat16ToFloat(FloatToBFloat16(value));
    default:
      return value;
  }
}

}  // namespace kvdiff::format
