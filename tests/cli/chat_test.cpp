// `kimirt chat` driven through its standard input: replies stream after each prompt, /reset and /system
// are taken, /quit ends with exit code 0; a model without a tokenizer is refused clearly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/run_command.h"

namespace {

namespace fs = std::filesystem;

kimirt::test::CommandResult run_shell(const std::string& cmd) { return kimirt::test::run_command(cmd); }

const std::string kKimirt = kimirt::test::kimirt_binary();

// A tiny K3 with the built-in tokenizer (make-tiny's default) in a scratch directory of its own, removed at the end.
class TinyK3 {
 public:
  explicit TinyK3(const std::string& name) : dir_(fs::temp_directory_path() / name) {
    fs::remove_all(dir_);
    made_ = run_shell(kKimirt + " make-tiny " + dir_.string());
  }
  ~TinyK3() { fs::remove_all(dir_); }
  TinyK3(const TinyK3&) = delete;
  TinyK3& operator=(const TinyK3&) = delete;
  const fs::path& dir() const { return dir_; }
  // For ASSERT_EQ(made.exit_code, 0) << made.output.
  const kimirt::test::CommandResult& made() const { return made_; }

 private:
  fs::path dir_;
  kimirt::test::CommandResult made_;
};

TEST(Chat, ConversationCommandsAndQuit) {
  const TinyK3 model("kimirt-chat-test-model");
  ASSERT_EQ(model.made().exit_code, 0) << model.made().output;
  const fs::path& dir = model.dir();
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
}

// stdout holds the replies alone, so that `chat < in > out` keeps them apart from chat's notes and prompts, which go
// to stderr.
TEST(Chat, StdoutHoldsTheRepliesAlone) {
  const TinyK3 model("kimirt-chat-stdout-model");
  ASSERT_EQ(model.made().exit_code, 0) << model.made().output;
  const std::string cmd = "printf 'hello there\\n/system be brief\\n/bogus\\nhi\\n/reset\\n/quit\\n' | " + kKimirt +
                          " chat -m " + model.dir().string() + " -n 6 --seed 3 --threads 1";
  const auto both = run_shell(cmd);
  const auto out = kimirt::test::run_command(cmd, /*with_stderr=*/false);
  ASSERT_EQ(out.exit_code, 0) << both.output;
  for (const char* note : {"(system message set)", "(commands: /reset", "(conversation cleared)",
                           "(the system message stays", "ready in"}) {
    EXPECT_NE(both.output.find(note), std::string::npos) << note << " in:\n" << both.output;
    EXPECT_EQ(out.output.find(note), std::string::npos) << note << " in stdout:\n" << out.output;
  }
  // The two replies (6 tokens each) and a newline after each; no prompt before the first.
  EXPECT_NE(out.output.rfind("> ", 0), 0u) << out.output;
  EXPECT_FALSE(out.output.empty());
  EXPECT_GE(std::count(out.output.begin(), out.output.end(), '\n'), 2) << out.output;
}

// Sampling flags the engine would refuse are refused when parsed, naming the flag, before a model loads (they
// used to be refused line by line, the session going on and ending with exit 0). run takes the same flags.
TEST(Chat, BadSamplingFlagsAreRefusedNamingTheFlag) {
  const std::pair<const char*, const char*> bad[] = {
      {"--temperature", "-1"},
      {"--temperature", "nan"},
      {"--top-p", "0"},
      {"--min-p", "2"},
      {"--repetition-penalty", "0"},
      {"--presence-penalty", "3"},
      {"--stop", "''"},
      {"--stop-id", "-5"},
      // Values that pass as a double but are 0 as the float they are stored in.
      {"--top-p", "1e-46"},
      {"--repetition-penalty", "1e-46"},
      // Whole numbers in decimal only: CLI11 alone wrapped -1 into the unsigned seed and read 0x10 as 16.
      {"--seed", "-1"},
      {"--seed", "99999999999999999999"},
      {"--top-k", "0x10"},
      {"--max-tokens", "-3"}};
  for (const auto& [flag, value] : bad) {
    for (const char* command : {" chat", " run"}) {
      const auto r =
          run_shell("printf 'hello\\n/quit\\n' | " + kKimirt + command + " -m /nonexistent " + flag + " " + value);
      EXPECT_NE(r.exit_code, 0) << command << " " << flag << " " << value << ": " << r.output;
      EXPECT_NE(r.output.find(flag), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("/nonexistent"), std::string::npos) << "refused before the model: " << r.output;
    }
  }
}

// Text that is not UTF-8, refused naming the flag: a stop string could never match (it was taken), a prompt was
// refused by the tokenizer after the load, naming no flag.
TEST(Chat, TextFlagsThatAreNotUtf8AreRefused) {
  for (const std::string command :
       {" run -m /nonexistent --ids 1 --stop \"$(printf 'a\\377')\"", " run -m /nonexistent -p \"$(printf 'a\\377')\"",
        " chat -m /nonexistent --stop \"$(printf '\\377')\" < /dev/null"}) {
    const auto r = run_shell(kKimirt + command);
    EXPECT_NE(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_NE(r.output.find("is not valid UTF-8"), std::string::npos) << command << ": " << r.output;
    EXPECT_EQ(r.output.find("/nonexistent"), std::string::npos) << "refused before the model: " << r.output;
  }
}

// run's text flags given as "" are refused, not read as "not given" (an empty -p used to generate from a
// built-in prompt).
TEST(Chat, EmptyTextFlagsOfRunAreRefused) {
  for (const char* flag : {"-p", "--ids", "--dump-logits"}) {
    const auto r = run_shell(kKimirt + " run -m /nonexistent " + flag + " ''");
    EXPECT_NE(r.exit_code, 0) << flag << ": " << r.output;
    EXPECT_NE(r.output.find("must not be empty"), std::string::npos) << flag << ": " << r.output;
  }
  // -m "" (an unset variable, say) ran the random default model instead, or read the current directory.
  for (const std::string command : {" run --ids 1", " chat", " tokenize"}) {
    const auto r = run_shell("printf 'hi\\n' | " + kKimirt + command + " -m ''");
    EXPECT_NE(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_NE(r.output.find("must not be empty"), std::string::npos) << command << ": " << r.output;
  }
}

// Token ids the model has no row for: refused naming their flag, before the model is loaded (--ids was refused
// only after the load; a --stop-id past the vocabulary was taken and could never stop anything).
TEST(Chat, IdsOutsideTheVocabularyAreRefusedNamingTheFlag) {
  const std::string model = kimirt::test::golden_dir("k3-tiny");  // vocabulary 1024
  auto r = run_shell(kKimirt + " run -m " + model + " --ids 1,99999");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--ids: id 99999 is outside the model's vocabulary [0, 1024)"), std::string::npos)
      << r.output;
  for (const std::string& command :
       {" run -m " + model + " --ids 1 --stop-id 999999", " chat -m " + model + " --stop-id 999999 < /dev/null"}) {
    r = run_shell(kKimirt + command);
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.output;
    EXPECT_NE(r.output.find("--stop-id 999999: outside the model's vocabulary [0, 1024)"), std::string::npos)
        << command << ": " << r.output;
  }
}

// --dump-logits /dev/stdout with the output redirected to a file: the logits go after the printed text, through
// the descriptor, and the file stays the file (a temp file renamed over the path /dev/stdout resolves to had
// replaced it, the text printed before lost).
TEST(Chat, DumpLogitsToStandardOutputFollowsThePrintedText) {
  const fs::path out = fs::temp_directory_path() / "kimirt-dump-stdout.bin";
  fs::remove(out);
  const auto r = run_shell(kKimirt + " run -m " + kimirt::test::golden_dir("k3-tiny") +
                           " --ids 1,2 -n 2 --print-ids --dump-logits /dev/stdout > " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The printed ids, then the safetensors file: its 8-byte header length and its JSON header.
  const size_t header = bytes.find("{\"");
  ASSERT_NE(header, std::string::npos) << "no safetensors header in the output";
  ASSERT_GE(header, 8u);
  EXPECT_GT(header, 8u) << "the printed ids were lost";
  EXPECT_NE(bytes.find("prompt_logits", header), std::string::npos);
  EXPECT_NE(bytes.find("step_logits", header), std::string::npos);
  fs::remove(out);
}

// --dump-logits naming an existing directory: refused before the load (it failed at the end, on the rename).
TEST(Chat, DumpLogitsIntoADirectoryIsRefusedFirst) {
  const auto r = run_shell(kKimirt + " run -m /nonexistent-model --dump-logits " + fs::temp_directory_path().string());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("is a directory; give the file to write"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("/nonexistent-model"), std::string::npos) << "refused before the model: " << r.output;
}

// Output that cannot be written (a full disk) is an error, not exit 0 with nothing written.
// The help too (it exited 0); the reason is the failed flush's, not a stale errno ("failed: Success").
TEST(Chat, OutputThatCannotBeWrittenIsAnError) {
  for (const std::string& command :
       {" inspect --json " + kimirt::test::golden_dir("k3-tiny"), std::string(" --help")}) {
    const auto r = run_shell("( " + kKimirt + command + " > /dev/full )");
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.output;
    EXPECT_NE(r.output.find("writing to standard output failed"), std::string::npos) << command << ": " << r.output;
    EXPECT_EQ(r.output.find("Success"), std::string::npos) << command << ": " << r.output;
  }
}

// A first word that names no command is named back, with the commands there are.
// Usage errors (an unknown command or flag, a value out of range) exit with 2, the usual status of a usage error
// (CLI11's own were 105 to 115, one per kind), apart from 1, an error while running; their messages carry
// "kimirt: error:" as every other error's does, and point to the command's help.
TEST(Chat, UsageErrorsExitTwoAndAnUnknownCommandIsNamed) {
  auto r = run_shell(kKimirt + " run --temperature -1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("kimirt: error: --temperature: must be a number in [0, inf), got -1\nRun kimirt run --help"),
            std::string::npos)
      << r.output;
  r = run_shell(kKimirt + " run --bogus");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_shell(kKimirt);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_shell(kKimirt + " run -m /nonexistent --ids 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  r = run_shell(kKimirt + " bogus");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown command 'bogus' (commands: "), std::string::npos) << r.output;
  for (const char* name : {"inspect", "run", "chat", "make-tiny"}) {
    EXPECT_NE(r.output.find(name), std::string::npos) << name << ": " << r.output;
  }
}

// --dump-logits into a directory that does not exist: refused before the model is loaded (it failed only at
// the end, after the generation).
TEST(Chat, DumpLogitsDirectoryIsCheckedFirst) {
  const auto r = run_shell(kKimirt + " run -m /nonexistent-model --dump-logits /nonexistent-dir/x.safetensors");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--dump-logits /nonexistent-dir/x.safetensors: /nonexistent-dir is not a directory"),
            std::string::npos)
      << r.output;
}

// chat: -n must leave room for the conversation in --context, and --system must be text it can encode; both
// refused before anything is loaded (every line used to be refused instead).
TEST(Chat, ContextAndSystemFlagsAreCheckedAtStart) {
  const TinyK3 model("kimirt-chat-flags-model");
  ASSERT_EQ(model.made().exit_code, 0) << model.made().output;
  const fs::path& dir = model.dir();
  auto r = run_shell("printf 'hello\\n' | " + kKimirt + " chat -m " + dir.string() + " --context 200 -n 256");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("-n 256 leaves no room in --context 200"), std::string::npos) << r.output;
  // Room for -n but not for the markup of one turn beside it (a long --system, here): every line was refused.
  r = run_shell("printf 'hello\\n' | " + kKimirt + " chat -m " + dir.string() + " --context 40 -n 30 --system \"" +
                std::string(200, 'a') + "\"");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--context 40 cannot hold one turn"), std::string::npos) << r.output;
  r = run_shell("printf 'hello\\n' | " + kKimirt + " chat -m " + dir.string() + " --system \"$(printf '\\377')\"");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--system: text to encode is not valid UTF-8"), std::string::npos) << r.output;
}

// --thinking on a Kimi Linear model, whose template has no thinking channel: refused at start (it was ignored).
TEST(Chat, ThinkingOnKimiLinearIsRefused) {
  const fs::path k3 = fs::temp_directory_path() / "kimirt-chat-thinking-k3";
  const fs::path kl = fs::temp_directory_path() / "kimirt-chat-thinking-kl";
  fs::remove_all(k3);
  fs::remove_all(kl);
  auto made = run_shell(kKimirt + " make-tiny " + k3.string());  // the built-in tokenizer: 1456 ids
  ASSERT_EQ(made.exit_code, 0) << made.output;
  made = run_shell(kKimirt + " make-tiny " + kl.string() + " --family kimi-linear --tokenizer-from " + k3.string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto r = run_shell("printf 'hi\\n' | " + kKimirt + " chat -m " + kl.string() + " --thinking");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--thinking: the kimi_linear chat template has no thinking channel"), std::string::npos)
      << r.output;
  fs::remove_all(k3);
  fs::remove_all(kl);
}

// Stops that could never fire, and requests that can only do nothing, are refused before the weights load,
// naming the flag: a --stop holding a special token's text (special tokens decode to no text, so it ran on to
// -n), a --stop without a tokenizer (refused by the engine after the whole load), -n 0 without --dump-logits (the
// whole model loaded for an empty line) and -n 0 in chat (every reply empty).
TEST(Chat, StopsThatCouldNeverFireAndEmptyRepliesAreRefusedBeforeTheLoad) {
  const TinyK3 model("kimirt-chat-stop-test-model");
  ASSERT_EQ(model.made().exit_code, 0) << model.made().output;
  const std::string with_tokenizer = " -m " + model.dir().string();
  for (const std::string& command : {" run" + with_tokenizer + " -p hi --stop 'x[EOS]'",
                                     " chat" + with_tokenizer + " --stop 'x[EOS]' < /dev/null"}) {
    const auto r = run_shell(kKimirt + command);
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.output;
    EXPECT_NE(r.output.find("--stop: stop string \"x[EOS]\" holds the special token [EOS]"), std::string::npos)
        << command << ": " << r.output;
    EXPECT_EQ(r.output.find("ready in"), std::string::npos) << command << ": " << r.output;
  }
  // Exactly a special token's text: a stop on its id, taken.
  auto r = run_shell(kKimirt + " run" + with_tokenizer + " -p hi -n 2 --stop '[EOS]' --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_shell(kKimirt + " run -m " + kimirt::test::golden_dir("k3-tiny") + " --ids 1 --stop x");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--stop needs a tokenizer"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ready in"), std::string::npos) << r.output;
  r = run_shell(kKimirt + " run" + with_tokenizer + " -p hi -n 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("-n 0 generates nothing"), std::string::npos) << r.output;
  r = run_shell("printf 'hi\\n' | " + kKimirt + " chat" + with_tokenizer + " -n 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("-n 0: every reply would be empty"), std::string::npos) << r.output;
}

// Ctrl-C while a reply streams ends that reply, not the session (it killed the process, the conversation lost):
// the next line is read and /quit ends with exit code 0. (A job the shell starts in the background has SIGINT
// ignored, which chat keeps: env --default-signal gives it the terminal's.) Greedy, so the reply is the same every run,
// and long: the signal comes once 600 bytes of it are out, well before -n.
TEST(Chat, InterruptEndsTheReplyNotTheSession) {
  const TinyK3 model("kimirt-chat-interrupt-test");
  ASSERT_EQ(model.made().exit_code, 0) << model.made().output;
  const std::string d = model.dir().string();  // its fifo and output beside it: d.in, d.out
  fs::remove(d + ".in");
  const auto r =
      run_shell("mkfifo " + d + ".in && (env --default-signal=INT " + kKimirt + " chat -m " + d +
                " -n 8000 --temperature 0 --threads 1 < " + d + ".in > " + d + ".out 2>&1 & pid=$!; exec 3>" + d +
                ".in; echo hi >&3; for i in $(seq 400); do [ $(wc -c < " + d +
                ".out) -gt 600 ] && break; sleep 0.05; done; kill -INT $pid; sleep 0.3; echo /quit >&3; "
                "wait $pid; echo \"exit $?\"); cat " +
                d + ".out");
  EXPECT_NE(r.output.find("exit 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(reply interrupted)\n> "), std::string::npos) << r.output;
  fs::remove(d + ".in");
  fs::remove(d + ".out");
}

// /system alone clears the system message (it printed the command list); a message too long to leave room for a
// turn and a reply is refused when set, not line by line afterwards; /reset keeps the message /system set (it
// brought back --system's without a word).
TEST(Chat, SystemCommandsClearAreCheckedAndSurviveReset) {
  const TinyK3 model("kimirt-chat-system-test-model");
  ASSERT_EQ(model.made().exit_code, 0) << model.made().output;
  const fs::path& dir = model.dir();
  std::string long_text;
  for (int i = 0; i < 60; ++i) long_text += " word";
  const auto r = run_shell("printf '/system" + long_text + "\\n/system be brief\\n/reset\\n/system\\n/quit\\n' | " +
                           kKimirt + " chat -m " + dir.string() + " --context 128 -n 8 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(/system: with this message one turn takes "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("past --context 128; the system message is unchanged)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(system message set)\n> (conversation cleared)\n(the system message stays; /system alone "
                          "clears it)\n> (system message cleared)"),
            std::string::npos)
      << r.output;
}

TEST(Chat, RefusesAModelWithoutTokenizer) {
  const auto r = run_shell("printf 'hi\\n' | " + kKimirt + " chat -m " + kimirt::test::golden_dir("k3-tiny"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tokenizer"), std::string::npos) << r.output;
}

}  // namespace
