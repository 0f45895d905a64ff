#include "harness/cli/commands.h"

namespace kvdiff::cli {

// Placeholder: being written.
void AddForwardCommand(CLI::App& app, int& exit_code) {}

}  // namespace kvdiff::cli
