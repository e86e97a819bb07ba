// `kimirt inspect` end to end: the golden checkpoints pass with correct summaries; corrupted copies exit 1
// with a message naming the file and the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/run_command.h"
#include "kimirt/io/safetensors_writer.h"
#include "kimirt/tensor/dtype.h"

namespace {

namespace fs = std::filesystem;

kimirt::test::CommandResult run_kimirt(const std::string& args) {
  return kimirt::test::run_command(kimirt::test::kimirt_binary() + " " + args);
}

std::string golden(const std::string& name) { return kimirt::test::golden_dir(name); }

// A writable copy of a golden checkpoint in a fresh temp dir.
fs::path copy_of(const std::string& name, const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / ("kimirt-inspect-" + tag);
  fs::remove_all(dir);
  fs::copy(golden(name), dir, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(dir)) {
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  return dir;
}

TEST(Inspect, GoldenK3Summary) {
  const auto r = run_kimirt("inspect " + golden("k3-tiny"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kimi_k3: hidden 256, 6 layers (4 KDA + 2 MLA), vocab 1024"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("12 files, 636 tensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("240 mxfp4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("AttnRes, block 2"), std::string::npos) << r.output;
}

// The GPU budget flag is checked before anything else, on any build and without a GPU: a size below 1 MiB
// ("0.9", a vLLM-style fraction without "%", would mean the whole GPU), a unit it does not know, or the flag
// without --device is an error naming the text; a good budget runs (the plan itself needs a GPU).
TEST(Inspect, GpuMemoryBudgetIsChecked) {
  {
    const auto r = run_kimirt("inspect " + golden("k3-tiny") + " --device --gpu-memory ''");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("--gpu-memory: must not be empty"), std::string::npos) << r.output;
  }
#ifdef KIMIRT_HAVE_CUDA
  for (const std::string bad : {"0.9", "12XB", "150%"}) {
    const auto r = run_kimirt("inspect " + golden("k3-tiny") + " --device --gpu-memory " + bad);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("kimi_k3: hidden"), std::string::npos) << "refused before the summary: " << r.output;
  }
  auto r = run_kimirt("inspect " + golden("k3-tiny") + " --gpu-memory 80%");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("needs --device"), std::string::npos) << r.output;
  r = run_kimirt("inspect " + golden("k3-tiny") + " --device --gpu-memory 80%");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kimi_k3: hidden"), std::string::npos) << r.output;
#else
  const auto r = run_kimirt("inspect " + golden("k3-tiny") + " --device --gpu-memory 80%");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("built without CUDA"), std::string::npos) << r.output;
#endif
}

// Every visible GPU gets its own plan (each has its own free memory), and the cache the model gets is the
// smallest GPU's: tensor-parallel ranks each keep the whole latent cache.
TEST(Inspect, DevicePlansEveryGpu) {
  // Half of each GPU: the plan is then that share of its total memory, the same in both runs below whatever
  // else runs on the GPU meanwhile (the default, 90% capped by free memory, could differ between them).
  const std::string budget = " --gpu-memory 50%";
  const auto r = run_kimirt("inspect --json --device" + budget + " " + golden("k3-tiny"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto d = nlohmann::json::parse(r.output)["device"];
#ifdef KIMIRT_HAVE_CUDA
  const int gpus = d["gpus"].get<int>();
  ASSERT_EQ(d["devices"].size(), static_cast<size_t>(gpus)) << d.dump(2);
  if (gpus == 0) GTEST_SKIP() << "no GPU visible";
  EXPECT_EQ(d["model_per_gpu"]["tp"].get<int>(), gpus);
  if (d["model_per_gpu"].contains("error")) {
    // The tiny model's 4 heads do not split over this many GPUs: no GPU fits it.
    for (const auto& g : d["devices"]) EXPECT_FALSE(g["fits"].get<bool>());
    GTEST_SKIP() << "the tiny model does not map to " << gpus << " GPUs: " << d["model_per_gpu"]["error"];
  }
  uint64_t least = UINT64_MAX;
  for (int i = 0; i < gpus; ++i) {
    const auto& g = d["devices"][i];
    EXPECT_EQ(g["ordinal"].get<int>(), i);
    EXPECT_GT(g["memory_plan"]["arena_bytes"].get<uint64_t>(), 0u);
    ASSERT_TRUE(g["fits"].get<bool>()) << "the tiny model fits any H200: " << g.dump(2);
    least = std::min(least, g["cache_tokens"].get<uint64_t>());
  }
  EXPECT_TRUE(d["model_per_gpu"]["fits"].get<bool>());
  EXPECT_EQ(d["model_per_gpu"]["cache_tokens"].get<uint64_t>(), least);
  const auto text = run_kimirt("inspect --device" + budget + " " + golden("k3-tiny"));
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (int i = 0; i < gpus; ++i) {
    EXPECT_NE(text.output.find("GPU memory plan for device " + std::to_string(i)), std::string::npos) << text.output;
  }
  if (gpus > 1) {
    EXPECT_NE(text.output.find("all " + std::to_string(gpus) + " GPUs: " + std::to_string(least) + " cached tokens"),
              std::string::npos)
        << text.output;
  }
#else
  EXPECT_FALSE(d["cuda"].get<bool>());
  EXPECT_EQ(d["model_per_gpu"]["tp"].get<int>(), 1);
#endif
}

// The weights a GPU must hold are sized from the formats the checkpoint stores, not from what its config
// predicts: the k3-tiny copy whose config no longer declares the MXFP4 experts still stores them as MXFP4, so
// its weights take exactly as many bytes as the original's (from the prediction alone, BF16 experts: about 4x).
TEST(Inspect, DeviceWeightsAreSizedFromTheStoredFormats) {
  const fs::path dir = copy_of("k3-tiny", "undeclared-quantization");
  nlohmann::json config;
  std::ifstream(dir / "config.json") >> config;
  ASSERT_TRUE(config["text_config"].contains("quantization_config"));
  config["text_config"].erase("quantization_config");
  std::ofstream(dir / "config.json") << config.dump(2);
  const auto weight_bytes = [](const std::string& path) -> std::pair<int, uint64_t> {
    const auto r = run_kimirt("inspect --json --device " + path);
    if (r.exit_code != 0) {
      ADD_FAILURE() << path << ": " << r.output;
      return {0, 0};
    }
    const auto m = nlohmann::json::parse(r.output)["device"]["model_per_gpu"];
    if (m.contains("error")) return {m["tp"].get<int>(), 0};  // the tiny model does not map to this many GPUs
    return {m["tp"].get<int>(), m["weight_bytes"].get<uint64_t>()};
  };
  const auto [tp, original] = weight_bytes(golden("k3-tiny"));
  const auto [tp_copy, undeclared] = weight_bytes(dir.string());
  ASSERT_EQ(tp, tp_copy);
  if (original == 0) GTEST_SKIP() << "the tiny model does not map to " << tp << " GPUs";
  EXPECT_EQ(undeclared, original);
  fs::remove_all(dir);
}

TEST(Inspect, GoldenKimiLinearJson) {
  const auto r = run_kimirt("inspect --json " + golden("kl-tiny"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["model"]["family"], "kimi_linear");
  EXPECT_EQ(j["model"]["kda_layers"], 4);
  EXPECT_EQ(j["model"]["mla_layers"], 1);
  EXPECT_EQ(j["tensors"], 197);
  EXPECT_EQ(j["shards"].size(), 5u);
  EXPECT_EQ(j["bytes_per_dtype"].size(), 1u);  // all BF16
}

TEST(Inspect, TruncatedShardIsNamed) {
  const auto dir = copy_of("k3-tiny", "truncated");
  const auto shard = dir / "model-00003-of-00012.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  const auto r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model-00003-of-00012.safetensors"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// Writes `bytes` over element `index` of tensor `name` in one of dir's shards; false when no shard holds it.
bool overwrite_element(const fs::path& dir, const std::string& name, uint64_t index, const std::string& bytes) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    f.read(header.data(), static_cast<std::streamsize>(n));
    const auto j = nlohmann::json::parse(header);
    if (!j.contains(name)) continue;
    const uint64_t begin = j[name]["data_offsets"][0].get<uint64_t>();
    f.seekp(static_cast<std::streamoff>(8 + n + begin + index * bytes.size()));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return static_cast<bool>(f);
  }
  return false;
}

// --check-values reads the tensors and names each one holding NaN or infinite values, with the count and the first
// index: here a BF16 NaN in a norm weight, an F32 infinity in a bias, and 0xFF (NaN) in an MXFP4 weight's E8M0
// scales, which the file stores as U8. The golden checkpoint itself is all finite.
TEST(Inspect, CheckValuesNamesNonFiniteTensors) {
  auto r = run_kimirt("inspect " + golden("k3-tiny") + " --check-values");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all finite; 240 without NaN or infinity codes not read"), std::string::npos) << r.output;

  const auto dir = copy_of("k3-tiny", "values");
  const std::string norm = "language_model.model.layers.0.input_layernorm.weight";
  const std::string bias = "language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias";
  const std::string scale = "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_scale";
  ASSERT_TRUE(overwrite_element(dir, norm, 5, std::string("\xC0\x7F", 2)));
  ASSERT_TRUE(overwrite_element(dir, bias, 2, std::string("\x00\x00\x80\x7F", 4)));
  ASSERT_TRUE(overwrite_element(dir, scale, 7, "\xFF"));
  // 2^127: finite, but its E2M1 weights from 2 up overflow float; run refuses it, so inspect names it too.
  const std::string huge = "language_model.model.layers.1.block_sparse_moe.experts.5.w1.weight_scale";
  ASSERT_TRUE(overwrite_element(dir, huge, 3, "\xFE"));
  r = run_kimirt("inspect " + dir.string() + " --check-values");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tensor " + norm + " (model-"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("BF16): 1 of 256 values are NaN or infinite, the first at index 5"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(bias), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("F32): 1 of "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensor " + scale), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("F8_E8M0): 1 of "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensor " + huge), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("F8_E8M0): 1 of 256 block scales are invalid (0 NaN or infinite, the others negative or so "
                          "large that their weights overflow float: run refuses them), the first at index 3"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("3 with NaN or infinite values, 1 with invalid block scales"), std::string::npos) << r.output;
  r = run_kimirt("run -m " + dir.string() + " --ids 1 -n 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // Without the flag the values are not read: the structure is still right.
  EXPECT_EQ(run_kimirt("inspect " + dir.string()).exit_code, 0);
  fs::remove_all(dir);
}

// A tensor name that carries terminal control sequences (here: set the window title, clear the screen) is shown
// escaped, not sent to the terminal; the JSON output escapes it as JSON does.
TEST(Inspect, ControlCharactersInNamesAreEscaped) {
  const auto dir = copy_of("k3-tiny", "control");
  const std::string name = "evil\x1b]0;owned\x07\x1b[2Jname";
  kimirt::io::SafetensorsWriter writer;
  const std::vector<uint8_t> bytes(4, 0);
  writer.add(name, kimirt::DType::kF32, {1}, bytes);
  writer.write(dir / "extra.safetensors");
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  index["weight_map"][name] = "extra.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  const auto r = run_kimirt("inspect " + dir.string());
  EXPECT_NE(r.output.find("unexpected tensor evil\\x1b]0;owned\\x07\\x1b[2Jname"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << "a raw escape reached the output";
  EXPECT_EQ(r.output.find('\x07'), std::string::npos) << "a raw bell reached the output";
  fs::remove_all(dir);
}

TEST(Inspect, CorruptHeaderIsNamed) {
  const auto dir = copy_of("kl-tiny", "header");
  std::fstream f(dir / "model-00002-of-00005.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("[", 1);  // the header is no longer a JSON object
  f.close();
  const auto r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model-00002-of-00005.safetensors"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(Inspect, MissingShardAndMissingConfigAreNamed) {
  const auto dir = copy_of("kl-tiny", "missing");
  fs::remove(dir / "model-00004-of-00005.safetensors");
  auto r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model-00004-of-00005.safetensors"), std::string::npos) << r.output;
  fs::remove(dir / "config.json");
  r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("config.json"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// The files run and chat read beside the weights, read as they read them: a tokenizer or generation config they
// would refuse fails inspect too, named (inspect said "ok").
TEST(Inspect, TokenizerAndGenerationConfigThatRunRefusesAreNamed) {
  const auto dir = copy_of("k3-tiny", "side-files");
  std::ofstream(dir / "tiktoken.model") << "not base64 at all\n";
  auto r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tiktoken.model"), std::string::npos) << r.output;
  fs::remove(dir / "tiktoken.model");
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": 99999999}";
  r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("generation_config.json: eos_token_id 99999999 is not a token id of the model"),
            std::string::npos)
      << r.output;
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": ";
  r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("generation_config.json"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(Inspect, InvalidConfigFieldIsNamed) {
  const auto dir = copy_of("k3-tiny", "config");
  auto j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  j["text_config"]["num_experts_per_token"] = 20;
  std::ofstream(dir / "config.json") << j.dump(2);
  const auto r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("text_config.num_experts_per_token"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// Sizes no model has once gave a bare std::bad_alloc (a table of 10^12 layers); now the field is named, by
// inspect and by run alike.
TEST(Inspect, HugeConfigValuesAreNamedNotBadAlloc) {
  const auto dir = copy_of("k3-tiny", "huge");
  auto j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  j["text_config"]["num_hidden_layers"] = int64_t{1000000000000};
  std::ofstream(dir / "config.json") << j.dump(2);
  for (const std::string command : {"inspect ", "run --ids 1 -n 1 -m "}) {
    const auto r = run_kimirt(command + dir.string());
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("text_config.num_hidden_layers is 1000000000000, over the sanity bound"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("bad_alloc"), std::string::npos) << r.output;
  }
  fs::remove_all(dir);
}

// config.json is read strictly everywhere: a key given twice is refused by name, not resolved silently.
TEST(Inspect, DuplicateConfigKeyIsRefused) {
  const auto dir = copy_of("k3-tiny", "dupkey");
  std::string text;
  {
    std::ifstream in(dir / "config.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string original = text;
  text.insert(text.find('{') + 1, "\"model_type\": \"kimi_linear\",");
  std::ofstream(dir / "config.json") << text;
  for (const std::string command : {"inspect ", "run --ids 1 -n 1 -m "}) {
    const auto r = run_kimirt(command + dir.string());
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("duplicate key \"model_type\""), std::string::npos) << r.output;
  }
  // generation_config.json too (run reads its eos_token_id).
  std::ofstream(dir / "config.json") << original;
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 1, "eos_token_id": 2})";
  const auto r = run_kimirt("run --ids 1 -n 1 -m " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("generation_config.json: duplicate key \"eos_token_id\""), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// The vision tower that K3 releases ship beside the text model may be stored in a format no text weight uses (here a
// compressed-tensors W4A16 int4 packing): a text model never reads it, so neither inspect nor run holds it to the
// text model's formats. The same tensors as a text weight are an error.
TEST(Inspect, VisionTowerWeightsAreNotHeldToTheTextFormats) {
  const auto dir = copy_of("k3-tiny", "vision");
  kimirt::io::SafetensorsWriter writer;
  const std::string base = "vision_tower.blocks.0.attn.qkv";
  writer.add(base + ".weight_packed", kimirt::DType::kI32, {4, 2}, std::vector<uint8_t>(32, 0x11));
  writer.add(base + ".weight_scale", kimirt::DType::kBF16, {4, 1}, std::vector<uint8_t>(8, 0x3F));
  writer.add(base + ".weight_shape", kimirt::DType::kI64, {2}, std::vector<uint8_t>(16, 0));
  writer.write(dir / "vision.safetensors");
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  for (const char* suffix : {".weight_packed", ".weight_scale", ".weight_shape"}) {
    index["weight_map"][base + suffix] = "vision.safetensors";
  }
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  auto r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("vision_tower"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not read    3 tensors of the vision tower and projector"), std::string::npos) << r.output;
  r = run_kimirt("run -m " + dir.string() + " --ids 1 -n 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // Under a text-model name, whose format inspect checks (a layer past the config's, else an unexpected tensor), the
  // same packing is refused by name.
  kimirt::io::SafetensorsWriter text_writer;
  const std::string text_base = "language_model.model.layers.9.self_attn.q_proj";
  text_writer.add(text_base + ".weight_packed", kimirt::DType::kI32, {4, 2}, std::vector<uint8_t>(32, 0x11));
  text_writer.add(text_base + ".weight_scale", kimirt::DType::kBF16, {4, 1}, std::vector<uint8_t>(8, 0x3F));
  text_writer.write(dir / "text.safetensors");
  for (const char* suffix : {".weight_packed", ".weight_scale"}) {
    index["weight_map"][text_base + suffix] = "text.safetensors";
  }
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(text_base + ".weight_packed is I32"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(Inspect, MissingTensorIsNamed) {
  // Drop one key from the index and its shard would then hold a key the index does not list; instead
  // remove a whole layer's worth from the config's view: fewer experts declared than stored is fine
  // (unexpected keys warn), more experts than stored is a missing-key error.
  const auto dir = copy_of("kl-tiny", "keys");
  auto j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  j["num_hidden_layers"] = 6;
  j["linear_attn_config"]["kda_layers"] = {1, 2, 3, 5, 6};
  std::ofstream(dir / "config.json") << j.dump(2);
  const auto r = run_kimirt("inspect " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model.layers.5."), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
