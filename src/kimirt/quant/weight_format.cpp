#include "kimirt/quant/weight_format.h"

#include <algorithm>
#include <array>
#include <vector>

#include <fmt/format.h>

namespace kimirt::quant {
namespace {

using R = ComponentRole;

constexpr int64_t kFp8Block = 128;
constexpr int64_t kMxGroup = 32;
constexpr int64_t kNvGroup = 16;

constexpr std::array<Component, 1> kFloatComponents = {{{"weight", R::kData, true, 1, 1}}};
constexpr std::array<Component, 2> kMxfp4Components = {{
    {"weight_packed", R::kData, true, 1, 2},
    {"weight_scale", R::kBlockScale, true, 1, kMxGroup},
}};
constexpr std::array<Component, 3> kFp8InvComponents = {{
    {"weight", R::kData, true, 1, 1},
    {"weight_scale_inv", R::kBlockScale, true, kFp8Block, kFp8Block},
    {"input_scale", R::kInputScale, false, 0, 0},
}};
constexpr std::array<Component, 3> kFp8Components = {{
    {"weight", R::kData, true, 1, 1},
    {"weight_scale", R::kBlockScale, true, kFp8Block, kFp8Block},
    {"input_scale", R::kInputScale, false, 0, 0},
}};
constexpr std::array<Component, 4> kNvfp4ModelOptComponents = {{
    {"weight", R::kData, true, 1, 2},
    {"weight_scale", R::kBlockScale, true, 1, kNvGroup},
    {"weight_scale_2", R::kGlobalScale, true, 0, 0},
    {"input_scale", R::kInputScale, false, 0, 0},
}};
constexpr std::array<Component, 4> kNvfp4CtComponents = {{
    {"weight_packed", R::kData, true, 1, 2},
    {"weight_scale", R::kBlockScale, true, 1, kNvGroup},
    {"weight_global_scale", R::kGlobalScale, true, 0, 0},
    {"input_global_scale", R::kInputScale, false, 0, 0},
}};

constexpr std::string_view kAllSuffixes[] = {"weight",           "weight_packed",     "weight_scale",
                                             "weight_scale_inv", "weight_scale_2",    "weight_global_scale",
                                             "input_scale",      "input_global_scale"};

bool is_plain_float(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16 || d == DType::kF64; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const PresentTensor* find(std::span<const PresentTensor> present, std::string_view suffix) {
  for (const auto& p : present) {
    if (p.suffix == suffix) return &p;
  }
  return nullptr;
}

std::string dtype_or_unknown(const PresentTensor* p) {
  return p && p->dtype ? std::string(dtype_name(*p->dtype)) : std::string("?");
}

}  // namespace

std::string_view format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kFloat:
      return "float";
    case WeightFormat::kMxfp4:
      return "mxfp4";
    case WeightFormat::kFp8BlockScaleInv:
      return "fp8-block(scale_inv)";
    case WeightFormat::kFp8BlockScale:
      return "fp8-block";
    case WeightFormat::kNvfp4ModelOpt:
      return "nvfp4(modelopt)";
    case WeightFormat::kNvfp4CompressedTensors:
      return "nvfp4(compressed-tensors)";
  }
  return "?";
}

bool is_quantized(WeightFormat format) { return format != WeightFormat::kFloat; }

bool is_packed_fp4_data(WeightFormat f) {
  return f == WeightFormat::kMxfp4 || f == WeightFormat::kNvfp4ModelOpt || f == WeightFormat::kNvfp4CompressedTensors;
}

std::string FormatSet::str() const {
  std::string out;
  for (auto f : kAllWeightFormats) {
    if (!contains(f)) continue;
    if (!out.empty()) out += "|";
    out += format_name(f);
  }
  return out.empty() ? "none" : out;
}

std::span<const Component> format_components(WeightFormat format) {
  switch (format) {
    case WeightFormat::kFloat:
      return kFloatComponents;
    case WeightFormat::kMxfp4:
      return kMxfp4Components;
    case WeightFormat::kFp8BlockScaleInv:
      return kFp8InvComponents;
    case WeightFormat::kFp8BlockScale:
      return kFp8Components;
    case WeightFormat::kNvfp4ModelOpt:
      return kNvfp4ModelOptComponents;
    case WeightFormat::kNvfp4CompressedTensors:
      return kNvfp4CtComponents;
  }
  return {};
}

