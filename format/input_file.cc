#include "format/input_file.h"

#include <fstream>
#include <system_error>

#include "format/error.h"

namespace kvdiff::format {

uint64_t CheckInputFile(const std::filesystem::path& path, const std::string& what,
                        uint64_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  KVDIFF_CHECK(!ec && fs::exists(status), "cannot open {} {}: it does not exist or is not readable",
               what, path.string());
  KVDIFF_CHECK(!fs::is_directory(status), "cannot read {} {}: it is a directory, expected a file",
               what, path.string());
  KVDIFF_CHECK(fs::is_regular_file(status),
               "cannot read {} {}: not a regular file (a device, FIFO or socket), expected a file",
               what, path.string());
  const uint64_t size = fs::file_size(path, ec);
  KVDIFF_CHECK(!ec, "cannot read {} {}: {}", what, path.string(), ec.message());
  KVDIFF_CHECK(size <= max_bytes, "cannot read {} {}: {} bytes, more than the {} accepted", what,
               path.string(), size, max_bytes);
  return size;
}

std::string ReadInputFile(const std::filesystem::path& path, const std::string& what,
                          uint64_t max_bytes) {
  const uint64_t size = CheckInputFile(path, what, max_bytes);
  std::ifstream in(path, std::ios::binary);
  KVDIFF_CHECK(in.good(), "cannot open {} {}: it does not exist or is not readable", what,
               path.string());
  std::string text(size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  text.resize(static_cast<size_t>(in.gcount()));
  KVDIFF_CHECK(!in.bad(), "cannot read {} {}", what, path.string());
  return text;
}

}  // namespace kvdiff::format
