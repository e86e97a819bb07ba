// The per-expert streaming protocol (spec checkpoints-and-loading §1.6), as one object that every source of
// bytes drives, so that a change to the prepare/finalize contract lands once (the seed PR's reviewers found
// it copied into each loader path):
//   - a layer is prepared when the first bytes of any of its slots arrive, never before (preparing every
//     layer up front is what ran TRT-LLM's MegaMoE backend out of memory), and writers of that layer wait
//     until it is;
//   - a slot is loaded when all its bytes have landed; more bytes than it has is an error (filled twice);
//   - a layer is finalized exactly once, by whichever thread lands its last slot; the completeness test and
//     the "finalized" mark are one critical section, the finalize call itself runs outside it;
//   - at the end every slot must be loaded and every layer with slots finalized, else an error names them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kimirt/model/load_target.h"

namespace kimirt::model {

class ExpertStream {
 public:
  ExpertStream(std::span<const ExpertSlot> slots, LoadTarget& target);
  ExpertStream(const ExpertStream&) = delete;
  ExpertStream& operator=(const ExpertStream&) = delete;

  // Call before writing bytes of slot `slot` (an index into `slots`): prepares its layer on first arrival.
  void arriving(int32_t slot);
  // Call after `bytes` of slot `slot` have been written.
  void landed(int32_t slot, uint64_t bytes);
  // Throws kimirt::Error naming each layer with slots not loaded (up to 10 per layer) or not finalized.
  void check_complete() const;

  size_t layers_finalized() const;

 private:
  struct Layer {
    int32_t layer = 0;
    int32_t slots = 0;
    int32_t loaded = 0;  // under mutex
    bool finalized = false;
    std::atomic<bool> prepared{false};
    std::mutex mutex;
  };

  std::span<const ExpertSlot> slots_;
  LoadTarget& target_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<uint32_t> layer_of_;                      // per slot: index into layers_
  std::unique_ptr<std::atomic<uint64_t>[]> remaining_;  // per slot: bytes still to land
};

}  // namespace kimirt::model
