// What memory this machine can give a process now, so that a large allocation can be refused with its size
// before it is made: under Linux's overcommit an allocation larger than what is free may succeed, and the
// kernel then ends the process (SIGKILL, no message) when the pages are first touched.
#pragma once

#include <cstdint>
#include <optional>

namespace kimirt {

// MemAvailable of /proc/meminfo (free memory plus what the kernel can reclaim without swapping), in bytes;
// nullopt where the system does not say.
std::optional<uint64_t> available_memory_bytes();

}  // namespace kimirt
