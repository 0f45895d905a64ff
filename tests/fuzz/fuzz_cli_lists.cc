// The command line's parsers of lists: token ids (--tokens, --chunks), --shard and --backends.
#include "cli/cli_util.h"
#include "harness/campaign/campaign.h"
#include "harness/scenario/scenario.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = kvdiff::fuzz::Text(data, size);
  kvdiff::fuzz::Refusable([&] { (void)kvdiff::cli::ParseTokenIds("--tokens", text, 256); });
  kvdiff::fuzz::Refusable([&] { (void)kvdiff::cli::ParseIntList("--chunks", text); });
  kvdiff::fuzz::Refusable([&] {
    const auto shard = kvdiff::harness::ParseShard(text);
    (void)kvdiff::harness::ShardCases(1000, shard);
  });
  kvdiff::fuzz::Refusable([&] { (void)kvdiff::harness::ParseBackendList(text); });
  return 0;
}