int component_index(WeightFormat format, std::string_view suffix) {
  const auto comps = format_components(format);
  for (size_t i = 0; i < comps.size(); ++i) {
    if (comps[i].suffix == suffix) return static_cast<int>(i);
  }
  return -1;
}

bool is_component_suffix(std::string_view suffix) {
  return std::find(std::begin(kAllSuffixes), std::end(kAllSuffixes), suffix) != std::end(kAllSuffixes);
}

bool component_accepts(WeightFormat format, const Component& component, DType dtype) {
  switch (component.role) {
    case R::kData:
      if (format == WeightFormat::kFloat) return is_plain_float(dtype);
      if (is_packed_fp4_data(format)) return dtype == DType::kU8 || dtype == DType::kF4;
      return dtype == DType::kF8E4M3;
    case R::kBlockScale:
      if (format == WeightFormat::kMxfp4) return dtype == DType::kU8 || dtype == DType::kF8E8M0;
      if (format == WeightFormat::kNvfp4ModelOpt || format == WeightFormat::kNvfp4CompressedTensors) {
        return dtype == DType::kF8E4M3;
      }
      return is_plain_float(dtype);
    case R::kGlobalScale:
    case R::kInputScale:
      return is_plain_float(dtype);
  }
  return false;
}

Shape component_shape(WeightFormat format, const Component& component, std::span<const int64_t> logical) {
  if (component.scalar()) return {};
  if (format == WeightFormat::kFloat) return Shape(logical.begin(), logical.end());
  KIMIRT_CHECK(logical.size() == 2, "a {} weight must be 2-D, got {}", format_name(format), shape_str(logical));
  return {ceil_div(logical[0], component.tile_rows), ceil_div(logical[1], component.tile_cols)};
}

WeightFormat detect_weight_format(std::string_view base, std::span<const PresentTensor> present) {
  std::vector<std::string_view> known;
  for (const auto& p : present) {
    if (is_component_suffix(p.suffix)) known.push_back(p.suffix);
  }
  const auto* weight = find(present, "weight");
  const auto* packed = find(present, "weight_packed");
  const auto* scale = find(present, "weight_scale");
  WeightFormat format;
  if (packed) {
    KIMIRT_CHECK(!weight, "{}: both {}.weight and {}.weight_packed are present", base, base, base);
    KIMIRT_CHECK(scale, "{}.weight_packed has no {}.weight_scale: a packed FP4 weight needs its group scales", base,
                 base);
    if (find(present, "weight_global_scale")) {
      format = WeightFormat::kNvfp4CompressedTensors;
    } else {
      KIMIRT_CHECK(!(scale->dtype && *scale->dtype == DType::kF8E4M3),
                   "{}.weight_scale is F8_E4M3 (NVFP4) but {}.weight_global_scale is missing", base, base);
      format = WeightFormat::kMxfp4;
    }
  } else if (weight) {
    const bool fp8 = weight->dtype && *weight->dtype == DType::kF8E4M3;
    const bool fp4 = weight->dtype && (*weight->dtype == DType::kU8 || *weight->dtype == DType::kF4);
    if (find(present, "weight_scale_2")) {
      KIMIRT_CHECK(scale, "{}.weight_scale_2 is present but {}.weight_scale is missing (NVFP4)", base, base);
      format = WeightFormat::kNvfp4ModelOpt;
    } else if (find(present, "weight_scale_inv")) {
      KIMIRT_CHECK(!scale, "{}: both weight_scale and weight_scale_inv are present", base);
      format = WeightFormat::kFp8BlockScaleInv;
    } else if (scale) {
      KIMIRT_CHECK(!fp4, "{}.weight is {} with weight_scale but no weight_scale_2 (NVFP4 needs its global scale)", base,
                   dtype_or_unknown(weight));
      format = WeightFormat::kFp8BlockScale;
    } else {
      KIMIRT_CHECK(!fp8,
                   "{}.weight is F8_E4M3 but has no block scale ({}.weight_scale_inv or {}.weight_scale): refusing to "
                   "load it as if it were unquantized",
                   base, base, base);
      KIMIRT_CHECK(!weight->dtype || is_plain_float(*weight->dtype),
                   "{}.weight is {} with no scales: not a format kimirt knows", base, dtype_or_unknown(weight));
      format = WeightFormat::kFloat;
    }
  } else {
    fail("{}: no weight tensor ({}.weight or {}.weight_packed)", base, base, base);
  }
  // Every component suffix present must belong to the chosen format, and dtypes known so far must fit.
  for (const auto& p : present) {
    if (!is_component_suffix(p.suffix)) continue;
    const int idx = component_index(format, p.suffix);
    KIMIRT_CHECK(idx >= 0, "{}.{} does not belong to a {} weight", base, p.suffix, format_name(format));
    const auto& comp = format_components(format)[static_cast<size_t>(idx)];
    KIMIRT_CHECK(!p.dtype || component_accepts(format, comp, *p.dtype), "{}.{} is {}, which a {} weight cannot hold",
                 base, p.suffix, dtype_name(*p.dtype), format_name(format));
  }
  return format;
}

