// `kvdiff engine-host` (hidden): the child process of --isolate. It serves one engine plugin on an
// inherited socket (plugin_host/isolated_engine.h) and exits when kvdiff closes it. Not for users.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "plugin_host/isolated_engine.h"

namespace kvdiff::cli {

void AddEngineHostCommand(CLI::App& app, int& exit_code) {
  struct Args {
    int fd = -1;
    std::string options, plugin, model_dir;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("engine-host", "Serve an engine plugin to --isolate");
  cmd->group("");  // hidden from --help
  cmd->add_option("--fd", args->fd, "The socket inherited from kvdiff")->required();
  cmd->add_option("--options", args->options, "Engine options");
  cmd->add_option("plugin", args->plugin, "The plugin file")->required();
  cmd->add_option("model_dir", args->model_dir, "The model directory")->required();
  cmd->callback([args, &exit_code] {
    exit_code =
        engines::ServeIsolatedEngine(args->fd, args->plugin, args->model_dir, args->options);
  });
}

}  // namespace kvdiff::cli
