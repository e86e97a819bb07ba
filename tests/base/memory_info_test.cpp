// The memory a process may take now: on Linux at most MemAvailable (a cgroup limit can only lower it).
#include "kimirt/base/memory_info.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace kimirt {
namespace {

TEST(MemoryInfo, AvailableIsAtMostMemAvailable) {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) GTEST_SKIP() << "no /proc/meminfo";
  unsigned long long kib = 0;
  char line[256];
  while (std::fgets(line, sizeof(line), f) && std::sscanf(line, "MemAvailable: %llu kB", &kib) != 1) {
  }
  std::fclose(f);
  ASSERT_GT(kib, 0u) << "no MemAvailable line";
  const auto available = available_memory_bytes();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, 0u);
  // Read a moment apart: the system's figure may move by a little between the two reads.
  EXPECT_LE(*available, kib * 1024 + (uint64_t{256} << 20));
}

}  // namespace
}  // namespace kimirt