TensorView normalize_component(WeightFormat format, const Component& component, const TensorView& stored,
                               std::span<const int64_t> logical, std::string_view key) {
  // The index gives names only, so a weight resolved as float may turn out FP8 once its header is read.
  KIMIRT_CHECK(!(format == WeightFormat::kFloat && stored.dtype() == DType::kF8E4M3),
               "{} is F8_E4M3 but has no block scale (weight_scale_inv or weight_scale): refusing to load it as if it "
               "were unquantized",
               key);
  KIMIRT_CHECK(component_accepts(format, component, stored.dtype()),
               "{}: dtype {} is not valid for the {} of a {} weight", key, dtype_name(stored.dtype()), component.suffix,
               format_name(format));
  KIMIRT_CHECK(stored.is_contiguous(), "{}: stored tensor is not contiguous", key);
  const Shape want = component_shape(format, component, logical);
  if (component.scalar()) {
    KIMIRT_CHECK(stored.numel() == 1, "{}: a per-tensor scale must hold one value, got shape {}", key,
                 shape_str(stored.shape()));
    return stored.reshape({});
  }
  if (component.role == ComponentRole::kData && is_packed_fp4_data(format)) {
    KIMIRT_CHECK(logical.size() == 2 && logical[1] % 2 == 0,
                 "{}: a packed FP4 weight needs an even column count, got {}", key, shape_str(logical));
    if (stored.dtype() == DType::kF4) {
      KIMIRT_CHECK(stored.shape() == Shape(logical.begin(), logical.end()), "{}: F4 shape {} != expected {}", key,
                   shape_str(stored.shape()), shape_str(logical));
      return TensorView(DType::kU8, want, stored.data());
    }
  }
  if (stored.shape() == want) return stored;
  // ModelOpt stores FP8 block scales 4-D [nbN, 1, nbK, 1]; DeepGEMM and our dequantizer take 2-D.
  const auto& s = stored.shape();
  if (component.role == ComponentRole::kBlockScale && want.size() == 2 && s.size() == 4 && s[0] == want[0] &&
      s[1] == 1 && s[2] == want[1] && s[3] == 1) {
    return stored.reshape(want);
  }
  if (component.role == ComponentRole::kBlockScale && component.tile_rows > 1) {
    fail("{}: scale grid {} does not cover the weight {} in {}x{} blocks (expected {})", key, shape_str(s),
         shape_str(logical), component.tile_rows, component.tile_cols, shape_str(want));
  }
  fail("{}: shape {} != expected {} for the {} of a {} {} weight", key, shape_str(s), shape_str(want), component.suffix,
       shape_str(logical), format_name(format));
}

Region component_region(const Component& component, std::span<const int64_t> logical, const Region& region,
                        std::string_view key) {
  if (component.scalar()) return Region{};
  if (component.tile_rows == 1 && component.tile_cols == 1) return region;
  KIMIRT_CHECK(logical.size() == 2 && region.rank() == 2, "{}: a tiled component needs a 2-D weight, got {}", key,
               shape_str(logical));
  Region out{Shape(2), Shape(2)};
  const int64_t tiles[2] = {component.tile_rows, component.tile_cols};
  const char* axis[2] = {"rows", "columns"};
  for (size_t d = 0; d < 2; ++d) {
    const int64_t b = region.begin[d];
    const int64_t e = b + region.extent[d];
    const int64_t t = tiles[d];
    KIMIRT_CHECK(b % t == 0 && (e % t == 0 || e == logical[d]),
                 "{}: {} [{}, {}) of a {} weight cut a {}x{} block of its {}; pieces must be multiples of {} {}", key,
                 axis[d], b, e, shape_str(logical), component.tile_rows, component.tile_cols, component.suffix, t,
                 axis[d]);
    out.begin[d] = b / t;
    out.extent[d] = ceil_div(e, t) - b / t;
  }
  return out;
}

}  // namespace kimirt::quant
