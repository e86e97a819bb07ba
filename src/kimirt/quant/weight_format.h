// How a weight is stored in a checkpoint: which tensors under "<base>." hold it, their dtypes and shapes,
// and how a region of the logical weight maps onto each of them. Used by the schema (expected keys), the
// load plan (reads and slices), the dequantizers and `kimirt inspect`.
//
// The format of a weight is decided by the tensors present and their dtypes, never by the config's
// ignore regexes: an FP8 weight has the same shape as a BF16 one, so a loader that trusted names alone
// would load it "clean" and generate nonsense (spec checkpoints-and-loading §1.4).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kimirt/quant/slice.h"
#include "kimirt/tensor/tensor.h"

namespace kimirt::quant {

enum class WeightFormat : uint8_t {
  kFloat,                   // <base>.weight in a plain float dtype (F32, F16, BF16, F64)
  kMxfp4,                   // compressed-tensors mxfp4-pack-quantized: weight_packed U8 + weight_scale E8M0
  kFp8BlockScaleInv,        // DeepSeek: weight F8_E4M3 + weight_scale_inv F32 [ceil(N/128), ceil(K/128)]
  kFp8BlockScale,           // compressed-tensors FP8_BLOCK / ModelOpt FP8_PB_WO: weight F8_E4M3 + weight_scale
  kNvfp4ModelOpt,           // weight U8 + weight_scale E4M3 per 16 + weight_scale_2 F32 (multiplies)
  kNvfp4CompressedTensors,  // weight_packed U8 + weight_scale E4M3 per 16 + weight_global_scale F32 (divides)
};

inline constexpr WeightFormat kAllWeightFormats[] = {
    WeightFormat::kFloat,         WeightFormat::kMxfp4,         WeightFormat::kFp8BlockScaleInv,
    WeightFormat::kFp8BlockScale, WeightFormat::kNvfp4ModelOpt, WeightFormat::kNvfp4CompressedTensors};

std::string_view format_name(WeightFormat format);  // "float", "mxfp4", "fp8-block", ...
bool is_quantized(WeightFormat format);
bool is_packed_fp4_data(WeightFormat format);  // two E2M1 values per data byte (MXFP4, NVFP4)

// A set of formats, e.g. what a parameter may be stored as.
class FormatSet {
 public:
  constexpr FormatSet() = default;
  constexpr FormatSet(std::initializer_list<WeightFormat> formats) {
    for (auto f : formats) bits_ |= bit(f);
  }
  static constexpr FormatSet float_only() { return {WeightFormat::kFloat}; }
  static constexpr FormatSet all() {
    FormatSet s;
    for (auto f : kAllWeightFormats) s.bits_ |= bit(f);
    return s;
  }
  constexpr bool contains(WeightFormat f) const { return (bits_ & bit(f)) != 0; }
  std::string str() const;  // "float|mxfp4"
  constexpr bool operator==(const FormatSet&) const = default;

 private:
  static constexpr uint32_t bit(WeightFormat f) { return 1u << static_cast<uint32_t>(f); }
  uint32_t bits_ = 0;
};

enum class ComponentRole : uint8_t { kData, kBlockScale, kGlobalScale, kInputScale };

// One stored tensor of a weight. Its element (i, j) stands for the logical elements in rows
// [i*tile_rows, (i+1)*tile_rows) and columns [j*tile_cols, (j+1)*tile_cols): 1x1 for plain data, 1x2 for
// packed FP4 bytes, 1x32 for MX scales, 1x16 for NVFP4 scales, 128x128 for FP8 block scales. A per-tensor
// scalar has tile_rows == 0. Plain float data may have any rank; the others describe a 2-D [out, in] weight.
struct Component {
  std::string_view suffix;
  ComponentRole role;
  bool required;
  int64_t tile_rows;
  int64_t tile_cols;

  bool scalar() const { return tile_rows == 0; }
};

// The tensors of a format, data first. The index into this list identifies a component elsewhere.
std::span<const Component> format_components(WeightFormat format);
// Index of the component with this suffix in the format, or -1.
int component_index(WeightFormat format, std::string_view suffix);
// True for a suffix that belongs to some weight format ("weight", "weight_packed", "weight_scale", ...).
bool is_component_suffix(std::string_view suffix);

// Whether a component may be stored in this dtype.
bool component_accepts(WeightFormat format, const Component& component, DType dtype);
// The canonical stored shape of a component for a weight of logical shape `logical`.
Shape component_shape(WeightFormat format, const Component& component, std::span<const int64_t> logical);

// A tensor found under a weight's base name: its suffix ("weight_scale") and, when the header has been
// read, its dtype (an index file only gives names).
struct PresentTensor {
  std::string suffix;
  std::optional<DType> dtype;
};

// Decides the format of the weight stored under `base` from the component tensors present. Suffixes that
// belong to no format are ignored (the router's "gate.e_score_correction_bias" lives under the same base as
// "gate.weight"). Throws naming `base` for an FP8 weight without its scale, a packed weight without its
// scales, or a mix of two formats' tensors.
WeightFormat detect_weight_format(std::string_view base, std::span<const PresentTensor> present);

// Checks a stored component against the format and the logical shape and returns it in canonical form:
// FP8 block scales stored 4-D [nbN, 1, nbK, 1] become 2-D, packed data stored as F4 [N, K] becomes U8
// [N, K/2], scalars stored as [1] become rank 0. `key` names the tensor in errors.
TensorView normalize_component(WeightFormat format, const Component& component, const TensorView& stored,
                               std::span<const int64_t> logical, std::string_view key);

// Maps a region of the logical weight to the region of `component` that holds exactly those elements. The
// region must not cut a tile (an MX scale group, an FP8 128x128 block, a packed byte), except at the end of
// the weight where the last tile may be partial; otherwise throws naming `key` and the sizes. A scalar
// component maps to its whole self.
Region component_region(const Component& component, std::span<const int64_t> logical, const Region& region,
                        std::string_view key);

}  // namespace kimirt::quant
