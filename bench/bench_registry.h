// One program, kimirt-bench, runs every benchmark suite: `kimirt-bench <suite> [flags]`. A suite's file
// registers its entry point here, so the dispatcher never changes when a suite is added.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kimirt::bench {

struct Suite {
  std::string name;
  std::string help;
  std::function<int(int argc, char** argv)> run;  // argv[0] is the suite name
};

std::vector<Suite>& suites();

struct RegisterSuite {
  RegisterSuite(std::string name, std::string help, std::function<int(int, char**)> run) {
    suites().push_back({std::move(name), std::move(help), std::move(run)});
  }
};

}  // namespace kimirt::bench
