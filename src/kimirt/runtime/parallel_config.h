// How one run is spread over a group of ranks: the group size (tp), expert parallelism (ep), attention data
// parallelism, and how the MoE block communicates. model::ParallelMapping says which slice of every weight a
// rank holds; this adds what only the runtime cares about, and checks the combination as a whole.
//
// The MoE block's collectives, per MoE layer of a group of tp > 1 ranks (what the count test checks):
//   direct       (attention-DP off; the default) Every rank holds every token. Each runs its part of the
//                routed experts (an EP range of whole experts, each cut to its MoE-TP slice when ep < tp) on
//                every token's latent, and its slice of the shared experts; the two partial results,
//                concatenated [shared | routed latent], are summed with ONE all-reduce. The routed latent is
//                then complete on every rank, normalized and projected up. 1 all-reduce.
//   all_to_all   (attention-DP off, ep == tp) Rank r owns the token share [r·T/tp, (r+1)·T/tp). It routes its
//                share: all-to-all-v of the per-rank pair counts, all-to-all-v dispatch of each (token, expert)
//                pair's latent row to the expert's rank, the experts run on what they received, all-to-all-v
//                combine of the outputs back. The share's routed latent is then complete on its owner and is
//                normalized and projected up there. The shared experts keep their own reduction (all-reduce
//                #1), and the token shares are reassembled on every rank by an all-reduce of the zero-padded
//                [T, H] output (all-reduce #2; exact, as each element has one non-zero term).
//                3 all-to-all-v + 2 all-reduces (1 without shared experts).
//   attention-DP Every rank has its own sequences, so the MoE always takes the all-to-all path over the rank's
//                own tokens; shared experts are replicated and need no reduction. 3 all-to-all-v, no all-reduce.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kimirt/model/config.h"
#include "kimirt/model/parallel.h"

namespace kimirt::runtime {

enum class MoeComm : uint8_t { kDirect, kAllToAll };

std::string_view moe_comm_name(MoeComm mode);  // "direct", "all_to_all"
// Throws an Error naming --moe-comm for any other name.
MoeComm parse_moe_comm(std::string_view name);

struct ParallelConfig {
  int tp = 1;
  int ep = 1;
  bool attention_dp = false;
  MoeComm moe_comm = MoeComm::kDirect;

  // Rank `rank`'s weight slicing (EP rank = rank mod ep).
  model::ParallelMapping mapping(int rank) const;
  // The path the MoE block takes: all-to-all whenever attention-DP is on.
  MoeComm effective_moe_comm() const { return attention_dp ? MoeComm::kAllToAll : moe_comm; }
  std::string str() const;  // "tp 4, ep 2, attention-DP off, MoE direct"

  // The combination on its own: sizes, ep divides tp (moe_tp × moe_ep == tp), no MoE-TP under attention-DP,
  // whole experts per rank on the all-to-all path. Throws naming the flag (--tp, --ep, ...).
  void validate() const;
  // validate() and what the model needs (tp divides the heads and the vocabulary, ep the experts, moe_tp
  // the expert width).
  void validate(const model::ModelConfig& config) const;
  bool operator==(const ParallelConfig&) const = default;
};

}  // namespace kimirt::runtime
