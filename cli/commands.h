// Each subcommand lives in its own cmd_*.cc and registers itself on the app. A command's callback
// stores its exit code in `exit_code`; errors are thrown and turned into exit 2 by main().
#pragma once

#include <CLI/CLI.hpp>

namespace kvdiff::cli {

void AddInfoCommand(CLI::App& app, int& exit_code);
void AddMakeModelCommand(CLI::App& app, int& exit_code);
void AddForwardCommand(CLI::App& app, int& exit_code);
void AddRunCommand(CLI::App& app, int& exit_code);
void AddCheckCommand(CLI::App& app, int& exit_code);
void AddCompareCommand(CLI::App& app, int& exit_code);
void AddConvertCommand(CLI::App& app, int& exit_code);
void AddGenerateCommand(CLI::App& app, int& exit_code);
void AddGoldenCommand(CLI::App& app, int& exit_code);
void AddReproCommand(CLI::App& app, int& exit_code);
void AddBenchCommand(CLI::App& app, int& exit_code);
void AddTokenizeCommand(CLI::App& app, int& exit_code);
void AddConformCommand(CLI::App& app, int& exit_code);
void AddEngineHostCommand(CLI::App& app, int& exit_code);
void AddMergeCommand(CLI::App& app, int& exit_code);

}  // namespace kvdiff::cli
