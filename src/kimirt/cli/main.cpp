// kimirt: one binary that inspects, runs, chats with and serves Kimi K3 / Kimi Linear checkpoints.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

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
      return 1;
    }
  }
  int rc = 0;
  try {
    app.parse(argc, argv);
    rc = exit_code();
  } catch (const CLI::ParseError& e) {
    rc = app.exit(e);  // help and the version (status 0) or the parse error
  } catch (const kimirt::Error& e) {
    std::fprintf(stderr, "kimirt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kimirt: error: %s\n", e.what());
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
