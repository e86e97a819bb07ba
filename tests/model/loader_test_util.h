// Helpers for the load-plan, loader and generator tests: scratch directories, generated checkpoints, a way
// to rewrite a checkpoint with one thing broken (the fault tests), and a LoadTarget that records the
// protocol calls while filling a ParamStore.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error_of.h"
#include "kimirt/io/checkpoint.h"
#include "kimirt/io/safetensors_writer.h"
#include "kimirt/model/loader.h"
#include "kimirt/model/tiny_checkpoint.h"

namespace kimirt::model::loadtest {

namespace fs = std::filesystem;

// A fresh directory, removed with its contents when the test ends.
class Scratch {
 public:
  Scratch() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "loader";
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = fs::path(::testing::TempDir()) /
            ("kimirt_loader_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + name);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A K3 model small enough for many loads per test: 3 layers (dense, MoE, MoE), 8 experts.
inline TinyDims small_k3_dims() {
  TinyDims d;
  d.layers = 3;
  d.hidden = 64;
  d.vocab = 512;
  d.heads = 4;
  d.head_dim = 16;
  d.rope_dim = 8;
  d.q_lora_rank = 32;
  d.kv_lora_rank = 16;
  d.experts = 8;
  d.top_k = 2;
  d.intermediate = 128;
  d.moe_intermediate = 64;
  d.latent = 64;
  return d;
}

inline fs::path make_checkpoint(const fs::path& dir, const ModelConfig& config, uint64_t shard_bytes = 1 << 20,
                                uint64_t seed = 7) {
  TinyCheckpointOptions o;
  o.seed = seed;
  o.shard_bytes = shard_bytes;
  write_tiny_checkpoint(dir, config, o);
  return dir;
}

// A stored tensor kept for rewriting: dtype, shape and raw bytes.
struct RawTensor {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

struct RawCheckpoint {
  nlohmann::json config;
  std::map<std::string, RawTensor> tensors;
  std::map<std::string, std::string> shard_of;  // key -> shard file name
};

inline RawCheckpoint read_raw(const fs::path& dir) {
  const io::Checkpoint c = io::Checkpoint::open(dir);
  RawCheckpoint raw;
  raw.config = c.config();
  for (const auto& name : c.tensor_names()) {
    const auto& ref = c.at(name);
    RawTensor t{ref.info->dtype, ref.info->shape, std::vector<uint8_t>(ref.info->nbytes())};
    ref.shard->read(*ref.info, t.bytes.data());
    raw.tensors.emplace(name, std::move(t));
    raw.shard_of.emplace(name, ref.shard->path().filename().string());
  }
  return raw;
}

// Writes `raw` as a checkpoint directory: one file per distinct shard name, an index mapping every key to
// its file (plus `extra_index` entries, which may name files that do not exist), and config.json.
inline void write_raw(const fs::path& dir, const RawCheckpoint& raw,
                      const std::map<std::string, std::string>& extra_index = {}) {
  fs::create_directories(dir);
  std::map<std::string, io::SafetensorsWriter> writers;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [name, t] : raw.tensors) {
    const std::string& file = raw.shard_of.at(name);
    writers[file].add(name, t.dtype, t.shape, t.bytes);
    weight_map[name] = file;
  }
  for (const auto& [name, file] : extra_index) weight_map[name] = file;
  for (const auto& [file, w] : writers) w.write(dir / file);
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}}.dump(1);
  std::ofstream(dir / "config.json") << raw.config.dump(1);
}

// Every call a load makes on its target, checked against the protocol as they happen; the bytes go to a
// ParamStoreTarget.
class RecordingTarget : public LoadTarget {
 public:
  void begin(const LoadPlan& plan) override {
    std::lock_guard<std::mutex> lock(mutex_);
    plan_ = &plan;
    ++begins;
    inner_.begin(plan);
  }
  void write(const StagedWrite& w) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++writes;
      const int32_t slot = plan_->params()[plan_->dests()[w.dest].param].slot;
      if (slot >= 0) {
        const ExpertSlot& s = plan_->expert_slots()[static_cast<size_t>(slot)];
        if (!prepared.contains(s.layer))
          protocol_errors.push_back("write before prepare_layer " + std::to_string(s.layer));
        if (finalized.contains(s.layer))
          protocol_errors.push_back("write after finalize_layer " + std::to_string(s.layer));
        if (slots_loaded.contains(slot)) protocol_errors.push_back("write after slot_loaded " + std::to_string(slot));
      }
    }
    inner_.write(w);
  }
  void prepare_layer(int32_t layer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!prepared.insert(layer).second) protocol_errors.push_back("layer prepared twice " + std::to_string(layer));
    ++prepare_calls[layer];
  }
  void slot_loaded(const ExpertSlot& slot) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto index = static_cast<int32_t>(&slot - plan_->expert_slots().data());
    ++slot_calls[index];
    slots_loaded.insert(index);
    if (!prepared.contains(slot.layer)) protocol_errors.push_back("slot loaded before its layer was prepared");
  }
  void finalize_layer(int32_t layer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++finalize_calls[layer];
    finalized.insert(layer);
    for (size_t s = 0; s < plan_->expert_slots().size(); ++s) {
      if (plan_->expert_slots()[s].layer == layer && !slots_loaded.contains(static_cast<int32_t>(s))) {
        protocol_errors.push_back("layer " + std::to_string(layer) + " finalized before slot " + std::to_string(s));
      }
    }
  }
  void finish() override {
    ++finishes;
    inner_.finish();
  }
  void abandon() noexcept override {
    ++abandons;
    inner_.abandon();
  }
  ParamStore take() { return inner_.take(); }

  int begins = 0, finishes = 0, abandons = 0;
  std::atomic<int64_t> writes{0};
  std::map<int32_t, int> prepare_calls, finalize_calls, slot_calls;
  std::set<int32_t> prepared, finalized, slots_loaded;
  std::vector<std::string> protocol_errors;

 private:
  std::mutex mutex_;
  const LoadPlan* plan_ = nullptr;
  ParamStoreTarget inner_;
};

using ::kimirt::test::error_of;

inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return {p, p + t.nbytes()};
}

}  // namespace kimirt::model::loadtest
