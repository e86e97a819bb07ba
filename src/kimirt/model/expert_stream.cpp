#include "kimirt/model/expert_stream.h"

#include <fmt/format.h>

#include "kimirt/base/error.h"

namespace kimirt::model {

ExpertStream::ExpertStream(std::span<const ExpertSlot> slots, LoadTarget& target)
    : slots_(slots), target_(target), remaining_(new std::atomic<uint64_t>[slots.size()]) {
  layer_of_.reserve(slots.size());
  for (size_t s = 0; s < slots.size(); ++s) {
    const ExpertSlot& slot = slots[s];
    if (layers_.empty() || layers_.back()->layer != slot.layer) {
      for (const auto& l : layers_) KIMIRT_ASSERT(l->layer != slot.layer);  // the plan groups slots by layer
      layers_.push_back(std::make_unique<Layer>());
      layers_.back()->layer = slot.layer;
    }
    ++layers_.back()->slots;
    layer_of_.push_back(static_cast<uint32_t>(layers_.size() - 1));
    remaining_[s].store(slot.bytes);
  }
}

void ExpertStream::arriving(int32_t slot) {
  Layer& layer = *layers_[layer_of_[static_cast<size_t>(slot)]];
  if (layer.prepared.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(layer.mutex);
  if (layer.prepared.load(std::memory_order_relaxed)) return;
  target_.prepare_layer(layer.layer);
  // Marked only after prepare returned: a racing reader of the flag can only err towards waiting.
  layer.prepared.store(true, std::memory_order_release);
}

void ExpertStream::landed(int32_t slot, uint64_t bytes) {
  const auto s = static_cast<size_t>(slot);
  const ExpertSlot& info = slots_[s];
  const uint64_t before = remaining_[s].fetch_sub(bytes);
  KIMIRT_CHECK(before >= bytes, "layer {} expert {} (slot {}): {} more bytes landed than the slot holds", info.layer,
               info.expert, info.local_expert, bytes - before);
  if (before != bytes) return;
  target_.slot_loaded(info);
  Layer& layer = *layers_[layer_of_[s]];
  bool finalize = false;
  {
    std::lock_guard<std::mutex> lock(layer.mutex);
    ++layer.loaded;
    if (layer.loaded == layer.slots && !layer.finalized) {
      layer.finalized = true;
      finalize = true;
    }
  }
  if (finalize) target_.finalize_layer(layer.layer);
}

void ExpertStream::check_complete() const {
  std::string problems;
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& layer = *layers_[li];
    std::string missing;
    int count = 0;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (layer_of_[s] != li || remaining_[s].load() == 0) continue;
      if (count++ < 10)
        missing +=
            fmt::format("{}{} (expert {})", missing.empty() ? "" : ", ", slots_[s].local_expert, slots_[s].expert);
    }
    if (count > 10) missing += fmt::format(" and {} more", count - 10);
    if (count > 0) {
      problems += fmt::format("{}layer {}: {} of {} expert slot(s) never completed: {}", problems.empty() ? "" : "; ",
                              layer.layer, count, layer.slots, missing);
    } else if (!layer.finalized) {
      problems += fmt::format("{}layer {}: every slot loaded but the layer was never finalized",
                              problems.empty() ? "" : "; ", layer.layer);
    }
  }
  KIMIRT_CHECK(problems.empty(), "routed experts incomplete: {}", problems);
}

size_t ExpertStream::layers_finalized() const {
  size_t n = 0;
  for (const auto& l : layers_) n += l->finalized;
  return n;
}

}  // namespace kimirt::model
