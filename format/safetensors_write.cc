// Writing safetensors (safetensors.h): the JSON header with its keys sorted, padded with spaces to
// a multiple of 8 bytes, then the data in the order given, into a temporary file renamed over the
// target (an interrupted write never leaves a half file). Reading is in safetensors.cc.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "format/error.h"
#include "format/safetensors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvdiff writes safetensors by memcpy and assumes a little-endian host"
#endif

namespace kvdiff::format {

using json = nlohmann::json;

namespace {

// Where a write to `target` goes: through a symlink to the file it names (the rename would replace
// the link itself), and never over what is not a regular file: renaming over /dev/full or a FIFO
// replaced the device node (as root) or the pipe with a file.
std::filesystem::path WriteTarget(const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path resolved = target;
  for (int hop = 0; hop < 40 && fs::is_symlink(fs::symlink_status(resolved, ec)); ++hop) {
    const fs::path to = fs::read_symlink(resolved, ec);
    if (ec) break;
    resolved = to.is_absolute() ? to : resolved.parent_path() / to;  // a dangling one too
  }
  const fs::file_status status = fs::status(resolved, ec);
  KVDIFF_CHECK(!fs::exists(status) || fs::is_regular_file(status),
               "cannot write {}: it exists and is not a regular file (a directory, device, FIFO or "
               "socket); expected a file path to write",
               target.string());
  return resolved;
}

class TempFile {
 public:
  // A fresh file beside `target` (same directory, so the final rename is atomic).
  explicit TempFile(const std::filesystem::path& target) : target_(WriteTarget(target)) {
    static std::atomic<unsigned> counter{0};
    const std::filesystem::path dir = target_.has_parent_path() ? target_.parent_path() : ".";
    for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
      path_ = dir / fmt::format(".{}.tmp.{}.{}", target_.filename().string(),
                                static_cast<long>(getpid()), counter++);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    KVDIFF_CHECK(fd_ >= 0, "cannot create a file in {}: {}", dir.string(), std::strerror(errno));
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  void Write(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, size);
      if (n < 0 && errno == EINTR) continue;
      KVDIFF_CHECK(n > 0, "cannot write {}: {}", target_.string(), std::strerror(errno));
      p += n;
      size -= static_cast<size_t>(n);
    }
  }
  void Commit() {
    KVDIFF_CHECK(::fsync(fd_) == 0, "cannot write {}: {}", target_.string(), std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    KVDIFF_CHECK(rc == 0, "cannot write {}: {}", target_.string(), std::strerror(errno));
    KVDIFF_CHECK(::rename(path_.c_str(), target_.c_str()) == 0, "cannot rename {} to {}: {}",
                 path_.string(), target_.string(), std::strerror(errno));
    committed_ = true;
  }

 private:
  std::filesystem::path target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void WriteFileAtomically(const std::filesystem::path& path, const std::string& contents) {
  TempFile out(path);
  out.Write(contents.data(), contents.size());
  out.Commit();
}

void WriteSafetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorViewToWrite> views;
  views.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    views.push_back({t.name, t.dtype, t.shape, t.values.data(), t.values.size()});
  }
  WriteSafetensorsViews(path, views, metadata);
}

void WriteSafetensorsViews(const std::filesystem::path& path,
                           const std::vector<TensorViewToWrite>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const TensorViewToWrite& t : tensors) {
    KVDIFF_CHECK(!t.name.empty() && t.name != "__metadata__",
                 "WriteSafetensors: invalid tensor name \"{}\"", t.name);
    KVDIFF_CHECK(!header.contains(t.name), "WriteSafetensors: tensor \"{}\" given twice", t.name);
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      KVDIFF_CHECK(d >= 0, "WriteSafetensors: tensor \"{}\" has a negative dimension in shape {}",
                   t.name, ShapeString(t.shape));
      n *= static_cast<uint64_t>(d);
    }
    KVDIFF_CHECK(n == t.num_values,
                 "WriteSafetensors: tensor \"{}\" has shape {} ({} elements) but {} values", t.name,
                 ShapeString(t.shape), n, t.num_values);
    const uint64_t nbytes = n * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string header_text = header.dump();  // keys sorted (std::map), no whitespace
  // Pad with spaces so the data section starts 8-byte aligned (8 + header_len is a multiple of 8).
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_len = header_text.size();

  TempFile out(path);
  out.Write(&header_len, 8);
  out.Write(header_text.data(), header_text.size());
  std::vector<uint16_t> half;
  for (const TensorViewToWrite& t : tensors) {
    switch (t.dtype) {
      case DType::kF32:
        out.Write(t.values, t.num_values * 4);
        break;
      case DType::kF64: {
        std::vector<double> wide(t.values, t.values + t.num_values);
        out.Write(wide.data(), wide.size() * 8);
        break;
      }
      case DType::kF16:
      case DType::kBF16:
        half.resize(t.num_values);
        for (size_t i = 0; i < t.num_values; ++i) {
          half[i] =
              t.dtype == DType::kF16 ? FloatToF16Bits(t.values[i]) : FloatToBF16Bits(t.values[i]);
        }
        out.Write(half.data(), half.size() * 2);
        break;
    }
  }
  out.Commit();
}

}  // namespace kvdiff::format
