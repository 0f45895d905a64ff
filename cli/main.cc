// kvdiff: differential verification of KV-cache inference for Llama-family models.
// Exit codes: 0 success, 1 a divergence or a backend error (run/check/golden), 2 bad input or
// usage.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <limits>
#include <new>
#include <set>
#include <string>

#include "cli/commands.h"
#include "cli/engine_guard.h"
#include "format/error.h"
#include "harness/backend/registry.h"
#include "harness/campaign/jobs.h"
#include "impl/kernel_path.h"
#include "impl/thread_pool.h"

namespace {

// The command line's shared bounds, set here once for every subcommand (docs/bad-input.md):
// --threads 0 (every core) to kMaxThreads and --jobs 0 to kMaxJobs, refused while parsing, before
// any model is loaded or any thread started; seeds whole numbers >= 0 (CLI11 would wrap -1 to
// 2^64-1); --backends not empty (it would fall back to the default); and a readable refusal of a
// negative number (CLI11's NonNegativeNumber names its bound, DBL_MAX: 309 digits).
void SharedOptionChecks(CLI::App& app) {
  const CLI::Validator non_negative(
      [](std::string& s) {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        return end != s.c_str() && *end == '\0' && v >= 0
                   ? std::string()
                   : "expected a number >= 0, got \"" + s + "\"";
      },
      "NONNEGATIVE");
  const CLI::Validator seed(
      [](std::string& s) {
        const bool digits =
            !s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos;
        if (!digits) return "expected a whole number >= 0, got \"" + s + "\"";
        // 20 digits may pass 2^64 - 1, which CLI11 would then clamp to it without a word.
        const std::string max = std::to_string(std::numeric_limits<uint64_t>::max());
        const bool fits = s.size() < max.size() || s <= max;
        return fits ? std::string()
                    : "expected a whole number from 0 to " + max + ", got \"" + s + "\"";
      },
      "SEED");
  const CLI::Validator not_empty(
      [](std::string& s) {
        return s.empty() ? std::string(
                               "expected a comma-separated list such as impl,ref, got "
                               "nothing")
                         : std::string();
      },
      "LIST");
  // CLI::Range compares the value with its bounds, and every comparison with NaN is false, so
  // "nan" passed every range (--isolate-timeout nan killed a correct engine at once).
  const CLI::Validator not_nan(
      [](std::string& s) {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        return end != s.c_str() && *end == '\0' && std::isnan(v)
                   ? "expected a number, got \"" + s + "\""
                   : std::string();
      },
      "");  // no description: the help's "FLOAT in [LOW - HIGH]" says enough
  // An empty value (`--model ''`, `--json "$UNSET"`) fell back to the default without a word; only
  // the texts of a prompt or of token ids may be empty. (No description: the help stays as it was.)
  const CLI::Validator not_blank(
      [](std::string& s) { return s.empty() ? "expected a value, got an empty one" : ""; }, "");
  static const std::set<std::string> may_be_empty = {
      "--text", "--prompt", "--chat", "--decode", "--tokens", "--second", "--second-tokens"};
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    for (CLI::Option* opt : sub->get_options()) {
      const std::string name = opt->get_name();
      // A range's description is "TYPE in [LOW - HIGH]" (CLI11 2.1); PositiveNumber's is FLOAT's.
      const std::string type = opt->get_type_name();
      if (type.find(" in [") != std::string::npos || type.find("FLOAT") != std::string::npos) {
        opt->check(not_nan);
      }
      // CLI11 2.1 files NonNegativeNumber's "NONNEGATIVE" as its description, not its name.
      try {
        for (int i = 0;; ++i) {
          CLI::Validator* v = opt->get_validator(i);
          if (v->get_description() == "NONNEGATIVE") *v = non_negative;
        }
      } catch (const CLI::OptionNotFound&) {
      }
      if (name == "--threads") opt->check(CLI::Range(0, kvdiff::impl::kMaxThreads));
      if (name == "--jobs") opt->check(CLI::Range(0, kvdiff::harness::kMaxJobs));
      if (name == "--seed" || name == "--model-seed") opt->check(seed);
      if (name == "--backends") opt->check(not_empty);
      if (opt->get_type_size() != 0 && may_be_empty.count(name) == 0) opt->check(not_blank);
    }
    SharedOptionChecks(*sub);
  }
}

// The subcommands' names when `word` is none of them, else "".
std::string UnknownCommand(CLI::App& app, const std::string& word) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->check_name(word)) return "";
    if (sub->get_group().empty()) continue;  // hidden (engine-host)
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return names;
}

int Main(int argc, char** argv) {
  CLI::App app{"kvdiff: prove that a KV-cache implementation of a Llama model is right"};
  app.set_version_flag("--version", std::string("kvdiff ") + KVDIFF_VERSION);
  app.require_subcommand(1);
  int exit_code = 0;
  kvdiff::cli::AddInfoCommand(app, exit_code);
  kvdiff::cli::AddMakeModelCommand(app, exit_code);
  kvdiff::cli::AddForwardCommand(app, exit_code);
  kvdiff::cli::AddRunCommand(app, exit_code);
  kvdiff::cli::AddCheckCommand(app, exit_code);
  kvdiff::cli::AddCompareCommand(app, exit_code);
  kvdiff::cli::AddConvertCommand(app, exit_code);
  kvdiff::cli::AddGenerateCommand(app, exit_code);
  kvdiff::cli::AddGoldenCommand(app, exit_code);
  kvdiff::cli::AddReproCommand(app, exit_code);
  kvdiff::cli::AddBenchCommand(app, exit_code);
  kvdiff::cli::AddTokenizeCommand(app, exit_code);
  kvdiff::cli::AddConformCommand(app, exit_code);
  kvdiff::cli::AddEngineHostCommand(app, exit_code);
  kvdiff::cli::AddMergeCommand(app, exit_code);
  SharedOptionChecks(app);
  // CLI11 reads an unknown first word as a stray positional and says "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-' && !UnknownCommand(app, argv[1]).empty()) {
    const std::string names = UnknownCommand(app, argv[1]);
    fmt::print(stderr, "kvdiff: error: unknown command \"{}\" (expected one of: {})\n", argv[1],
               names);
    return 2;
  }
  try {
    // A KVDIFF_KERNELS the CPU cannot run is bad input (exit 2) before any command starts.
    kvdiff::impl::KernelPath();
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::Error& e) {
    app.exit(e);
    return 2;
  } catch (const kvdiff::InputError& e) {
    fmt::print(stderr, "kvdiff: error: {}\n", e.what());
    return 2;
  } catch (const kvdiff::EngineError& e) {
    // An outside engine failed on input it had accepted: a failing engine, not bad input.
    fmt::print(stderr, "kvdiff: engine failure: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "kvdiff: error: out of memory\n");
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kvdiff: error: {}\n", e.what());
    return 2;
  }
  return kvdiff::cli::ReportCloseFaults(exit_code);
}

}  // namespace

int main(int argc, char** argv) {
  kvdiff::cli::InstallExitGuard();  // before any engine is loaded
  // Isolated engines are served by this executable's hidden engine-host subcommand.
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) kvdiff::harness::SetEngineHost(self);
  const int exit_code = Main(argc, argv);
  kvdiff::cli::MarkFinished(exit_code);
  return exit_code;
}
