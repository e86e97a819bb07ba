// This rank's weights for the CPU backend: fp32 copies of every parameter the rank holds, taken from the
// loader's ParamStore once, checked against the shapes the parallel mapping gives this rank, and bound into
// the cpu:: weight structs layer by layer, so that a step never looks anything up by name.
#pragma once

#include <cstdint>
#include <vector>

#include "kimirt/cpu/activation.h"
#include "kimirt/cpu/attn_res.h"
#include "kimirt/cpu/kda.h"
#include "kimirt/cpu/mla.h"
#include "kimirt/cpu/mlp.h"
#include "kimirt/cpu/router.h"
#include "kimirt/model/config.h"
#include "kimirt/model/parallel.h"
#include "kimirt/model/param_store.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::runtime {

struct CpuLayerWeights {
  const float* input_norm = nullptr;
  const float* post_attention_norm = nullptr;
  cpu::AttnResWeights mixer_res;  // self_attention_res_{norm,proj} (AttnRes models)
  cpu::AttnResWeights ffn_res;    // mlp_res_{norm,proj}
  cpu::KdaWeights kda;            // KDA layers
  cpu::MlaWeights mla;            // MLA layers
  cpu::GatedMlpWeights dense;     // dense FFN: gate/up point into the fused gate_up_proj

  // MoE layers.
  cpu::RouterWeights router;
  std::vector<cpu::GatedMlpWeights> experts;  // this rank's experts: global id first_expert + i
  int32_t first_expert = 0;
  cpu::GatedMlpWeights shared;  // null pointers when the model has no shared experts
  const float* latent_down = nullptr;
  const float* latent_norm = nullptr;
  const float* latent_up = nullptr;
};

// The op dimensions as this rank runs them: head counts and FFN widths are the local shares.
struct CpuLocalDims {
  cpu::KdaDims kda;
  cpu::MlaDims mla;
  int64_t dense_intermediate = 0;   // local share of intermediate_size
  int dense_tp = 1;                 // ranks sharing the dense MLP (its TP subgroup size); 1 = replicated
  int64_t shared_intermediate = 0;  // local share of the fused shared experts' width; 0 = none
  int64_t expert_intermediate = 0;  // local share of moe_intermediate_size
  int64_t expert_width = 0;         // routed experts' input width (latent width, or hidden)
  int64_t vocab_rows = 0;           // lm_head rows on this rank
  cpu::RouterConfig router;
  cpu::GluActivation act;
  float rms_norm_eps = 1e-5f;
};

class CpuWeights {
 public:
  // Throws an Error naming the parameter when one is missing or its shape is not this rank's share.
  CpuWeights(const model::ModelConfig& config, const model::ParamStore& params, const model::ParallelMapping& mapping);
  CpuWeights(CpuWeights&&) noexcept = default;
  CpuWeights(const CpuWeights&) = delete;
  CpuWeights& operator=(const CpuWeights&) = delete;

  const CpuLocalDims& dims() const { return dims_; }
  const CpuLayerWeights& layer(int l) const { return layers_[static_cast<size_t>(l)]; }
  const float* embed() const { return embed_; }
  const float* final_norm() const { return final_norm_; }
  const float* lm_head() const { return lm_head_; }
  const cpu::AttnResWeights& output_res() const { return output_res_; }
  uint64_t bytes() const;

 private:
  std::vector<Tensor> storage_;  // the fp32 copies the pointers below point into
  std::vector<CpuLayerWeights> layers_;
  CpuLocalDims dims_;
  const float* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  const float* lm_head_ = nullptr;
  cpu::AttnResWeights output_res_;
};

}  // namespace kimirt::runtime
