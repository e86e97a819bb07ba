// The load plan: schema x checkpoint x parallel mapping, joined before any tensor byte is read
// (spec checkpoints-and-loading §0.1, §1.1, §1.9). It lists
//   - the exact checkpoint keys this rank needs: a missing one is an error that lists them all; a key the
//     schema does not know is a warning (an error when strict). Vision-tower keys and other ranks' experts
//     are neither;
//   - every stored tensor's dtype and shape, checked through Schema::normalize against what the parameter
//     needs (A_log's zero padding is checked when its bytes arrive);
//   - one read per needed tensor, trimmed to the rows this rank uses, grouped by shard file in file order;
//   - for each read, the byte blocks that go to each destination: one per stored component of each held
//     parameter, in this rank's shape, with the routed experts grouped into per-layer slots.
// A destination's blocks fill it exactly once (checked here); the loader only moves bytes.
//
// The plan points into the checkpoint and the schema it was built from: both must outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/io/checkpoint.h"
#include "kimirt/io/read_engine.h"
#include "kimirt/model/key_index.h"
#include "kimirt/model/parallel.h"
#include "kimirt/model/schema.h"
#include "kimirt/quant/scale_codes.h"

namespace kimirt::model {

// Tensors a text model never reads: the vision tower and its projector (released with K3), at the top level or
// under the checkpoint's prefix (`language_model.`). Neither loaded nor reported (TRT-LLM does not report them
// either), and `inspect` does not hold them to the text model's weight formats.
bool text_model_ignores(std::string_view key, std::string_view prefix);

// One destination tensor: a stored component (data, block scale, ...) of a held parameter, in this rank's
// shape and the component's canonical dtype (Schema::normalize: packed FP4 as U8).
struct PlannedDest {
  uint32_t param = 0;  // index into LoadPlan::params()
  int component = 0;   // index into quant::format_components(format of the parameter)
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t bytes = 0;
  quant::ScaleCode scale = quant::ScaleCode::kNone;  // how its values are block scales (checked while loading)
};

struct PlannedParam {
  const ParamSpec* spec = nullptr;
  ParamSlice slice;
  quant::WeightFormat format = quant::WeightFormat::kFloat;
  std::vector<uint32_t> dests;  // one per ComponentSlice of `slice`, same order
  int32_t slot = -1;            // a routed expert: index into LoadPlan::expert_slots()
};

// The w1/w2/w3 of one routed expert on this rank: the unit the per-expert protocol fills.
struct ExpertSlot {
  int32_t layer = 0;
  int32_t local_expert = 0;  // slot number within the layer on this rank
  int32_t expert = 0;        // global expert id
  uint64_t bytes = 0;        // bytes of all its destinations
  std::vector<uint32_t> params;
};

// A rectangle of bytes moved from a read to a destination: `rows` rows of `width` bytes; row r comes from
// src_offset + r * src_pitch of the read and goes to dst_offset + r * dst_pitch of the destination.
struct CopyBlock {
  uint32_t dest = 0;
  uint64_t src_offset = 0;
  uint64_t src_pitch = 0;
  uint64_t dst_offset = 0;
  uint64_t dst_pitch = 0;
  uint64_t width = 0;
  uint64_t rows = 0;

  uint64_t bytes() const { return width * rows; }
  uint64_t src_end() const { return rows == 0 ? src_offset : src_offset + (rows - 1) * src_pitch + width; }
};

// One stored tensor this rank reads (once, even when two parameters use it: a tied lm_head).
struct PlannedRead {
  std::string key;
  const io::SafetensorsFile* shard = nullptr;
  const io::TensorInfo* info = nullptr;
  uint64_t offset = 0;  // absolute file offset of the first byte read (the tensor's start plus the trim)
  uint64_t length = 0;
  // A tensor whose values must be checked before use (A_log's padding) is read whole and checked through
  // Schema::normalize when complete; `spec`, `source` and `component` say how.
  bool check_values = false;
  // A block scale of more than one byte per value (FP8's F32 / BF16 scales, a few per 16 K weights): read whole
  // and delivered piece by piece as any read, and also gathered, its values checked once complete
  // (quant/scale_codes.h), since a piece may end inside a value. One-byte codes are checked as they pass.
  bool check_scales_whole = false;
  const ParamSpec* spec = nullptr;
  uint32_t source = 0;
  uint32_t component = 0;
  std::vector<CopyBlock> blocks;  // src offsets relative to `offset`, ascending
};

struct PlannedFile {
  const io::SafetensorsFile* shard = nullptr;
  std::vector<uint32_t> reads;  // indices into LoadPlan::reads(), ascending file offset
  uint64_t bytes = 0;
};

class LoadPlan {
 public:
  // Throws kimirt::Error naming the checkpoint and every missing key, or the key of a tensor whose dtype or
  // shape does not fit (and, when strict, listing the unexpected keys). Validates `mapping` for the config.
  static LoadPlan build(const io::Checkpoint& checkpoint, const Schema& schema, const ParallelMapping& mapping,
                        bool strict = false);

  const Schema& schema() const { return *schema_; }
  const ParallelMapping& mapping() const { return mapping_; }
  const std::vector<PlannedParam>& params() const { return params_; }
  const std::vector<PlannedDest>& dests() const { return dests_; }
  const std::vector<PlannedRead>& reads() const { return reads_; }
  const std::vector<PlannedFile>& files() const { return files_; }
  const std::vector<ExpertSlot>& expert_slots() const { return slots_; }  // by layer, then local expert
  // Checkpoint keys the schema does not know (one entry each), as warned about.
  const std::vector<std::string>& unexpected_keys() const { return unexpected_; }

  uint64_t read_bytes() const;  // sum of read lengths
  uint64_t dest_bytes() const;  // sum of destination sizes
  // The files' reads as the read engine takes them (range id = read index).
  std::vector<io::FileRanges> file_ranges() const;

 private:
  const Schema* schema_ = nullptr;
  ParallelMapping mapping_;
  std::vector<PlannedParam> params_;
  std::vector<PlannedDest> dests_;
  std::vector<PlannedRead> reads_;
  std::vector<PlannedFile> files_;
  std::vector<ExpertSlot> slots_;
  std::vector<std::string> unexpected_;
};

// The checkpoint's keys with their dtypes (from the shard headers), for Schema::for_checkpoint.
KeyIndex checkpoint_keys(const io::Checkpoint& checkpoint);

// The byte rectangles that copy region `src_region` of a row-major tensor of shape `src_shape` into region
// `dst_region` of one of shape `dst_shape`, elements of `element_bytes` (regions of equal extents).
// Dimensions that are whole on both sides are merged, so a row range or a whole tensor is one block.
std::vector<CopyBlock> region_blocks(const Shape& src_shape, const quant::Region& src_region, const Shape& dst_shape,
                                     const quant::Region& dst_region, uint64_t element_bytes, uint32_t dest);

}  // namespace kimirt::model
