// `kvdiff engine-host` (hidden): the child process of --isolate. It serves one engine plugin over
// the kvdiff engine protocol (docs/protocol.md) on an inherited socket: the model directory and the
// options come in the protocol's open call. It exits when kvdiff closes the socket. Not for users.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "plugin_host/isolated_engine.h"

namespace kvdiff::cli {

void AddEngineHostCommand(CLI::App& app, int& exit_code) {
  struct Args {
    int fd = -1;
    std::string plugin;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("engine-host", "Serve an engine plugin to --isolate");
  cmd->group("");  // hidden from --help
  cmd->add_option("--fd", args->fd, "The socket inherited from kvdiff")->required();
  cmd->add_option("plugin", args->plugin, "The plugin file")->required();
  cmd->callback(
      [args, &exit_code] { exit_code = engines::ServeIsolatedEngine(args->fd, args->plugin); });
}

}  // namespace kvdiff::cli
