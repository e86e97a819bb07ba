// The numeric flags of `run` and `chat` are checked before anything large is loaded or allocated: -n and
// --context past the model's positions, and --threads past any machine, are refused naming the flag; a
// thread count the system cannot start is an error, not a hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/limited_child.h"
#include "common/run_command.h"

namespace {

using kimirt::test::run_command;
using ::testing::HasSubstr;

std::string kimirt() { return kimirt::test::kimirt_binary(); }
std::string golden(const std::string& name) { return kimirt::test::golden_dir(name); }

// The smallest `ulimit -v` (KiB) under which `kimirt version` starts and exits, to 32 MiB. A CPU build needs
// little; a CUDA build maps its libraries (cuBLASLt alone is hundreds of MiB) before main, so the limits of
// the tests below are this baseline plus what they mean to allow. 0 when even 16 GiB does not suffice.
// The probe has a timeout because just below the threshold the process does not fail, it hangs: an
// OpenBLAS worker thread retries its 128 MiB buffer mmap forever and exit joins that thread.
uint64_t startup_address_space_kib() {
  static const uint64_t kib = [] {
    const auto starts = [](uint64_t limit) {
      return run_command("ulimit -v " + std::to_string(limit) + "; timeout -s KILL 10 " + kimirt() + " version")
                 .exit_code == 0;
    };
    uint64_t lo = 16 << 10, hi = 16 << 20;  // lo fails (or is the floor), hi must start
    if (!starts(hi)) return uint64_t{0};
    if (starts(lo)) return lo;
    while (hi - lo > (32 << 10)) {
      const uint64_t mid = lo + (hi - lo) / 2;
      (starts(mid) ? hi : lo) = mid;
    }
    return hi;
  }();
  return kib;
}

// "ulimit -v B+extra; " with B the baseline above.
std::string address_space_limit(uint64_t extra_kib) {
  return "ulimit -v " + std::to_string(startup_address_space_kib() + extra_kib) + "; ";
}

TEST(NumericFlags, MaxTokensPastTheModelsPositionsIsRefused) {
  // k3-tiny has max_position_embeddings 1048576; a cache for 2000002 positions was zero-filled before. A request
  // needs prompt + n - 1 positions (the last token is never fed back): 3 + 1048574 - 1 fits exactly, one more
  // token does not.
  const auto r = run_command(kimirt() + " run -m " + golden("k3-tiny") + " --ids 1,2,3 -n 2000000");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("-n 2000000 (with a prompt of 3 tokens): 2000002 positions, more than the "
                                  "model's 1048576 (max_position_embeddings)"));
  const auto one_past = run_command(kimirt() + " run -m " + golden("k3-tiny") + " --ids 1,2,3 -n 1048575");
  EXPECT_EQ(one_past.exit_code, 1) << one_past.output;
  EXPECT_THAT(one_past.output, HasSubstr("-n 1048575 (with a prompt of 3 tokens): 1048577 positions, more than the "
                                         "model's 1048576 (max_position_embeddings)"));
  // Past int: refused by the flag parser, not wrapped around.
  const auto wrapped = run_command(kimirt() + " run -m " + golden("k3-tiny") + " --ids 1 -n 99999999999");
  EXPECT_NE(wrapped.exit_code, 0) << wrapped.output;
  EXPECT_THAT(wrapped.output, HasSubstr("--max-tokens"));
}

// Counts that must be positive are whole decimal numbers in their type's range, refused naming the flag and the
// range: CLI11's own checks let 99999999999999999999 saturate to 2^63 - 1 and read 0x10 as 16, and said "Value 0
// not in range 0.000000 to 1797...".
TEST(NumericFlags, CountsAreWholeDecimalNumbersInRange) {
  const std::string model = " -m " + golden("k3-tiny");
  const std::pair<std::string, std::string> bad[] = {
      {" run" + model + " --ids 1 --prefill-chunk 99999999999999999999", "--prefill-chunk"},
      {" run" + model + " --ids 1 --prefill-chunk 0", "--prefill-chunk"},
      {" run" + model + " --ids 1 --threads 0x10", "--threads"},
      {" run" + model + " --ids 1 --tp 0", "--tp"},
      {" run" + model + " --ids 1 --ep 3000000000", "--ep"},
      {" chat" + model + " --context 99999999999999999999 < /dev/null", "--context"},
      {" chat" + model + " --threads 0 < /dev/null", "--threads"},
      {" make-tiny /nonexistent/kimirt-x --hidden 0", "--hidden"},
  };
  for (const auto& [command, flag] : bad) {
    const auto r = run_command(kimirt() + command);
    EXPECT_NE(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(flag + ": must be a whole number in [")) << command;
  }
}

TEST(NumericFlags, ContextPastTheModelsPositionsIsRefused) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kimirt-numeric-flags-model";
  std::filesystem::remove_all(dir);
  const auto made = run_command(kimirt() + " make-tiny " + dir.string());  // with the built-in tokenizer
  ASSERT_EQ(made.exit_code, 0) << made.output;
  for (const std::string context : {"99999999999", "9223372036854775807"}) {
    const auto r =
        run_command("printf 'hi\\n' | " + kimirt() + " chat -m " + dir.string() + " --threads 1 --context " + context);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr("--context " + context + ": " + context +
                                    " positions, more than the model's 1048576 (max_position_embeddings)"));
  }
  std::filesystem::remove_all(dir);
}

TEST(NumericFlags, ThreadsPastAnyMachineAreRefused) {
  for (const std::string& cmd : {" run -m " + golden("kl-tiny") + " --ids 1 -n 1", " chat -m " + golden("kl-tiny")}) {
    const auto r = run_command(kimirt() + cmd + " --threads 100000");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("--threads")) << cmd;
  }
}

