// Checkpoint directories: the two golden checkpoints open cleanly with the tensors the spec and the golden
// README describe; synthetic directories break the index/shard contract one way at a time; and the
// collecting validator reports every problem of a directory at once.
#include "kimirt/io/checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <set>

#include "io/io_test_util.h"
#include "kimirt/io/safetensors_writer.h"

namespace kimirt::io {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;
using Kind = CheckpointError::Kind;

const fs::path kTestdata = KIMIRT_TESTDATA_DIR;

// ---- golden checkpoints -------------------------------------------------------------------------------

TEST(Checkpoint, OpensK3Tiny) {
  const auto ckpt = Checkpoint::open(kTestdata / "k3-tiny");
  EXPECT_EQ(ckpt.shards().size(), 12u);
  EXPECT_EQ(ckpt.size(), 636u);
  ASSERT_NE(ckpt.index(), nullptr);
  EXPECT_EQ(ckpt.index()->size(), 636u);
  EXPECT_EQ(ckpt.tensor_bytes(), 6484416u);  // = metadata.total_size
  EXPECT_TRUE(ckpt.warnings().empty());
  EXPECT_EQ(ckpt.config().at("model_type"), "kimi_k3");
  EXPECT_EQ(ckpt.config().at("text_config").at("hidden_size"), 256);
  EXPECT_EQ(ckpt.shards().front().path().filename(), "model-00001-of-00012.safetensors");
  EXPECT_EQ(ckpt.shards().front().metadata().at("format"), "pt");

  auto expect = [&](const std::string& name, DType dtype, Shape shape) {
    const auto* ref = ckpt.find("language_model." + name);
    ASSERT_NE(ref, nullptr) << name;
    EXPECT_EQ(ref->info->dtype, dtype) << name;
    EXPECT_EQ(ref->info->shape, shape) << name;
  };
  expect("lm_head.weight", DType::kBF16, {1024, 256});
  expect("model.embed_tokens.weight", DType::kBF16, {1024, 256});
  // MXFP4 experts as compressed-tensors stores them: packed codes [out, in/2] and E8M0 scales [out, in/32],
  // both U8 (spec §5.5).
  expect("model.layers.1.block_sparse_moe.experts.0.w1.weight_packed", DType::kU8, {64, 64});
  expect("model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", DType::kU8, {64, 4});
  expect("model.layers.1.block_sparse_moe.experts.0.w2.weight_packed", DType::kU8, {128, 32});
  expect("model.layers.1.block_sparse_moe.gate.e_score_correction_bias", DType::kF32, {16});
  expect("model.layers.0.self_attn.A_log", DType::kF32, {32});
  expect("model.layers.0.self_attn.q_conv1d.weight", DType::kF32, {128, 1, 4});
  EXPECT_EQ(ckpt.find("lm_head.weight"), nullptr);  // every key carries the language_model. prefix

  // One expert's tensors are split across two shards (golden README).
  std::set<std::string> shards;
  for (const char* w : {"w1", "w2", "w3"}) {
    for (const char* kind : {"weight_packed", "weight_scale"}) {
      const auto& ref = ckpt.at(fmt::format("language_model.model.layers.2.block_sparse_moe.experts.8.{}.{}", w, kind));
      shards.insert(ref.shard->path().filename().string());
    }
  }
  EXPECT_EQ(shards.size(), 2u);

  // Values read independently from the file (Python struct over the raw bytes): A_log is zero-padded
  // from 4 heads to head_dim 32.
  const auto a_log = ckpt.read_tensor("language_model.model.layers.0.self_attn.A_log").to_f32();
  EXPECT_EQ(a_log[0], 1.546172857284546f);
  EXPECT_EQ(a_log[3], 2.375859022140503f);
  for (size_t i = 4; i < a_log.size(); ++i) EXPECT_EQ(a_log[i], 0.0f) << i;
  const auto bias =
      ckpt.read_tensor("language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias").to_f32();
  EXPECT_EQ(bias[0], -0.05497588589787483f);
  EXPECT_EQ(bias[2], -0.13627156615257263f);

  const auto names = ckpt.tensor_names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(names.size(), 636u);
}

TEST(Checkpoint, OpensKlTiny) {
  const auto ckpt = Checkpoint::open(kTestdata / "kl-tiny");
  EXPECT_EQ(ckpt.shards().size(), 5u);
  EXPECT_EQ(ckpt.size(), 197u);
  EXPECT_EQ(ckpt.tensor_bytes(), 834720u);
  EXPECT_EQ(ckpt.config().at("model_type"), "kimi_linear");
  EXPECT_TRUE(ckpt.has_file("generation_config.json"));
  EXPECT_FALSE(ckpt.has_file("tokenizer.model"));
  for (const auto& name : ckpt.tensor_names()) EXPECT_EQ(ckpt.at(name).info->dtype, DType::kBF16) << name;
  EXPECT_EQ(ckpt.at("model.layers.0.self_attn.A_log").info->shape, (Shape{1, 1, 4, 1}));
  EXPECT_EQ(ckpt.at("model.layers.0.self_attn.k_conv1d.weight").info->shape, (Shape{64, 1, 4}));
  EXPECT_EQ(ckpt.at("model.layers.0.block_sparse_moe.gate_proj.weight").info->shape, (Shape{128, 64}));
}

TEST(Checkpoint, GoldenDirectoriesValidateClean) {
  for (const char* name : {"k3-tiny", "kl-tiny"}) {
    const auto report = validate_checkpoint_dir(kTestdata / name);
    EXPECT_TRUE(report.ok()) << name << ": " << (report.errors.empty() ? "" : report.errors.front());
    EXPECT_TRUE(report.warnings.empty()) << name;
  }
}

// ---- synthetic checkpoints ----------------------------------------------------------------------------

// Writes shards of 2-element F32 tensors, an index and a config, each overridable per test.
struct Layout {
  std::map<std::string, std::vector<std::string>> shards;  // file -> tensor names
  std::map<std::string, std::string> weight_map;           // defaults to what the shards hold
  std::optional<uint64_t> total_size;
  bool write_index = true;
  std::string config = R"({"model_type": "kimi_linear", "hidden_size": 8})";
};

Layout good_layout() {
  Layout l;
  l.shards = {{"model-00001-of-00002.safetensors", {"a", "b"}}, {"model-00002-of-00002.safetensors", {"c"}}};
  for (const auto& [file, names] : l.shards) {
    for (const auto& n : names) l.weight_map[n] = file;
  }
  l.total_size = 24;
  return l;
}

void write_layout(const fs::path& dir, const Layout& l) {
  for (const auto& [file, names] : l.shards) {
    SafetensorsWriter w;
    float seed = 0;
    for (const auto& n : names) {
      const float v[2] = {seed, seed + 0.5f};
      seed += 1;
      w.add(n, DType::kF32, {2}, std::span(reinterpret_cast<const uint8_t*>(v), sizeof(v)));
    }
    w.write(dir / file);
  }
  if (l.write_index) {
    nlohmann::json index;
    index["weight_map"] = l.weight_map;
    if (l.total_size) index["metadata"]["total_size"] = *l.total_size;
    testing::write_file(dir / "model.safetensors.index.json", index.dump(2));
  }
  if (!l.config.empty()) testing::write_file(dir / "config.json", l.config);
}

// Opens and returns the CheckpointError kind name and message ("ok" when it opens).
std::pair<std::string, std::string> open_result(const fs::path& dir) {
  try {
    Checkpoint::open(dir);
  } catch (const CheckpointError& e) {
    return {std::string(kind_name(e.kind())), e.what()};
  }
  return {"ok", ""};
}

std::string name(Kind k) { return std::string(kind_name(k)); }

TEST(Checkpoint, SyntheticShardedCheckpointOpens) {
  ScratchDir dir;
  write_layout(dir.path(), good_layout());
  auto ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.tensor_names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ckpt.at("c").shard->path().filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(ckpt.read_tensor("b").to_f32(), (std::vector<float>{1.0f, 1.5f}));
  EXPECT_TRUE(ckpt.warnings().empty());
  EXPECT_TRUE(ckpt.has_file("config.json"));
  EXPECT_FALSE(ckpt.has_file("../config.json"));
  EXPECT_FALSE(ckpt.has_file("/etc/hostname"));
  EXPECT_FALSE(ckpt.has_file(""));
  EXPECT_EQ(ckpt.file_path("tokenizer/tiktoken.model"), dir.path() / "tokenizer/tiktoken.model");
  try {
    (void)ckpt.file_path("a/../../x");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.kind(), Kind::kBadPath);
  }
  try {
    (void)ckpt.at("zz");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.kind(), Kind::kTensorNotFound);
    EXPECT_NE(std::string(e.what()).find("'zz'"), std::string::npos);
  }
  // Moving the checkpoint keeps its lookups valid (they point into the moved shard vector).
  Checkpoint moved = std::move(ckpt);
  EXPECT_EQ(moved.read_tensor("c").to_f32(), (std::vector<float>{0.0f, 0.5f}));
}

