// Slice rules and the reference executor of them. The rules (Region, RegionCopy, SliceRule) are computed by
// model/parallel (which rows, columns, heads or experts a rank holds) and quant/weight_format (how a logical
// region maps onto packed data and scale grids), and the loader executes them on staged bytes through
// model/load_plan's region_blocks. copy_region and apply_slice* below are NOT on that path: they copy whole
// tensors in memory, element by element, as the plainest statement of what a rule means, and serve the tests
// as the oracle the loader's output is compared with. They move bytes only, so they work for every dtype,
// packed FP4 included, without knowing the model.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kimirt/tensor/tensor.h"

namespace kimirt::quant {

// A box [begin, begin + extent) in each dimension. Rank 0 is the single element of a scalar tensor.
struct Region {
  Shape begin;
  Shape extent;

  static Region full(std::span<const int64_t> shape);
  int rank() const { return static_cast<int>(begin.size()); }
  int64_t numel() const { return shape_numel(extent); }
  std::string str() const;  // "[0:4, 8:16]"
  bool operator==(const Region&) const = default;
};

// Copies src[src_region] into dst[dst_region]. The two regions must have equal extents and lie inside their
// tensors; the dtypes must match. Packed F4 regions must start and end on a byte along the last dimension.
void copy_region(const TensorView& src, const Region& src_region, const TensorView& dst, const Region& dst_region);

// One copy of a slice: region `src` of source number `source` goes to region `dst` of the destination.
struct RegionCopy {
  int source = 0;
  Region src;
  Region dst;
  bool operator==(const RegionCopy&) const = default;
};

// Everything needed to build one local tensor from one or more full tensors of the same dtype: the
// destination shape and the copies that fill it (exactly once, as the plan guarantees).
struct SliceRule {
  Shape dst_shape;
  std::vector<RegionCopy> copies;
  bool operator==(const SliceRule&) const = default;
};

// Allocates the destination (dtype of the sources) and performs the rule's copies. Throws when a copy
// names a missing source, does not fit, or the copies do not add up to the destination's size.
Tensor apply_slice(std::span<const TensorView> sources, const SliceRule& rule);
Tensor apply_slice(const TensorView& full, const SliceRule& rule);
// The same into a destination the caller owns (a staging or final buffer) of shape rule.dst_shape and the
// sources' dtype; elements no copy names are left as they were.
void apply_slice_into(std::span<const TensorView> sources, const SliceRule& rule, const TensorView& dst);

}  // namespace kimirt::quant
