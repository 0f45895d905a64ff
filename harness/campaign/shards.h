// Which shard of a campaign this process runs: `--shard i/n`, or the environment of the systems
// that already shard test fleets, so kvdiff rides their sharding with no coordinator of its own.
//   Bazel            TEST_SHARD_INDEX (0-based) and TEST_TOTAL_SHARDS; kvdiff touches
//                    TEST_SHARD_STATUS_FILE to tell Bazel it honours them
//   GoogleTest       GTEST_SHARD_INDEX (0-based) and GTEST_TOTAL_SHARDS
//   Kubernetes       JOB_COMPLETION_INDEX (0-based; an Indexed Job) with the total from
//                    --shard-count or KVDIFF_SHARD_COUNT (Kubernetes does not export it)
// An explicit --shard wins over all of them; among the environments the order is the list's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "harness/campaign/campaign.h"

namespace kvdiff::harness {

// The value of an environment variable; empty or unset is std::nullopt.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnvironment();

struct ShardSelection {
  Shard shard;
  std::string source;       // "--shard", "TEST_SHARD_INDEX/TEST_TOTAL_SHARDS", ..., or "" (1/1)
  std::string status_file;  // TEST_SHARD_STATUS_FILE to touch, when Bazel's variables chose
};

// InputError naming the variable (or flag) for a malformed, out-of-range or half-given value.
ShardSelection SelectShard(const std::optional<std::string>& shard_flag,
                           std::optional<int64_t> shard_count_flag, const EnvLookup& env);

// Creates the file if it does not exist (Bazel's "this test supports sharding" handshake).
void TouchShardStatusFile(const std::string& path);

}  // namespace kvdiff::harness
