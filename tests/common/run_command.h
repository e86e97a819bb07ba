// Running the kimirt binary (or any shell command) from a test: exit code and output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kimirt::test {

struct CommandResult {
  int exit_code;       // -1 when the command did not exit normally (a crash) or could not start
  std::string output;  // stdout, or stdout and stderr together
};

inline CommandResult run_command(const std::string& command, bool with_stderr = true) {
  const std::string cmd = command + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline std::string kimirt_binary() { return std::string(KIMIRT_BINARY_DIR) + "/bin/kimirt"; }
inline std::string golden_dir(const std::string& name) { return std::string(KIMIRT_TESTDATA_DIR) + "/" + name; }

}  // namespace kimirt::test
