#include "cli/cli_util.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <sstream>

#include "format/error.h"
#include "harness/backend/registry.h"

namespace kvdiff::cli {
namespace {

std::string Trim(const std::string& s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  const auto b = std::find_if(s.begin(), s.end(), not_space);
  const auto e = std::find_if(s.rbegin(), s.rend(), not_space).base();
  return b < e ? std::string(b, e) : std::string();
}

// Commas separate items when there are any (so "1,,3" has an empty item); otherwise whitespace.
std::vector<std::string> SplitItems(const std::string& text) {
  std::vector<std::string> items;
  if (text.find(',') != std::string::npos) {
    size_t start = 0;
    while (true) {
      const size_t comma = text.find(',', start);
      items.push_back(Trim(text.substr(start, comma == std::string::npos ? comma : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    std::istringstream in(text);
    for (std::string word; in >> word;) items.push_back(word);
    if (items.empty()) items.push_back("");
  }
  return items;
}

}  // namespace

std::vector<int64_t> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int64_t> values;
  for (const std::string& item : SplitItems(text)) {
    KVDIFF_CHECK(
        !item.empty() && item.size() <= 18 &&
            std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }),
        "{}: expected non-negative integers separated by commas or spaces, like 1,2,3; "
        "item {} is \"{}\"",
        flag, values.size(), item);
    values.push_back(std::stoll(item));
  }
  return values;
}

Tokens ParseTokenIds(const std::string& flag, const std::string& text, int64_t vocab_size) {
  Tokens tokens;
  for (const int64_t id : ParseIntList(flag, text)) {
    KVDIFF_CHECK(vocab_size < 0 || id < vocab_size,
                 "{}: token id {} at index {} is out of range for vocab_size {}", flag, id,
                 tokens.size(), vocab_size);
    KVDIFF_CHECK(id <= INT32_MAX, "{}: token id {} at index {} does not fit a 32-bit token id",
                 flag, id, tokens.size());
    tokens.push_back(static_cast<Token>(id));
  }
  return tokens;
}

BackendSet MakeBackends(const std::vector<std::string>& names,
                        std::shared_ptr<const format::ModelWeights> weights,
                        const harness::BackendOptions& options) {
  BackendSet set;
  for (const std::string& name : names) {
    set.owned.push_back(harness::BackendRegistry::Global().Make(name, weights, options));
    set.all.push_back(set.owned.back().get());
  }
  return set;
}

void AddIsolateFlag(CLI::App* cmd, harness::BackendOptions& options) {
  CLI::Option* isolate = cmd->add_flag(
      "--isolate",
      "Run engine plugins in a child process (the default): a crash, hang or exit while loading, "
      "opening, running or closing fails that call, naming what happened");
  CLI::Option* in_process = cmd->add_flag_callback(
      "--in-process", [&options] { options.isolate = false; },
      "Load engine plugins into kvdiff itself: faster, but a plugin that crashes or hangs takes "
      "kvdiff with it");
  in_process->excludes(isolate);
  cmd->add_option("--isolate-timeout", options.isolate_timeout_seconds,
                  "Seconds one isolated engine call (opening it too) may take before it is killed")
      ->default_val(600)
      ->check(CLI::Range(0.001, 86400.0));
}

std::string BackendsHelp(const std::string& defaults_note) {
  return fmt::format("Comma-separated backends: {}{}",
                     harness::BackendRegistry::Global().HelpText(),
                     defaults_note.empty() ? "" : " (" + defaults_note + ")");
}

}  // namespace kvdiff::cli
