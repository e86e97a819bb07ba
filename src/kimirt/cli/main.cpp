// kimirt: one binary that inspects, runs, chats with and serves Kimi K3 / Kimi Linear checkpoints.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/base/printable.h"
#include "kimirt/cli/command.h"

namespace kimirt::cli {

std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}

namespace {
int g_exit_code = 0;
}

// The exit status of a command line that cannot be parsed (an unknown command or flag, a value out of range), apart
// from 1, an error while running.
constexpr int kUsageError = 2;
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

}  // namespace kimirt::cli

int main(int argc, char** argv) {
  using namespace kimirt::cli;
  CLI::App app{"kimirt: inference engine for the Kimi K3 model family (Kimi K3, Kimi Linear)", "kimirt"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kimirt 0.1.0");
  // The command's help, where a known command was given (CLI11 reports every error from the top app).
  const std::string help =
      argc > 1 && argv[1][0] != '-' ? fmt::format("kimirt {} --help", argv[1]) : std::string("kimirt --help");
  app.failure_message([help](const CLI::App*, const CLI::Error& e) {
    return fmt::format("kimirt: error: {}\nRun {} for more information.\n", e.what(), help);
  });
  auto list = commands();
  std::sort(list.begin(), list.end(), [](const Command& a, const Command& b) { return a.order < b.order; });
  for (auto& command : list) command.setup(app);
  // A first word that names no command: said with the word (CLI11 only says that a subcommand is required).
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : std::as_const(app).get_subcommands([](const CLI::App*) { return true; })) {
      known = known || sub->check_name(argv[1]);
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "kimirt: error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
      return kUsageError;
    }
  }
  int rc = 0;
  try {
    app.parse(argc, argv);
    rc = exit_code();
  } catch (const CLI::ParseError& e) {
    // Help and the version: status 0. A parse error: one status for every kind (CLI11 has one per kind, 105 to
    // 115), the usual 2 of a usage error, and the message prefixed as every other error of kimirt's is.
    rc = app.exit(e) == 0 ? 0 : kUsageError;
  } catch (const std::exception& e) {  // kimirt::Error and any other
    // Messages carry names read from files: shown with their control characters escaped (kimirt/base/printable.h).
    std::fprintf(stderr, "kimirt: error: %s\n", kimirt::printable(e.what()).c_str());
    return 1;
  }
  // Output that could not be written (a full disk, a closed descriptor) is an error, not a silent success. The
  // write that failed may be long past (its errno gone): the reason is given only when this flush says it.
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int flush_errno = errno;
  if (!flushed || std::ferror(stdout)) {
    std::fprintf(stderr, "kimirt: error: writing to standard output failed%s%s\n", !flushed && flush_errno ? ": " : "",
                 !flushed && flush_errno ? std::strerror(flush_errno) : "");
    return rc != 0 ? rc : 1;
  }
  return rc;
}
