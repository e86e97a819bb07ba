// Runs a piece of a test in a forked child whose address space may grow only a little, so that the system
// refuses to start threads (each needs its stack mapped) exactly as it does under `ulimit -v`. The child
// reports through its exit code; an alarm turns a hang into a failure instead of a stuck test.
#pragma once

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace kimirt::test {

// Sanitizer runtimes reserve and map memory of their own on the way, which an address-space limit breaks.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kAddressSpaceLimitWorks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
inline constexpr bool kAddressSpaceLimitWorks = false;
#else
inline constexpr bool kAddressSpaceLimitWorks = true;
#endif
#else
inline constexpr bool kAddressSpaceLimitWorks = true;
#endif

// This process's mapped bytes (VmSize), 0 when unknown.
inline uint64_t mapped_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::sscanf(line, "VmSize: %llu kB", &kb) == 1) break;
  }
  std::fclose(f);
  return static_cast<uint64_t>(kb) * 1024;
}

// fn's return value as the child's exit code (98 when it threw); 128 + signal when it died of one (SIGALRM
// after `timeout_seconds`); -1 when the child could not be made. Thread stacks use up the headroom; the
// small allocations around them (messages, std::thread's state) come from 16 MiB of heap kept free
// beforehand, so that what fails is starting a thread, not formatting the error about it.
inline int run_in_limited_child(uint64_t headroom_bytes, const std::function<int()>& fn,
                                unsigned timeout_seconds = 60) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    alarm(timeout_seconds);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    std::free(std::malloc(16 << 20));
    const uint64_t now = mapped_bytes();
    const rlimit limit{now + headroom_bytes, now + headroom_bytes};
    if (now == 0 || setrlimit(RLIMIT_AS, &limit) != 0) _exit(99);
    int code = 98;
    try {
      code = fn();
    } catch (...) {
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace kimirt::test
