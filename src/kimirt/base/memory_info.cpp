#include "kimirt/base/memory_info.h"

#include <cstdio>

namespace kimirt {

std::optional<uint64_t> available_memory_bytes() {
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

}  // namespace kimirt
