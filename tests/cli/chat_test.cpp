// `kimirt chat` driven through its standard input: replies stream after each prompt, /reset and /system
// are taken, /quit ends with exit code 0; a model without a tokenizer is refused clearly.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "common/run_command.h"

namespace {

namespace fs = std::filesystem;

kimirt::test::CommandResult run_shell(const std::string& cmd) { return kimirt::test::run_command(cmd); }

const std::string kKimirt = kimirt::test::kimirt_binary();

TEST(Chat, ConversationCommandsAndQuit) {
  const fs::path dir = fs::temp_directory_path() / "kimirt-chat-test-model";
  fs::remove_all(dir);
  // A tiny K3 with the built-in tokenizer (make-tiny's default).
  auto made = run_shell(kKimirt + " make-tiny " + dir.string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto r = run_shell("printf 'hello there\\n/system be brief\\nand again\\n/reset\\n/bogus\\nhi\\n/quit\\n' | " +
                           kKimirt + " chat -m " + dir.string() + " -n 6 --seed 3 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(system message set)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(conversation cleared)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(commands: /reset, /system TEXT, /quit)"), std::string::npos) << r.output;
  // Three user turns, each followed by the next prompt marker.
  size_t prompts = 0;
  for (size_t p = r.output.find("> "); p != std::string::npos; p = r.output.find("> ", p + 2)) ++prompts;
  EXPECT_GE(prompts, 7u) << r.output;
  fs::remove_all(dir);
}

// A request the engine refuses costs the line, not the session: the error is shown and chat goes on.
TEST(Chat, ARefusedRequestLosesTheLineNotTheConversation) {
  const fs::path dir = fs::temp_directory_path() / "kimirt-chat-refused-model";
  fs::remove_all(dir);
  auto made = run_shell(kKimirt + " make-tiny " + dir.string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto r = run_shell("printf 'hello\\nagain\\n/quit\\n' | " + kKimirt + " chat -m " + dir.string() +
                           " -n 4 --temperature -1 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  size_t refused = 0;
  for (size_t p = r.output.find("(request: temperature must be >= 0, got -1)"); p != std::string::npos;
       p = r.output.find("(request: temperature", p + 1)) {
    ++refused;
  }
  EXPECT_EQ(refused, 2u) << r.output;
  fs::remove_all(dir);
}

TEST(Chat, RefusesAModelWithoutTokenizer) {
  const auto r = run_shell("printf 'hi\\n' | " + kKimirt + " chat -m " + kimirt::test::golden_dir("k3-tiny"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tokenizer"), std::string::npos) << r.output;
}

}  // namespace
