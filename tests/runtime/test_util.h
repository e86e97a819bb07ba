// Helpers of the runtime tests: the golden model configs with random weights (as a loader would hand them
// over, whole or as one rank's slices), a CPU backend over them, and one-call forwards of single sequences.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kimirt/comm/comm.h"
#include "kimirt/model/config.h"
#include "kimirt/model/parallel.h"
#include "kimirt/model/param_store.h"
#include "kimirt/model/schema.h"
#include "kimirt/quant/slice.h"
#include "kimirt/runtime/cpu_backend.h"
#include "kimirt/runtime/forward.h"

namespace kimirt::runtime::testing {

inline std::string testdata(const std::string& rel) { return std::string(KIMIRT_TESTDATA_DIR) + "/" + rel; }

inline model::ModelConfig k3_tiny_config() { return model::ModelConfig::from_file(testdata("k3-tiny/config.json")); }
inline model::ModelConfig kl_tiny_config() { return model::ModelConfig::from_file(testdata("kl-tiny/config.json")); }

// ‖out − ref‖ / ‖ref‖.
inline double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size() && i < out.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  if (out.size() != ref.size()) return INFINITY;
  return std::sqrt(num / den);
}

// Every parameter of a config, fp32, with the golden checkpoints' distributions (linear N(0, 1/fan_in),
// norms U(0.8, 1.2), A_log = log U(0.5, 16), dt_bias N(0, 0.5), conv N(0, 0.3), router bias N(0, 0.1)).
class RandomModel {
 public:
  RandomModel(const model::ModelConfig& config, uint64_t seed)
      : config_(config), schema_(std::make_unique<model::Schema>(config, model::default_layout(config))) {
    std::mt19937_64 rng(seed);
    for (const auto& spec : schema_->params()) {
      Tensor t(DType::kF32, spec.shape);
      fill(spec, t.span<float>(), rng);
      full_.emplace(spec.name, std::move(t));
    }
  }

  const model::ModelConfig& config() const { return config_; }
  const model::Schema& schema() const { return *schema_; }

  // This rank's parameters, cut by the parallel mapping exactly as the loader cuts checkpoint tensors.
  model::ParamStore store(const model::ParallelMapping& mapping = {}) const {
    model::ParamStore out;
    for (const auto& spec : schema_->params()) {
      const model::ParamSlice slice = model::slice_param(*schema_, spec, mapping);
      if (!slice.held()) continue;
      const Tensor& full = full_.at(spec.name);
      std::vector<TensorView> sources;  // a fused parameter's sources are row blocks of it
      int64_t row = 0;
      for (const auto& src : spec.sources) {
        sources.push_back(full.view().slice_rows(row, row + src.shape[0]).reshape(src.shape));
        row += src.shape[0];
      }
      model::LoadedParam p;
      p.spec = &spec;
      p.shape = slice.local_shape;
      p.component_ids = {0};
      p.components.push_back(quant::apply_slice(sources, slice.logical));
      out.put(spec.name, std::move(p));
    }
    return out;
  }

  const Tensor& param(const std::string& name) const { return full_.at(name); }

 private:
  static void fill(const model::ParamSpec& spec, std::span<float> v, std::mt19937_64& rng) {
    using R = model::ParamRole;
    auto normal = [&](double sd) {
      std::normal_distribution<float> d(0.0f, static_cast<float>(sd));
      for (auto& x : v) x = d(rng);
    };
    auto uniform = [&](float lo, float hi) {
      std::uniform_real_distribution<float> d(lo, hi);
      for (auto& x : v) x = d(rng);
    };
    switch (spec.role) {
      case R::kFinalNorm:
      case R::kInputNorm:
      case R::kPostAttnNorm:
      case R::kAttnResNorm:
      case R::kMlpResNorm:
      case R::kOutputResNorm:
      case R::kKdaONorm:
      case R::kMlaQANorm:
      case R::kMlaKvANorm:
      case R::kLatentNorm:
        uniform(0.8f, 1.2f);
        break;
      case R::kKdaALog:
        uniform(0.5f, 16.0f);
        for (auto& x : v) x = std::log(x);
        break;
      case R::kKdaDtBias:
        normal(0.5);
        break;
      case R::kKdaQConv:
      case R::kKdaKConv:
      case R::kKdaVConv:
        normal(0.3);
        break;
      case R::kRouterBias:
        normal(0.1);
        break;
      case R::kEmbed:
        normal(1.0);
        break;
      default:
        normal(1.0 / std::sqrt(static_cast<double>(spec.shape.back())));
        break;
    }
  }

  model::ModelConfig config_;
  std::unique_ptr<model::Schema> schema_;
  std::map<std::string, Tensor> full_;
};

inline CacheConfig small_cache() { return CacheConfig{4, 16, 64}; }

// A CPU backend at tp = 1 over a random model.
struct TestBackend {
  explicit TestBackend(const RandomModel& m, CacheConfig cache = small_cache())
      : backend(m.config(), m.store(), comm, model::ParallelMapping{}, cache) {}
  SingleComm comm;
  CpuBackend backend;
};

// Blocks 0, 1, ... of a sequence in slot `slot` (slot s owns blocks [s·per, (s+1)·per)).
inline std::vector<int32_t> blocks_of(int slot, const CacheConfig& cache) {
  const int per = cache.num_blocks / cache.max_sequences;
  std::vector<int32_t> b;
  for (int i = 0; i < per; ++i) b.push_back(slot * per + i);
  return b;
}

// Runs `ids` of one sequence (starting at `start`) and returns its logits [rows, vocab].
inline std::vector<float> run_one(Backend& backend, const std::vector<int32_t>& ids, int64_t start, int slot,
                                  LogitRows rows = LogitRows::kAll, ForwardObserver* observer = nullptr) {
  StepBatch batch;
  batch.add(ids, start, slot, blocks_of(slot, backend.cache_config()), rows);
  Forward forward(backend);
  ActBuffer logits = forward.run(batch, observer);
  std::vector<float> host(static_cast<size_t>(batch.logit_rows * backend.config().vocab_size));
  if (batch.logit_rows > 0) backend.to_host(logits.get(), 0, batch.logit_rows, host);
  return host;
}

inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  return ids;
}

}  // namespace kimirt::runtime::testing
