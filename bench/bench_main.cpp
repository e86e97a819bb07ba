// kimirt-bench <suite> [flags]: benchmarks (not tests). Each prints achieved figures and their ratio to a
// measured ceiling; docs/PERF.md keeps the log.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "bench_registry.h"

namespace kimirt::bench {
std::vector<Suite>& suites() {
  static std::vector<Suite> list;
  return list;
}
}  // namespace kimirt::bench

int main(int argc, char** argv) {
  auto& all = kimirt::bench::suites();
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  if (argc >= 2) {
    for (const auto& suite : all) {
      if (suite.name == argv[1]) return suite.run(argc - 1, argv + 1);
    }
  }
  const bool asked = argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
  std::fprintf(asked ? stdout : stderr, "usage: kimirt-bench <suite> [flags]   (<suite> --help for its flags)\n\nsuites:\n");
  for (const auto& suite : all) std::fprintf(asked ? stdout : stderr, "  %-12s %s\n", suite.name.c_str(), suite.help.c_str());
  return asked ? 0 : 2;
}
