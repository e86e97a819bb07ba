// The CPU backend: every coarse op composed from the fp32 reference operators of cpu/, activations in host
// memory, caches in a CpuCacheStore. Sequences of a step go through KDA/MLA one at a time (the cpu ops
// parallelize inside over ThreadPool::global()). Built for one rank of a tensor/expert-parallel group from
// the start: this rank's weights from the ParamStore, and the group's collectives where the model needs them.
// Attention-DP off (every rank runs the same tokens): an all-reduce after the KDA/MLA o_proj, after the dense
// MLP down_proj (on its TP subgroup), the MoE block's collectives (cpu_moe.h), the vocabulary gather of the LM
// head, and the sampled tokens broadcast from rank 0 so that every rank feeds back the same ones.
// Attention-DP on (every rank runs its own sequences): attention, dense and shared MLPs run replicated with no
// collective; the MoE exchanges tokens all-to-all; the LM head gathers every rank's rows for its vocabulary
// shard and sends each rank its rows' logits back. Every rank must then run every step, with zero tokens when
// it has none (ParallelEngine does this).
#pragma once

#include <memory>
#include <vector>

#include "kimirt/comm/comm.h"
#include "kimirt/model/config.h"
#include "kimirt/model/parallel.h"
#include "kimirt/model/param_store.h"
#include "kimirt/runtime/backend.h"
#include "kimirt/runtime/cpu_cache_store.h"
#include "kimirt/runtime/cpu_moe.h"
#include "kimirt/runtime/cpu_weights.h"
#include "kimirt/runtime/op_trace.h"
#include "kimirt/runtime/parallel_config.h"

namespace kimirt::runtime {

class CpuBackend final : public Backend {
 public:
  // The fp32 weights are copied out of `params` (which may be dropped afterwards). comm is the TP group of
  // `mapping` (size tp_size, this rank tp_rank) and must outlive the backend. Every rank of the group must
  // construct its backend at the same time (the dense MLP's subgroup is split off here). moe_comm is the
  // MoE path with attention-DP off (ParallelConfig); under attention-DP the MoE is always all-to-all.
  CpuBackend(const model::ModelConfig& config, const model::ParamStore& params, Comm& comm,
             const model::ParallelMapping& mapping, const CacheConfig& cache, MoeComm moe_comm = MoeComm::kDirect);
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  const model::ModelConfig& config() const override { return config_; }
  const CacheConfig& cache_config() const override { return cache_; }
  const CpuWeights& weights() const { return weights_; }
  uint64_t cache_bytes() const { return caches_.bytes(); }
  const model::ParallelMapping& mapping() const { return mapping_; }
  // Test hook: the tracer sees the TracePoints of every following step (null: none). Not owned.
  void set_tracer(OpTracer* tracer) { tracer_ = tracer; }

  Act alloc(int64_t rows, int64_t cols) override;
  void release(Act a) override;
  int64_t rows(Act a) const override;
  int64_t cols(Act a) const override;

  void begin_step(const StepBatch& batch) override;
  void end_step() override { batch_ = nullptr; }

  void embed(Act out) override;
  void add(Act a, Act b, Act out) override;
  void attn_res_mix(int layer, ResSite site, std::span<const Act> candidates, Act out) override;
  void rms_norm(int layer, NormSite site, Act x, Act out) override;
  void kda_mixer(int layer, Act x, Act out) override;
  void mla_mixer(int layer, Act x, Act out) override;
  void dense_mlp(int layer, Act x, Act out) override;
  void moe_block(int layer, Act x, Act out, RouteTrace* trace) override;
  void gather_rows(Act x, std::span<const int64_t> rows, Act out) override;
  void lm_head(Act x, Act logits) override;
  void sample(Act logits, std::span<const int64_t> rows, std::span<Sampler* const> samplers,
              std::span<int32_t> tokens) override;
  void to_host(Act a, int64_t first_row, int64_t n, std::span<float> out) const override;

 private:
  struct Buffer {
    std::vector<float> data;
    int64_t rows = 0;
    int64_t cols = 0;
    bool used = false;
  };
  Buffer& buf(Act a);
  const Buffer& buf(Act a) const;
  float* data(Act a, int64_t rows, int64_t cols);  // checks the shape
  const StepBatch& batch() const;
  // logits[n, V] of this rank's rows when every rank has its own rows (attention-DP).
  void lm_head_gathered(const float* x, int64_t n, float* logits);
  // True when the ranks run the same tokens and share the logits (attention-DP off, more than one rank).
  bool tokens_shared() const { return !mapping_.attention_dp && comm_.size() > 1; }

  model::ModelConfig config_;
  CacheConfig cache_;
  Comm& comm_;
  model::ParallelMapping mapping_;
  std::unique_ptr<Comm> dense_group_;  // the dense MLP's TP subgroup when smaller than the TP group
  Comm* dense_comm_ = nullptr;         // where the dense down_proj partials are summed; null: replicated
  CpuWeights weights_;
  CpuCacheStore caches_;
  CpuMoe moe_;
  OpTracer* tracer_ = nullptr;
  std::vector<Buffer> buffers_;
  const StepBatch* batch_ = nullptr;
  // Scratch, reused from step to step.
  std::vector<float> mla_cached_, mla_fresh_;
  std::vector<float> head_local_, head_all_, head_x_;
  std::vector<size_t> head_send_, head_recv_;
  std::vector<int64_t> head_counts_;
  std::vector<float> sample_row_;
};

}  // namespace kimirt::runtime
