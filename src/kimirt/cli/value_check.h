// `kimirt inspect --check-values`: every tensor whose dtype can hold NaN or infinity read once and its NaN and
// infinite values counted (tensor/finite_values.h). The reads are the loader's (io/read_engine.h: large
// sequential reads, bounded staging memory, the page cache dropped behind them), so the check runs near disk
// speed and holds no more than the staging memory, whatever the checkpoint's size. The MX block scales that
// compressed-tensors stores as U8 are counted as the E8M0 values they are (0xFF: NaN); packed E2M1 weights and
// integer tensors have no such codes and are not read.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kimirt/io/checkpoint.h"

namespace kimirt::cli {

struct NonfiniteTensor {
  std::string name;
  std::string shard;
  std::string dtype;       // as counted ("F8_E8M0" for a U8 MX scale)
  uint64_t elements = 0;   // of the tensor
  uint64_t nonfinite = 0;  // NaN or infinite among them
  uint64_t first = 0;      // the flat index of the first
};

struct ValueCheck {
  uint64_t tensors = 0;  // read and counted
  uint64_t skipped = 0;  // without NaN or infinity codes, not read
  uint64_t bytes = 0;    // read
  double seconds = 0;
  std::vector<NonfiniteTensor> nonfinite;  // by shard, then in the shard's data order
};

// `e8m0_codes`: the tensors whose bytes are E8M0 scale codes whatever their dtype (quant::block_scale_code says
// kE8M0: an MXFP4 weight's block scales, stored as U8 by compressed-tensors). Throws what reading throws
// (io::SafetensorsError naming the shard and tensor).
ValueCheck check_values(const io::Checkpoint& checkpoint, const std::set<std::string>& e8m0_codes, bool progress);

}  // namespace kimirt::cli