TEST(Checkpoint, SingleFileCheckpoint) {
  ScratchDir dir;
  Layout l;
  l.shards = {{"model.safetensors", {"x", "y"}}};
  l.write_index = false;
  write_layout(dir.path(), l);
  const auto ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.index(), nullptr);
  EXPECT_EQ(ckpt.size(), 2u);
  EXPECT_EQ(ckpt.shards().size(), 1u);
}

TEST(Checkpoint, IndexNamingAMissingFile) {
  ScratchDir dir;
  auto l = good_layout();
  l.weight_map["d"] = "model-00003-of-00002.safetensors";
  write_layout(dir.path(), l);
  auto [kind, message] = open_result(dir.path());
  EXPECT_EQ(kind, name(Kind::kMissingShard));
  EXPECT_NE(message.find("model-00003-of-00002.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("'d'"), std::string::npos) << message;
}

// A Hugging Face snapshot copied without its blobs: the shard and config.json are symbolic links that point
// nowhere. `ls` shows them, so the messages say what they are, not only that the files are missing.
TEST(Checkpoint, DanglingSymbolicLinksAreSaidToBeLinks) {
  ScratchDir dir;
  auto l = good_layout();
  write_layout(dir.path(), l);
  const fs::path shard = dir.path() / "model-00002-of-00002.safetensors";
  fs::remove(shard);
  fs::create_symlink("../../blobs/0123abcd", shard);
  auto [kind, message] = open_result(dir.path());
  EXPECT_EQ(kind, name(Kind::kMissingShard));
  EXPECT_NE(message.find("has no such file (a symbolic link to '../../blobs/0123abcd', which does not resolve)"),
            std::string::npos)
      << message;
  fs::remove(dir.path() / "config.json");
  fs::create_symlink("../../blobs/4567", dir.path() / "config.json");
  std::tie(kind, message) = open_result(dir.path());
  EXPECT_EQ(kind, name(Kind::kMissingConfig));
  EXPECT_NE(message.find("no config.json (a symbolic link to '../../blobs/4567', which does not resolve)"),
            std::string::npos)
      << message;
}

// A config.json or an index past its size limit says so, with the limit (it had read "File too large", the text of
// a file system's EFBIG). Sparse files: nothing is written.
TEST(Checkpoint, FilesOverTheirSizeLimitSayTheLimit) {
  ScratchDir dir;
  write_layout(dir.path(), good_layout());
  fs::resize_file(dir.path() / "model.safetensors.index.json", (uint64_t{256} << 20) + 1);
  auto [kind, message] = open_result(dir.path());
  EXPECT_NE(message.find("model.safetensors.index.json: cannot read: larger than the 256 MiB limit for this file"),
            std::string::npos)
      << message;
  fs::resize_file(dir.path() / "config.json", (uint64_t{64} << 20) + 1);
  std::tie(kind, message) = open_result(dir.path());
  EXPECT_NE(message.find("config.json: cannot read: larger than the 64 MiB limit for this file"), std::string::npos)
      << message;
}

TEST(Checkpoint, IndexKeyMissingFromItsShard) {
  ScratchDir dir;
  auto l = good_layout();
  l.weight_map["d"] = "model-00001-of-00002.safetensors";
  write_layout(dir.path(), l);
  auto [kind, message] = open_result(dir.path());
  EXPECT_EQ(kind, name(Kind::kKeyNotInShard));
  EXPECT_NE(message.find("'d'"), std::string::npos) << message;
  EXPECT_NE(message.find("model-00001-of-00002.safetensors"), std::string::npos) << message;
}

TEST(Checkpoint, ShardKeyMissingFromIndex) {
  ScratchDir dir;
  auto l = good_layout();
  l.shards["model-00002-of-00002.safetensors"].push_back("e");
  write_layout(dir.path(), l);
  auto [kind, message] = open_result(dir.path());
  EXPECT_EQ(kind, name(Kind::kKeyNotInIndex));
  EXPECT_NE(message.find("'e'"), std::string::npos) << message;
  EXPECT_NE(message.find("model-00002-of-00002.safetensors"), std::string::npos) << message;
}

TEST(Checkpoint, KeyInTwoShards) {
  ScratchDir dir;
  auto l = good_layout();
  l.shards["model-00001-of-00002.safetensors"].push_back("c");
  write_layout(dir.path(), l);
  auto [kind, message] = open_result(dir.path());
  EXPECT_EQ(kind, name(Kind::kKeyInTwoShards));
  EXPECT_NE(message.find("'c'"), std::string::npos) << message;
  EXPECT_NE(message.find("model-00001-of-00002.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("model-00002-of-00002.safetensors"), std::string::npos) << message;
}

TEST(Checkpoint, IndexPointsAtTheWrongShard) {
  ScratchDir dir;
  auto l = good_layout();
  l.weight_map["b"] = "model-00002-of-00002.safetensors";
  write_layout(dir.path(), l);
  auto [kind, message] = open_result(dir.path());
  EXPECT_EQ(kind, name(Kind::kWrongShard));
  EXPECT_NE(message.find("'b'"), std::string::npos) << message;
}

TEST(Checkpoint, PathTraversalInIndexIsRefusedBeforeOpening) {
  ScratchDir dir;
  fs::create_directories(dir / "ckpt");
  Layout outside;
  outside.shards = {{"evil.safetensors", {"c"}}};
  outside.write_index = false;
  outside.config.clear();
  write_layout(dir.path(), outside);  // a valid file one level up
  auto l = good_layout();
  l.weight_map["c"] = "../evil.safetensors";
  write_layout(dir / "ckpt", l);
  auto [kind, message] = open_result(dir / "ckpt");
  EXPECT_EQ(kind, name(Kind::kBadShardName));
  EXPECT_NE(message.find("../evil.safetensors"), std::string::npos) << message;
}

// A tensor whose index entry is refused (a bad shard name, a value that is not a string) has that one error: the
// shard holding it, opened for the index's other entries, is not also said to hold a tensor the index does not list.
TEST(Checkpoint, ARefusedIndexEntryIsItsTensorsOnlyError) {
  ScratchDir dir;
  auto l = good_layout();
  l.shards["model-00001-of-00002.safetensors"].push_back("d");
  l.weight_map["b"] = "../model-00001-of-00002.safetensors";
  write_layout(dir.path(), l);
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  index["weight_map"]["d"] = 7;
  testing::write_file(dir / "model.safetensors.index.json", index.dump(2));
  const auto report = validate_checkpoint_dir(dir.path());
  ASSERT_EQ(report.errors.size(), 2u) << ::testing::PrintToString(report.errors);
  EXPECT_NE(report.errors[0].find("weight_map[\"b\"] = \"../model-00001-of-00002.safetensors\""), std::string::npos)
      << report.errors[0];
  EXPECT_NE(report.errors[1].find("weight_map[\"d\"] must be a file name string, not 7"), std::string::npos)
      << report.errors[1];
}

TEST(Checkpoint, TotalSizeMismatchIsAWarning) {
  ScratchDir dir;
  auto l = good_layout();
  l.total_size = 1000;
  write_layout(dir.path(), l);
  const auto ckpt = Checkpoint::open(dir.path());
  ASSERT_EQ(ckpt.warnings().size(), 1u);
  EXPECT_NE(ckpt.warnings()[0].find("total_size is 1000"), std::string::npos);
  EXPECT_NE(ckpt.warnings()[0].find("24"), std::string::npos);
  const auto report = validate_checkpoint_dir(dir.path());
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.warnings, ckpt.warnings());
}

// One walk for `inspect`: the report and, when it is clean, the same checkpoint open() gives; with any error,
// no checkpoint at all.
TEST(Checkpoint, InspectGivesTheReportAndTheOpenCheckpoint) {
  ScratchDir dir;
  auto l = good_layout();
  l.total_size = 1000;  // a warning only
  write_layout(dir.path(), l);
  const auto inspection = inspect_checkpoint_dir(dir.path());
  ASSERT_TRUE(inspection.report.ok()) << ::testing::PrintToString(inspection.report.errors);
  ASSERT_TRUE(inspection.checkpoint.has_value());
  const auto opened = Checkpoint::open(dir.path());
  EXPECT_EQ(inspection.checkpoint->tensor_names(), opened.tensor_names());
  EXPECT_EQ(inspection.checkpoint->config(), opened.config());
  EXPECT_EQ(inspection.checkpoint->shards().size(), opened.shards().size());
  EXPECT_EQ(inspection.checkpoint->warnings(), opened.warnings());
  EXPECT_EQ(inspection.report.warnings, opened.warnings());
  // Its tensors are readable: the table points into its own shards after the move out of the walk.
  for (const auto& name : opened.tensor_names()) {
    const auto mine = inspection.checkpoint->read_tensor(name), theirs = opened.read_tensor(name);
    ASSERT_EQ(mine.nbytes(), theirs.nbytes()) << name;
    // The bytes, not only the sizes (a table pointing into the wrong shard would read other tensors' bytes).
    EXPECT_EQ(0, std::memcmp(mine.data_as<uint8_t>(), theirs.data_as<uint8_t>(), mine.nbytes())) << name;
  }

  auto broken = good_layout();
  broken.weight_map["gone"] = "model-00009-of-00002.safetensors";
  ScratchDir bad;
  write_layout(bad.path(), broken);
  const auto refused = inspect_checkpoint_dir(bad.path());
  EXPECT_FALSE(refused.report.ok());
  EXPECT_FALSE(refused.checkpoint.has_value());
}

TEST(Checkpoint, StrayModelSafetensorsBesideAnIndexIsAWarning) {
  ScratchDir dir;
  auto l = good_layout();
  l.shards["model.safetensors"] = {"stray"};
  write_layout(dir.path(), l);  // weight_map was built before: it does not name model.safetensors
  const auto ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.find("stray"), nullptr);
  ASSERT_EQ(ckpt.warnings().size(), 1u);
  EXPECT_NE(ckpt.warnings()[0].find("ignored"), std::string::npos);
}

TEST(Checkpoint, DirectoryLevelErrors) {
  ScratchDir dir;
  EXPECT_EQ(open_result(dir / "absent").first, name(Kind::kNotADirectory));
  testing::write_file(dir / "file", "x");
  EXPECT_EQ(open_result(dir / "file").first, name(Kind::kNotADirectory));

  fs::create_directories(dir / "empty");
  testing::write_file(dir / "empty" / "config.json", "{}");
  EXPECT_EQ(open_result(dir / "empty").first, name(Kind::kNoWeights));

  auto l = good_layout();
  l.config.clear();
  fs::create_directories(dir / "noconfig");
  write_layout(dir / "noconfig", l);
  EXPECT_EQ(open_result(dir / "noconfig").first, name(Kind::kMissingConfig));

  l = good_layout();
  l.config = R"({"hidden_size": 8, "hidden_size": 16})";
  fs::create_directories(dir / "dupconfig");
  write_layout(dir / "dupconfig", l);
  auto [kind, message] = open_result(dir / "dupconfig");
  EXPECT_EQ(kind, name(Kind::kDuplicateKey));
  EXPECT_NE(message.find("config.json"), std::string::npos);

  l.config = "[1, 2]";
  fs::create_directories(dir / "arrayconfig");
  write_layout(dir / "arrayconfig", l);
  EXPECT_EQ(open_result(dir / "arrayconfig").first, name(Kind::kInvalidConfig));
}

// A file whose lookup fails (here a symbolic link to itself; a directory without search permission does the same
// to users other than root, which the suite may run as) is reported as unreachable, naming it: "no config.json" or
// "no such shard" sent users after the wrong problem. The checkpoint directory itself too.
TEST(Checkpoint, UnreachableFilesAreNotReportedAsAbsent) {
  ScratchDir dir;
  for (const std::string file : {"config.json", "model.safetensors.index.json", "model-00002-of-00002.safetensors"}) {
    const fs::path d = dir / ("loop-" + file);
    fs::create_directories(d);
    write_layout(d, good_layout());
    fs::remove(d / file);
    fs::create_symlink(file, d / file);
    const auto [kind, message] = open_result(d);
    EXPECT_EQ(kind, name(Kind::kIo)) << file << ": " << message;
    EXPECT_NE(message.find("cannot be looked up"), std::string::npos) << message;
    EXPECT_NE(message.find(file), std::string::npos) << message;
  }
  fs::create_symlink("self", dir / "self");
  const auto [kind, message] = open_result(dir / "self");
  EXPECT_EQ(kind, name(Kind::kIo)) << message;
  EXPECT_NE(message.find("cannot be looked up"), std::string::npos) << message;
}

// A FIFO where a file belongs (config.json, the index, a shard) is refused as not a regular file: a plain open
// of a FIFO without a writer blocked forever. Each open runs beside a watchdog that, should it block, opens the
// FIFO for writing to release it, so that a regression fails instead of hanging the suite.
template <typename Open>
auto open_bounded(const fs::path& fifo, Open open) {
  auto result = std::async(std::launch::async, open);
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "opening " << fifo << " blocked";
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
  }
  return result.get();
}

TEST(Checkpoint, FifoInPlaceOfAFileIsAnError) {
  ScratchDir dir;
  for (const std::string file : {"config.json", "model.safetensors.index.json"}) {
    const fs::path d = dir / ("fifo-" + file);
    fs::create_directories(d);
    write_layout(d, good_layout());
    fs::remove(d / file);
    ASSERT_EQ(::mkfifo((d / file).c_str(), 0600), 0) << file;
    const auto [kind, message] = open_bounded(d / file, [&] { return open_result(d); });
    EXPECT_EQ(kind, name(Kind::kIo)) << file << ": " << message;
    EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
    EXPECT_NE(message.find(file), std::string::npos) << message;
  }
  const fs::path shard = dir / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  const std::string message = open_bounded(shard, [&]() -> std::string {
    try {
      SafetensorsFile::open(shard);
    } catch (const SafetensorsError& e) {
      return e.what();
    }
    return "opened";
  });
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
}

TEST(Checkpoint, BrokenShardHeaderNamesTheShard) {
  ScratchDir dir;
  write_layout(dir.path(), good_layout());
  testing::write_file(dir / "model-00002-of-00002.safetensors", testing::st_bytes("{\"c\": 1}", 0));
  try {
    Checkpoint::open(dir.path());
    FAIL();
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.kind(), SafetensorsError::Kind::kInvalidEntry);
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors"), std::string::npos);
  }
}

