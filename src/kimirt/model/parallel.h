// Tensor / expert parallelism: which part of every parameter a rank holds, as data a loader executes without
// knowing the model (a list of (checkpoint key, region) -> (local region) copies per stored tensor).
//
// Rules (DESIGN.md "Parallelism rules", spec checkpoints-and-loading §1.3):
//   KDA, MLA     by heads over tp: q/k/v/g/f_b/b projections, conv weights, dt_bias and A_log rows; o_proj
//                columns; MLA q_b (q_proj) rows of whole heads (nope+rope per head), kv_b rows of whole heads
//                (each head's [k_nope | v] block kept together), g_proj rows; q_a/kv_a/f_a/g_a and all norms
//                replicated. Attention-DP: every rank holds all heads (it runs its own sequences).
//   lm_head      vocabulary rows over tp (also under attention-DP: the runtime gathers tokens first).
//   dense MLP,   fused [gate | up] rows (gate first, both halves cut the same way) and down_proj columns,
//   shared       over a TP subgroup whose size is the largest divisor of tp that divides the width (shard =
//   experts      tp_rank mod subgroup size); replicated under attention-DP.
//   routed       EP: contiguous expert ranges; MoE-TP (moe_tp = tp / ep > 1): w1/w3 rows and w2 columns of
//   experts      the intermediate dimension. Quantized bytes and scales are cut consistently; a cut through an
//                MX group, an NVFP4 group or an FP8 128x128 block is refused.
//   the rest     (embedding, norms, AttnRes, router, latent projections) replicated.
#pragma once

#include <string>
#include <vector>

#include "kimirt/model/schema.h"
#include "kimirt/quant/slice.h"

namespace kimirt::model {

struct ParallelMapping {
  int tp_size = 1;
  int tp_rank = 0;
  int ep_size = 1;
  int ep_rank = 0;
  bool attention_dp = false;

  // EP varies fastest among the tp ranks (TRT-LLM's convention): ep_rank = tp_rank mod ep_size, and the
  // MoE-TP rank is tp_rank / ep_size.
  static ParallelMapping make(int tp_size, int tp_rank, int ep_size = 1, bool attention_dp = false);
  int moe_tp_size() const { return tp_size / ep_size; }
  int moe_tp_rank() const { return tp_rank / ep_size; }
  std::string str() const;  // "tp 1/2, ep 0/2, moe_tp 1, attention-DP off"

  // Sizes >= 1, ranks in range, ep divides tp and ep_rank matches tp_rank, MoE-TP only with attention-DP off.
  void validate() const;
  // validate() plus what the model requires: tp divides the KDA and MLA heads (attention-DP off) and the
  // vocabulary, ep divides the experts, moe_tp divides moe_intermediate_size.
  void validate(const ModelConfig& config) const;
  bool operator==(const ParallelMapping&) const = default;
};

// The TP group a dense MLP of this width runs on: the largest divisor of tp_size that divides width.
int mlp_tp_size(int tp_size, int64_t width);

enum class SliceKind : uint8_t {
  kWhole,      // the whole parameter (replicated, or a whole routed expert on its EP rank)
  kRows,       // rows [begin, end) (heads, vocabulary, intermediate)
  kColumns,    // columns [begin, end) (o_proj heads, down_proj / w2 intermediate)
  kFusedRows,  // rows [begin, end) of each source, stacked in source order ([gate | up])
  kNotHeld,    // a routed expert of another EP rank
};

std::string_view slice_kind_name(SliceKind kind);

// The slice of one stored component (data, block scale, ...) of a parameter: where each source's tensor is
// read and where it lands in the local tensor. Regions are in the canonical component shapes that
// Schema::normalize returns.
struct ComponentSlice {
  int component = 0;              // index into quant::format_components(format)
  std::vector<std::string> keys;  // checkpoint key per source (rule.copies[i].source indexes this)
  quant::SliceRule rule;
};

struct ParamSlice {
  const ParamSpec* spec = nullptr;
  SliceKind kind = SliceKind::kWhole;
  int64_t begin = 0;  // the range taken on the sliced dimension (of each source for kFusedRows)
  int64_t end = 0;
  int32_t local_expert = -1;  // slot among this rank's experts
  Shape local_shape;          // logical shape this rank holds
  quant::SliceRule logical;   // the slice in logical coordinates (sources' shapes -> local_shape)
  std::vector<ComponentSlice> components;

  bool held() const { return kind != SliceKind::kNotHeld; }
  std::string describe() const;  // "rows [64, 128) of [256, 64]"
};

// This rank's slice of one parameter. The mapping must be valid for the schema's config (validate(config)).
// Throws naming the tensor when the slice cuts a quantization block.
ParamSlice slice_param(const Schema& schema, const ParamSpec& spec, const ParallelMapping& mapping);
// The same in logical coordinates only (`components` left empty): what a rank holds whatever the storage
// format, for a consumer of already-loaded parameters that must not re-derive formats from the config.
ParamSlice slice_logical(const ModelConfig& config, const ParamSpec& spec, const ParallelMapping& mapping);
// validate(config), then every parameter's slice in schema order (not-held experts included).
std::vector<ParamSlice> slice_all(const Schema& schema, const ParallelMapping& mapping);

}  // namespace kimirt::model
