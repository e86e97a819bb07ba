// Subcommands register themselves here (one file per command: cmd_<name>.cpp), so main.cpp never
// changes when a command is added.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace kimirt::cli {

struct Command {
  std::string name;
  int order;  // position in `kimirt --help`
  // Adds the subcommand to the app and sets its callback. The callback returns the exit code through
  // exit_code(); errors are thrown as kimirt::Error and reported by main.
  std::function<void(CLI::App& app)> setup;
};

// The most --threads a command takes: more cores than any machine has; past it, starting the threads only
// exhausts memory.
inline constexpr size_t kMaxThreads = 4096;

std::vector<Command>& commands();
void set_exit_code(int code);
int exit_code();

struct RegisterCommand {
  RegisterCommand(std::string name, int order, std::function<void(CLI::App&)> setup) {
    commands().push_back({std::move(name), order, std::move(setup)});
  }
};

}  // namespace kimirt::cli
