// kvdiff: differential verification of KV-cache inference for Llama-family models.
// Exit codes: 0 success, 1 a divergence or a backend error (run/check/golden), 2 bad input or usage.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <new>

#include "harness/cli/commands.h"
#include "format/error.h"

int main(int argc, char** argv) {
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
  try {
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
  return exit_code;
}