TEST(Checkpoint, ValidateReportsEveryProblem) {
  ScratchDir dir;
  auto l = good_layout();
  l.config.clear();                                                    // 1: no config.json
  l.weight_map["gone"] = "model-00009-of-00002.safetensors";           // 2: missing shard
  l.weight_map["phantom"] = "model-00001-of-00002.safetensors";        // 3: key not in its shard
  l.weight_map["up"] = "../up.safetensors";                            // 4: path traversal
  l.shards["model-00001-of-00002.safetensors"].push_back("unlisted");  // 5: key not in index
  l.shards["model-00003-of-00003.safetensors"] = {"x"};
  l.weight_map["x"] = "model-00003-of-00003.safetensors";
  write_layout(dir.path(), l);
  // 6, 7: a shard whose header has two independent problems.
  testing::write_file(dir / "model-00003-of-00003.safetensors",
                      testing::st_bytes(R"({"x":{"dtype":"Q1","shape":[1],"data_offsets":[0,4]},)"
                                        R"("y":{"dtype":"F32","shape":[-1],"data_offsets":[4,8]}})",
                                        8));
  const auto report = validate_checkpoint_dir(dir.path());
  ASSERT_EQ(report.errors.size(), 7u) << ::testing::PrintToString(report.errors);
  auto has = [&](std::initializer_list<std::string_view> parts) {
    for (const auto& e : report.errors) {
      bool all = true;
      for (auto p : parts) all &= e.find(p) != std::string::npos;
      if (all) return true;
    }
    return false;
  };
  EXPECT_TRUE(has({"config.json"}));
  EXPECT_TRUE(has({"model-00009-of-00002.safetensors", "'gone'"}));
  EXPECT_TRUE(has({"'phantom'", "model-00001-of-00002.safetensors"}));
  EXPECT_TRUE(has({"../up.safetensors"}));
  EXPECT_TRUE(has({"'unlisted'", "model-00001-of-00002.safetensors"}));
  EXPECT_TRUE(has({"model-00003-of-00003.safetensors", "'x'", "Q1"}));
  EXPECT_TRUE(has({"model-00003-of-00003.safetensors", "'y'", "negative"}));
  // The broken shard's keys are not also reported as missing from it.
  EXPECT_FALSE(has({"maps tensor 'x'"}));

  const auto missing = validate_checkpoint_dir(dir / "nope");
  ASSERT_EQ(missing.errors.size(), 1u);
  EXPECT_NE(missing.errors[0].find("nope"), std::string::npos);
}

}  // namespace
}  // namespace kimirt::io
