#include "kimirt/runtime/parallel_config.h"

#include <fmt/format.h>

#include "kimirt/base/error.h"

namespace kimirt::runtime {

std::string_view moe_comm_name(MoeComm mode) {
  switch (mode) {
    case MoeComm::kDirect:
      return "direct";
    case MoeComm::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

MoeComm parse_moe_comm(std::string_view name) {
  if (name == "direct") return MoeComm::kDirect;
  if (name == "all_to_all" || name == "all-to-all") return MoeComm::kAllToAll;
  fail("--moe-comm: \"{}\" is not a MoE communication mode (direct, all_to_all)", name);
}

model::ParallelMapping ParallelConfig::mapping(int rank) const {
  validate();
  return model::ParallelMapping::make(tp, rank, ep, attention_dp);
}

std::string ParallelConfig::str() const {
  return fmt::format("tp {}, ep {}, attention-DP {}, MoE {}", tp, ep, attention_dp ? "on" : "off",
                     moe_comm_name(effective_moe_comm()));
}

void ParallelConfig::validate() const {
  const std::string w = "parallel config (" + str() + ")";
  KIMIRT_CHECK(tp >= 1, "{}: --tp must be at least 1, got {}", w, tp);
  KIMIRT_CHECK(ep >= 1, "{}: --ep must be at least 1, got {}", w, ep);
  KIMIRT_CHECK(tp % ep == 0, "{}: --ep ({}) must divide --tp ({}): the MoE runs on moe_tp × moe_ep == tp ranks", w, ep,
               tp);
  KIMIRT_CHECK(!attention_dp || ep == tp,
               "{}: attention-DP gives every rank different tokens, which MoE tensor parallelism (moe_tp {}) "
               "cannot serve; use --ep {} (whole experts per rank)",
               w, tp / ep, tp);
  KIMIRT_CHECK(moe_comm != MoeComm::kAllToAll || ep == tp,
               "{}: --moe-comm all_to_all sends tokens to the rank that owns their expert, which needs whole experts "
               "per rank (--ep {}); with --ep {} use --moe-comm direct",
               w, tp, ep);
}

void ParallelConfig::validate(const model::ModelConfig& config) const {
  validate();
  // The model's rules do not depend on the rank: rank 0's mapping speaks for the group.
  model::ParallelMapping::make(tp, 0, ep, attention_dp).validate(config);
}

}  // namespace kimirt::runtime
