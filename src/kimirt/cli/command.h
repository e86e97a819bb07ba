// Subcommands register themselves here (one file per command: cmd_<name>.cpp), so main.cpp never
// changes when a command is added.
#pragma once

#include <CLI/CLI.hpp>

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

std::vector<Command>& commands();
void set_exit_code(int code);
int exit_code();

struct RegisterCommand {
  RegisterCommand(std::string name, int order, std::function<void(CLI::App&)> setup) {
    commands().push_back({std::move(name), order, std::move(setup)});
  }
};

}  // namespace kimirt::cli
