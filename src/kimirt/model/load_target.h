// Where a load puts the bytes: the interface between the loader (which reads and routes them) and whoever
// owns the destination memory. The host implementation (loader.h, ParamStoreTarget) fills a ParamStore;
// the CUDA backend implements it with device buffers, uploading asynchronously from the pinned staging ring
// it supplies through staging_allocator().
//
// Call order for one load: begin; then, from several I/O threads at once, write (to any destination, in any
// order; the byte ranges of different calls never overlap), prepare_layer before the first write to an
// expert slot of that layer, slot_loaded when a slot's last byte has been written, finalize_layer once
// when a layer's last slot has; then finish. On any error: abandon (instead of finish), after which the
// target must hold nothing of this load.
//
// An asynchronous target (writes_async) is told "written" when its copies were issued, not completed: work
// in finalize_layer must be ordered after that layer's copies (same stream, or an event), and finish must
// wait for all of them.
#pragma once

#include <cstdint>

#include "kimirt/io/read_engine.h"
#include "kimirt/model/load_plan.h"

namespace kimirt::model {

// `rows` rows of `width` bytes: row r from src + r * src_pitch into bytes dst_offset + r * dst_pitch of
// destination `dest` (LoadPlan::dests()).
struct StagedWrite {
  uint32_t dest = 0;
  uint64_t dst_offset = 0;
  uint64_t dst_pitch = 0;
  const uint8_t* src = nullptr;
  uint64_t src_pitch = 0;
  uint64_t width = 0;
  uint64_t rows = 0;
  // The staging buffer `src` lies in (fence() names it again before the buffer is reused), or -1 for host
  // memory that is only valid during the call (the target must copy it before returning).
  int staging_slot = -1;
};

class LoadTarget {
 public:
  virtual ~LoadTarget() = default;

  // The staging memory to read into (pinned memory for a device target); nullptr: plain host memory.
  virtual io::StagingAllocator* staging_allocator() { return nullptr; }
  // True when write() may return before it has finished reading `src` (asynchronous copies).
  virtual bool writes_async() const { return false; }

  // The plan's destinations (dtype, shape, owning parameter) are known from here on.
  virtual void begin(const LoadPlan& plan) = 0;
  virtual void write(const StagedWrite& w) = 0;
  // Before staging buffer `staging_slot` is filled again: returns when no write still reads from it.
  virtual void fence(int staging_slot) { (void)staging_slot; }

  // The routed-expert protocol (spec checkpoints-and-loading §1.6): a layer is prepared when its first slot's
  // first bytes arrive, each slot reports loaded exactly once, a layer is finalized once, after its last slot.
  virtual void prepare_layer(int32_t layer) { (void)layer; }
  virtual void slot_loaded(const ExpertSlot& slot) { (void)slot; }
  virtual void finalize_layer(int32_t layer) { (void)layer; }

  // Every destination is complete: commit.
  virtual void finish() = 0;
  // The load failed: drop everything it wrote.
  virtual void abandon() noexcept = 0;
};

}  // namespace kimirt::model