// A cache within the model's positions that memory cannot hold: an Error naming -n, not a bare bad_alloc.
TEST(NumericFlags, ACacheThatDoesNotFitInMemoryNamesTheFlag) {
  if (!kimirt::test::kAddressSpaceLimitWorks) GTEST_SKIP() << "sanitizer build: no address-space limit";
  ASSERT_NE(startup_address_space_kib(), 0u) << "kimirt version does not start under 16 GiB";
  const auto r = run_command(address_space_limit(300000) + "timeout 60 " + kimirt() + " run -m " + golden("k3-tiny") +
                             " --ids 1 -n 1000000 --threads 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // 1 + 1000000 - 1 positions (the last token is never fed back): 15625 blocks of 64 exactly.
  EXPECT_THAT(r.output, HasSubstr("-n 1000000 (with a prompt of 1 tokens): the model's weights and a cache of "
                                  "1000000 positions do not fit in memory"));
}

// The reviewer's case: under `ulimit -v 1500000` a thousand threads cannot all start; this hung before. The
// limit leaves 1.4 GB above what the binary needs to start: room for some threads' 8 MiB stacks, not 1000.
TEST(NumericFlags, ThreadsTheSystemCannotStartAreAnErrorNotAHang) {
  if (!kimirt::test::kAddressSpaceLimitWorks) GTEST_SKIP() << "sanitizer build: no address-space limit";
  ASSERT_NE(startup_address_space_kib(), 0u) << "kimirt version does not start under 16 GiB";
  const auto r = run_command(address_space_limit(1400000) + "timeout 60 " + kimirt() + " run -m " + golden("kl-tiny") +
                             " --ids 1 -n 1 --threads 1000");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("a thread pool of 1000 threads: only "));
}

}  // namespace

namespace {

// make-tiny's sizes become 64-bit byte counts: values past that are refused by the flag parser (2e10 GiB was
// converted to 0 and wrote the smallest checkpoint, exit 0); the two tokenizer flags exclude each other.
TEST(NumericFlags, MakeTinySizesAndTokenizerFlagsAreChecked) {
  const std::string out = (std::filesystem::temp_directory_path() / "kimirt-make-tiny-flags").string();
  // --size-gb sets the expert count: an --experts beside it had been ignored.
  // NaN passed CLI11's range check and became the defaults; a negative seed wrapped to 2^64 - 1.
  for (const char* bad : {"--size-gb 2e10", "--size-gb 0", "--shard-mb 1e30", "--no-tokenizer --tokenizer-from /tmp",
                          "--experts 64 --size-gb 0.001", "--shard-mb nan", "--size-gb nan", "--seed -1",
                          "--seed 18446744073709551616"}) {
    const auto r = run_command(kimirt() + " make-tiny " + out + " " + bad);
    EXPECT_NE(r.exit_code, 0) << bad << ": " << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << bad << " wrote a checkpoint";
    std::filesystem::remove_all(out);
  }
}

// A checkpoint larger than the disk's free space is refused before a byte is written (a vocabulary of 2^31 - 1,
// about a terabyte, had started writing and filled the disk).
TEST(NumericFlags, MakeTinyLargerThanTheFreeDiskIsRefused) {
  const auto tmp = std::filesystem::temp_directory_path();
  // The largest vocabulary make-tiny takes makes about 2 TiB of tensors: a disk with more free cannot show it.
  if (std::filesystem::space(tmp).available > (uint64_t{3} << 40)) GTEST_SKIP() << "more than 3 TiB free here";
  const std::string out = (tmp / "kimirt-make-tiny-too-large").string();
  std::filesystem::remove_all(out);
  // Also with a trailing slash and a parent folder that does not exist yet (measured on the nearest that does).
  for (const std::string& path : {out, out + "/", out + "/nested/more/"}) {
    const auto r = run_command(kimirt() + " make-tiny " + path + " --vocab 2147483647 --no-tokenizer");
    EXPECT_EQ(r.exit_code, 1) << path << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("the checkpoint's tensors take")) << path;
    EXPECT_FALSE(std::filesystem::exists(out)) << path << " wrote a checkpoint";
    std::filesystem::remove_all(out);
  }
}

// --tokenizer-from gives the model its tokenizer's vocabulary (a Kimi Linear model kept its default 512 beside a
// tokenizer of another size: run then printed ids and chat refused); a --vocab that differs is refused.
TEST(NumericFlags, MakeTinyTakesTheVocabularyOfItsTokenizer) {
  const auto tmp = std::filesystem::temp_directory_path();
  const std::string k3 = (tmp / "kimirt-make-tiny-vocab-k3").string(),
                    kl = (tmp / "kimirt-make-tiny-vocab-kl").string();
  std::filesystem::remove_all(k3);
  std::filesystem::remove_all(kl);
  ASSERT_EQ(run_command(kimirt() + " make-tiny " + k3).exit_code, 0);  // the built-in tokenizer
  const auto bad =
      run_command(kimirt() + " make-tiny " + kl + " --family kimi-linear --vocab 512 --tokenizer-from " + k3);
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--vocab 512: the tokenizer of --tokenizer-from " + k3 + " has"));
  EXPECT_FALSE(std::filesystem::exists(kl));
  const auto good = run_command(kimirt() + " make-tiny " + kl + " --family kimi-linear --tokenizer-from " + k3);
  ASSERT_EQ(good.exit_code, 0) << good.output;
  const auto r = run_command(kimirt() + " run -m " + kl + " -p 'hello' -n 2 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, testing::Not(HasSubstr("printing ids"))) << r.output;
  std::filesystem::remove_all(k3);
  std::filesystem::remove_all(kl);
}

}  // namespace
