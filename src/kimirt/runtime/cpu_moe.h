// The MoE FFN of one rank on the CPU (spec §3.7, DESIGN.md "Parallelism rules"), on the path its
// ParallelConfig chooses (the collectives of each path: parallel_config.h):
//   direct      the replicated router picks experts for every token; this rank runs its experts (an EP range,
//               each possibly an intermediate slice under MoE-TP) and its slice of the shared experts; the two
//               partial results are reduced with ONE all-reduce of [shared | routed latent], and only then is
//               the routed latent normalized and projected up.
//   all_to_all  tokens travel to their experts' ranks and back (MoeExchange); the routed latent of each
//               token is complete on the rank that owns the token before the norm; the shared experts keep
//               their own reduction (replicated, without one, under attention-DP).
// When the shared experts run on a TP subgroup smaller than the group (tp does not divide their width), only
// the first copy of each shard (ranks below the subgroup size) adds its partial to a group-wide reduction.
// At tp = 1 both paths are exactly cpu::moe_forward's arithmetic.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kimirt/comm/comm.h"
#include "kimirt/cpu/moe.h"
#include "kimirt/model/config.h"
#include "kimirt/model/parallel.h"
#include "kimirt/runtime/backend.h"
#include "kimirt/runtime/cpu_weights.h"
#include "kimirt/runtime/moe_exchange.h"
#include "kimirt/runtime/op_trace.h"
#include "kimirt/runtime/parallel_config.h"

namespace kimirt::runtime {

class CpuMoe {
 public:
  // comm: the whole group of `mapping` (size tp_size); config must outlive this object.
  // mode: ParallelConfig::effective_moe_comm() (all-to-all under attention-DP).
  CpuMoe(const model::ModelConfig& config, const CpuLocalDims& dims, const model::ParallelMapping& mapping,
         MoeComm mode, Comm& comm);

  // out[tokens, H] = MoE(x[tokens, H]) over this rank's tokens (the step's tokens, which are the same on every
  // rank with attention-DP off and the rank's own under attention-DP; zero is allowed). Collective. out must
  // not overlap x. trace, when given, receives the router's choice for every token; tracer sees the
  // TracePoints.
  void forward(int layer, const CpuLayerWeights& w, const float* x, int64_t tokens, float* out, RouteTrace* trace,
               OpTracer* tracer);

 private:
  void direct(int layer, const CpuLayerWeights& w, const float* x, int64_t tokens, float* out, OpTracer* tracer);
  void exchanged(int layer, const CpuLayerWeights& w, const float* x, int64_t tokens, float* out, OpTracer* tracer);
  // shared_[tokens, H] = this rank's share of the shared experts (zero when it is not a contributor).
  void shared_partial(const CpuLayerWeights& w, const float* x, int64_t tokens, float* dst);
  // This rank's experts of a layer, for cpu::routed_experts and cpu::run_expert_rows.
  cpu::ExpertShard shard(const CpuLayerWeights& w) const;
  // Experts of this rank over the rows the exchange delivered, grouped by expert.
  void run_received(const CpuLayerWeights& w);
  // The latent is complete: norm (traced), then up-projection into out[rows, H].
  void finish_latent(int layer, const CpuLayerWeights& w, float* latent, int64_t rows, float* out, OpTracer* tracer);

  const model::ModelConfig& config_;
  const CpuLocalDims dims_;
  MoeComm mode_;
  bool attention_dp_;
  bool shared_contributor_;
  Comm& comm_;
  std::optional<MoeExchange> exchange_;  // the all-to-all path only

  // Scratch, reused from call to call.
  std::vector<int32_t> ids_;
  std::vector<float> weights_, z_, partial_, shared_, latent_, pairs_, full_;
  std::vector<int64_t> slots_;
};

}  // namespace kimirt::runtime
