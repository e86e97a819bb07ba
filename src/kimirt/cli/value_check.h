// `kimirt inspect --check-values`: every tensor whose dtype can hold NaN or infinity read once and its NaN and
// infinite values counted (tensor/finite_values.h). The reads are the loader's (io/read_engine.h: large
// sequential reads, bounded staging memory, the page cache dropped behind them), so the check runs near disk
// speed and holds no more than the staging memory, whatever the checkpoint's size. The MX block scales that
// compressed-tensors stores as U8 are counted as the E8M0 values they are (0xFF: NaN); packed E2M1 weights and
// integer tensors have no such codes and are not read. Block scales are also held to the loader's rule
// (quant/scale_codes.h): negative ones, and ones so large that their weights overflow float, are refused there, so
// they are named here too (inspect had said "ok" for a checkpoint that run refuses).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kimirt/io/checkpoint.h"
#include "kimirt/quant/scale_codes.h"

namespace kimirt::cli {

struct NonfiniteTensor {
  std::string name;
  std::string shard;
  std::string dtype;       // as counted ("F8_E8M0" for a U8 MX scale)
  uint64_t elements = 0;   // of the tensor
  uint64_t nonfinite = 0;  // NaN or infinite among them
  uint64_t first = 0;      // the flat index of the first
};

// A block-scale tensor holding scales the loader refuses beyond NaN and infinity (reported as NonfiniteTensor).
struct InvalidScaleTensor {
  std::string name;
  std::string shard;
  std::string dtype;      // as counted
  uint64_t elements = 0;  // of the tensor
  uint64_t invalid = 0;   // NaN, infinite, negative or overflowing, all counted
  uint64_t nonfinite = 0;
  uint64_t first = 0;  // the flat index of the first invalid one
};

struct ValueCheck {
  uint64_t tensors = 0;  // read and counted
  uint64_t skipped = 0;  // without NaN or infinity codes, not read
  uint64_t bytes = 0;    // read
  double seconds = 0;
  std::vector<NonfiniteTensor> nonfinite;          // by shard, then in the shard's data order
  std::vector<InvalidScaleTensor> invalid_scales;  // those with invalid scales other than NaN or infinity
};

// `block_scales`: the tensors that are block scales, with how their values encode a scale (quant::block_scale_code;
// kE8M0 whatever the dtype: an MXFP4 weight's block scales, stored as U8 by compressed-tensors). Throws what
// reading throws (io::SafetensorsError naming the shard and tensor).
ValueCheck check_values(const io::Checkpoint& checkpoint, const std::map<std::string, quant::ScaleCode>& block_scales,
                        bool progress);

}  // namespace kimirt::cli
