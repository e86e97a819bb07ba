#include "kimirt/base/memory_info.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

namespace kimirt {
namespace {

std::optional<uint64_t> mem_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return std::nullopt;
  std::optional<uint64_t> bytes;
  char line[256];
  while (std::fgets(line, sizeof(line), f)) {
    unsigned long long kib = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      bytes = static_cast<uint64_t>(kib) * 1024;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

// A file holding one number ("max", or anything else that is not a number: none).
std::optional<uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  unsigned long long v = 0;
  if (!(in >> v)) return std::nullopt;
  return static_cast<uint64_t>(v);
}

// Room under the memory cgroup's limit. The group's path in /proc/self/cgroup is the host's; a container
// mounts its own group at the controller's root, so both places are tried.
std::optional<uint64_t> cgroup_room() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    const bool v1 = (',' + controllers + ',').find(",memory,") != std::string::npos;
    if (!v2 && !v1) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char* limit_file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
    const char* usage_file = v2 ? "/memory.current" : "/memory.usage_in_bytes";
    for (const std::string& dir : {root + path, root}) {
      const auto limit = read_number(dir + limit_file);
      const auto usage = read_number(dir + usage_file);
      // v1 writes "no limit" as a number near 2^63.
      if (!limit || !usage || *limit >= (uint64_t{1} << 60)) continue;
      return *limit > *usage ? *limit - *usage : 0;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<uint64_t> available_memory_bytes() {
  const auto meminfo = mem_available(), room = cgroup_room();
  if (meminfo && room) return std::min(*meminfo, *room);
  return meminfo ? meminfo : room;
}

}  // namespace kimirt
