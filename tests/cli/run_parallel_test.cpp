// `kimirt run` on several ranks end to end: --tp N (threads of one process, LocalComm) and mpirun -np N (one
// process per rank, MpiComm) print the same greedy ids as one rank, with MoE-TP, EP, the all-to-all MoE path
// and attention-DP; what cannot run is refused with a message that says why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/run_command.h"

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Result = kimirt::test::CommandResult;
using kimirt::test::run_command;

Result run(const std::string& command, bool with_stderr) { return run_command(command, with_stderr); }
std::string kimirt() { return kimirt::test::kimirt_binary(); }
std::string golden(const std::string& name) { return kimirt::test::golden_dir(name); }

// The ids `kimirt run` prints (stdout) for a fixed prompt, greedy.
std::string ids(const std::string& model, const std::string& flags, const std::string& launcher = "") {
  const std::string cmd =
      launcher + kimirt() + " run -m " + golden(model) + " --ids 5,17,3,200,41,9 -n 10 --print-ids " + flags;
  const Result r = run(cmd, false);
  if (r.exit_code != 0) ADD_FAILURE() << cmd << " failed: " << run(cmd, true).output;
  return r.output;
}

TEST(RunParallel, ThreadRanksPrintTheIdsOfOneRank) {
  const std::string one = ids("kl-tiny", "--tp 1");
  ASSERT_EQ(std::count(one.begin(), one.end(), ' '), 10) << one;  // ten ids, each followed by a space
  EXPECT_EQ(ids("kl-tiny", "--tp 4 --device cpu"), one);
  EXPECT_EQ(ids("kl-tiny", "--tp 4 --ep 2"), one);
  EXPECT_EQ(ids("kl-tiny", "--tp 4 --ep 4 --moe-comm all_to_all"), one);
  EXPECT_EQ(ids("kl-tiny", "--tp 2 --ep 2 --attention-dp"), one);
  // All-to-all asked for beside attention-DP, in either spelling parse_moe_comm takes.
  EXPECT_EQ(ids("kl-tiny", "--tp 2 --ep 2 --attention-dp --moe-comm all-to-all"), one);
  const std::string k3 = ids("k3-tiny", "");
  EXPECT_EQ(ids("k3-tiny", "--tp 4 --ep 2"), k3);
  EXPECT_EQ(ids("k3-tiny", "--tp 4 --ep 4 --attention-dp"), k3);
}

// The backend takes each weight's format from what the checkpoint stores, not from config.json: BF16 experts
// under a declared MXFP4 quantization_config load, and run under MoE-TP (four cuts of 64 rows, which MXFP4's
// groups of 32 would not allow) exactly as on one rank.
TEST(RunParallel, StoredExpertFormatWinsOverTheDeclaredOneUnderMoeTp) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kimirt-run-bf16-declared-mxfp4";
  std::filesystem::remove_all(dir);
  const Result made = run(kimirt() + " make-tiny " + dir.string() + " --experts-format bf16 --no-tokenizer", true);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  ASSERT_FALSE(config["text_config"].contains("quantization_config"));
  const auto golden_config = nlohmann::json::parse(std::ifstream(golden("k3-tiny") + "/config.json"));
  config["text_config"]["quantization_config"] = golden_config["text_config"]["quantization_config"];
  std::ofstream(dir / "config.json") << config.dump(2);
  auto ids_of = [&](const std::string& flags) {
    const std::string cmd = kimirt() + " run -m " + dir.string() + " --ids 5,17,3,200,41,9 -n 6 --print-ids " + flags;
    const Result r = run(cmd, false);
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << run(cmd, true).output;
    return r.output;
  };
  const std::string one = ids_of("--tp 1");
  EXPECT_EQ(std::count(one.begin(), one.end(), ' '), 6) << one;
  EXPECT_EQ(ids_of("--tp 4"), one);
  EXPECT_EQ(ids_of("--tp 4 --ep 2"), one);
  std::filesystem::remove_all(dir);
}

TEST(RunParallel, MpirunProcessesPrintTheIdsOfOneRank) {
#ifndef KIMIRT_MPIEXEC
  GTEST_SKIP() << "no MPI launcher in this build";
#else
  if (!std::filesystem::exists(KIMIRT_MPIEXEC)) GTEST_SKIP() << KIMIRT_MPIEXEC << " is absent";
  // The -x variables only matter in ASan builds (OpenMPI's allocations live until exit: tests/lsan.supp).
  const std::string mpirun = std::string(KIMIRT_MPIEXEC) +
                             " --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=fast_unwind_on_malloc=0"
                             " -x LSAN_OPTIONS=suppressions=" KIMIRT_LSAN_SUPPRESSIONS " -np 2 ";
  const std::string one = ids("kl-tiny", "");
  EXPECT_EQ(ids("kl-tiny", "", mpirun), one) << "every process is one rank, only rank 0 prints";
  EXPECT_EQ(ids("kl-tiny", "--tp 2 --ep 2 --attention-dp", mpirun), one);
  const Result mismatch = run(mpirun + kimirt() + " run -m " + golden("kl-tiny") + " --ids 1 --tp 4", true);
  EXPECT_NE(mismatch.exit_code, 0);
  EXPECT_THAT(mismatch.output, HasSubstr("--tp 4: under mpirun every process is one rank, and mpirun started 2"));
#endif
}

TEST(RunParallel, WhatCannotRunIsRefusedWithTheReason) {
  auto refused = [](const std::string& model, const std::string& flags) {
    const Result r = run(kimirt() + " run -m " + golden(model) + " --ids 1 -n 2 " + flags, true);
    EXPECT_EQ(r.exit_code, 1) << flags << ": " << r.output;
    return r.output;
  };
  EXPECT_THAT(refused("kl-tiny", "--device cuda"), AllOf(HasSubstr("--device cuda"), HasSubstr("not implemented yet")));
  EXPECT_THAT(refused("kl-tiny", "--tp 3"), HasSubstr("does not divide the KDA heads (4)"));
  EXPECT_THAT(refused("kl-tiny", "--tp 4 --ep 2 --attention-dp"), HasSubstr("use --ep 4"));
  EXPECT_THAT(refused("kl-tiny", "--tp 2 --moe-comm all_to_all"), HasSubstr("--moe-comm all_to_all"));
  // Attention-DP exchanges tokens all-to-all: a direct MoE asked for beside it is refused, not replaced.
  EXPECT_THAT(refused("k3-tiny", "--tp 2 --ep 2 --attention-dp --moe-comm direct"),
              HasSubstr("--moe-comm direct: with --attention-dp"));
  // k3-tiny's MXFP4 experts are 64 wide in groups of 32: four MoE-TP slices would cut groups.
  EXPECT_THAT(refused("k3-tiny", "--tp 4"), HasSubstr("block_sparse_moe.experts."));
}

}  // namespace
