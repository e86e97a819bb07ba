// What memory this machine can give a process now, so that a large allocation can be refused with its size
// before it is made: under Linux's overcommit an allocation larger than what is free may succeed, and the
// kernel then ends the process (SIGKILL, no message) when the pages are first touched.
#pragma once

#include <cstdint>
#include <optional>

namespace kimirt {

// The least of MemAvailable of /proc/meminfo (free memory plus what the kernel can reclaim without swapping)
// and the room under this process's memory cgroup limit (v2 memory.max, v1 memory.limit_in_bytes, less
// what the group uses): in a container /proc/meminfo shows the host's memory. In bytes; nullopt where the
// system says neither. One figure for the whole process: callers that allocate side by side (the ranks of a
// group run in one process) each see all of it unless they check and touch their memory one at a time
// (CpuCacheStore does).
std::optional<uint64_t> available_memory_bytes();

}  // namespace kimirt
