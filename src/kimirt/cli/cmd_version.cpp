// `kimirt version`: build facts (which backends were compiled in).
#include <cstdio>

#include "kimirt/cli/command.h"

namespace kimirt::cli {
namespace {

const RegisterCommand kVersion("version", 100, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print the version and the compiled-in backends");
  cmd->callback([] {
#ifdef KIMIRT_HAVE_CUDA
    std::printf("kimirt 0.1.0 (backends: cpu, cuda)\n");
#else
    std::printf("kimirt 0.1.0 (backends: cpu)\n");
#endif
  });
});

}  // namespace
}  // namespace kimirt::cli
