#include "harness/cli/commands.h"

namespace kvdiff::cli {

// Placeholder: being written.
void AddInfoCommand(CLI::App& app, int& exit_code) {}

}  // namespace kvdiff::cli
