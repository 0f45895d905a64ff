#include "harness/campaign/shards.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "format/error.h"

namespace kvdiff::harness {
namespace {

// A whole number in [min, 2^62) written in decimal digits only; InputError naming `what` otherwise.
int64_t ParseCount(const std::string& what, const std::string& text, int64_t min) {
  const bool digits = !text.empty() && text.size() <= 18 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  KVDIFF_CHECK(digits, "{}: expected a whole number >= {}, got \"{}\"", what, min, text);
  const int64_t value = std::stoll(text);
  KVDIFF_CHECK(value >= min, "{}: expected a whole number >= {}, got {}", what, min, value);
  return value;
}

struct EnvProtocol {
  const char* index;  // 0-based
  const char* total;
};
constexpr EnvProtocol kProtocols[] = {{"TEST_SHARD_INDEX", "TEST_TOTAL_SHARDS"},
                                      {"GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS"}};

// 0-based index and total as the environment gives them -> our 1-based Shard.
Shard FromZeroBased(const std::string& index_name, const std::string& index_text,
                    const std::string& total_name, int64_t total) {
  const int64_t index = ParseCount(index_name, index_text, 0);
  KVDIFF_CHECK(index < total, "{}: expected an index below {} ({}), got {}", index_name, total,
               total_name, index);
  return Shard{index + 1, total};
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

ShardSelection SelectShard(const std::optional<std::string>& shard_flag,
                           std::optional<int64_t> shard_count_flag, const EnvLookup& env) {
  ShardSelection sel;
  if (shard_count_flag) {
    KVDIFF_CHECK(*shard_count_flag >= 1, "--shard-count: expected a whole number >= 1, got {}",
                 *shard_count_flag);
  }
  if (shard_flag) {
    sel.shard = ParseShard(*shard_flag);
    sel.source = "--shard";
    return sel;
  }
  for (const EnvProtocol& p : kProtocols) {
    const auto index = env(p.index);
    const auto total = env(p.total);
    if (!index && !total) continue;
    KVDIFF_CHECK(index && total, "{} is set but {} is not: both are needed to select a shard",
                 index ? p.index : p.total, index ? p.total : p.index);
    const int64_t count = ParseCount(p.total, *total, 1);
    sel.shard = FromZeroBased(p.index, *index, p.total, count);
    sel.source = fmt::format("{}/{}", p.index, p.total);
    if (&p == &kProtocols[0]) sel.status_file = env("TEST_SHARD_STATUS_FILE").value_or("");
    return sel;
  }
  if (const auto index = env("JOB_COMPLETION_INDEX")) {
    int64_t count = 0;
    if (shard_count_flag) {
      count = *shard_count_flag;
      sel.source = "JOB_COMPLETION_INDEX/--shard-count";
    } else {
      const auto total = env("KVDIFF_SHARD_COUNT");
      KVDIFF_CHECK(total,
                   "JOB_COMPLETION_INDEX is set ({}) but the number of shards is not: pass "
                   "--shard-count N or set KVDIFF_SHARD_COUNT (the Job's completions)",
                   *index);
      count = ParseCount("KVDIFF_SHARD_COUNT", *total, 1);
      sel.source = "JOB_COMPLETION_INDEX/KVDIFF_SHARD_COUNT";
    }
    sel.shard = FromZeroBased("JOB_COMPLETION_INDEX", *index,
                              shard_count_flag ? "--shard-count" : "KVDIFF_SHARD_COUNT", count);
    return sel;
  }
  return sel;
}

void TouchShardStatusFile(const std::string& path) {
  std::ofstream out(path, std::ios::app);
  KVDIFF_CHECK(out.good(), "TEST_SHARD_STATUS_FILE: cannot create \"{}\"", path);
}

}  // namespace kvdiff::harness
