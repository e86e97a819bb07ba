// kimirt: one binary that inspects, runs, chats with and serves Kimi K3 / Kimi Linear checkpoints.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "kimirt/base/error.h"
#include "kimirt/cli/command.h"

namespace kimirt::cli {

std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}

namespace {
int g_exit_code = 0;
}
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

}  // namespace kimirt::cli

int main(int argc, char** argv) {
  using namespace kimirt::cli;
  CLI::App app{"kimirt: inference engine for the Kimi K3 model family (Kimi K3, Kimi Linear)", "kimirt"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kimirt 0.1.0");
  auto list = commands();
  std::sort(list.begin(), list.end(), [](const Command& a, const Command& b) { return a.order < b.order; });
  for (auto& command : list) command.setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kimirt::Error& e) {
    std::fprintf(stderr, "kimirt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kimirt: error: %s\n", e.what());
    return 1;
  }
  // Output that could not be written (a full disk, a closed descriptor) is an error, not a silent success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "kimirt: error: writing the output failed: %s\n", std::strerror(errno));
    return 1;
  }
  return exit_code();
}
