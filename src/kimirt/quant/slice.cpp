#include "kimirt/quant/slice.h"

#include <cstring>

#include <fmt/format.h>

namespace kimirt::quant {
namespace {

// A view in bytes: packed F4 becomes U8 with a halved last dimension, so that the copy loop below never
// deals with half-byte elements.
struct ByteView {
  uint8_t* data;
  Shape shape;
  Shape byte_strides;
  int64_t elem_bytes;
};

ByteView to_bytes(const TensorView& v, Region& region, const char* which) {
  ByteView b{static_cast<uint8_t*>(v.data()), v.shape(), {}, 0};
  if (v.dtype() == DType::kF4) {
    KIMIRT_CHECK(v.rank() >= 1, "{} packed F4 region of a scalar view", which);
    const int last = v.rank() - 1;
    KIMIRT_CHECK(v.shape()[last] % 2 == 0 && region.begin[last] % 2 == 0 && region.extent[last] % 2 == 0,
                 "{} region {} of a packed F4 tensor {} does not start and end on a byte", which, region.str(),
                 shape_str(v.shape()));
    b.shape[last] /= 2;
    region.begin[last] /= 2;
    region.extent[last] /= 2;
    b.byte_strides = contiguous_strides(b.shape);
    b.elem_bytes = 1;
    return b;
  }
  b.elem_bytes = dtype_bits(v.dtype()) / 8;
  b.byte_strides = v.strides();
  for (auto& s : b.byte_strides) s *= b.elem_bytes;
  return b;
}

void check_inside(const TensorView& v, const Region& r, const char* which) {
  KIMIRT_CHECK(r.rank() == v.rank() && r.extent.size() == r.begin.size(), "{} region {} has rank {}, tensor {} has {}",
               which, r.str(), r.rank(), shape_str(v.shape()), v.rank());
  for (int d = 0; d < r.rank(); ++d) {
    const auto i = static_cast<size_t>(d);
    KIMIRT_CHECK(r.begin[i] >= 0 && r.extent[i] >= 0 && r.begin[i] <= v.shape()[i] - r.extent[i],
                 "{} region {} lies outside a tensor of shape {}", which, r.str(), shape_str(v.shape()));
  }
}

void copy_dims(const ByteView& s, const uint8_t* sp, const ByteView& d, uint8_t* dp, const Shape& extent, size_t dim) {
  const size_t rank = extent.size();
  if (dim + 1 >= rank) {
    // Innermost dimension (or a scalar): one memcpy when both sides are dense there.
    const int64_t n = rank == 0 ? 1 : extent[dim];
    const int64_t ss = rank == 0 ? s.elem_bytes : s.byte_strides[dim];
    const int64_t ds = rank == 0 ? d.elem_bytes : d.byte_strides[dim];
    if (ss == s.elem_bytes && ds == d.elem_bytes) {
      std::memcpy(dp, sp, static_cast<size_t>(n * s.elem_bytes));
    } else {
      for (int64_t i = 0; i < n; ++i) std::memcpy(dp + i * ds, sp + i * ss, static_cast<size_t>(s.elem_bytes));
    }
    return;
  }
  for (int64_t i = 0; i < extent[dim]; ++i) {
    copy_dims(s, sp + i * s.byte_strides[dim], d, dp + i * d.byte_strides[dim], extent, dim + 1);
  }
}

}  // namespace

Region Region::full(std::span<const int64_t> shape) {
  return Region{Shape(shape.size(), 0), Shape(shape.begin(), shape.end())};
}

std::string Region::str() const {
  std::string out = "[";
  for (size_t i = 0; i < begin.size(); ++i) {
    if (i) out += ", ";
    out += fmt::format("{}:{}", begin[i], begin[i] + (i < extent.size() ? extent[i] : 0));
  }
  return out + "]";
}

void copy_region(const TensorView& src, const Region& src_region, const TensorView& dst, const Region& dst_region) {
  KIMIRT_CHECK(src.dtype() == dst.dtype(), "copy from a {} tensor into a {} tensor", dtype_name(src.dtype()),
               dtype_name(dst.dtype()));
  check_inside(src, src_region, "source");
  check_inside(dst, dst_region, "destination");
  KIMIRT_CHECK(src_region.extent == dst_region.extent, "source region {} and destination region {} differ in size",
               src_region.str(), dst_region.str());
  if (src_region.numel() == 0) return;
  Region sr = src_region;
  Region dr = dst_region;
  const ByteView s = to_bytes(src, sr, "source");
  const ByteView d = to_bytes(dst, dr, "destination");
  const uint8_t* sp = s.data;
  uint8_t* dp = d.data;
  for (size_t i = 0; i < sr.begin.size(); ++i) {
    sp += sr.begin[i] * s.byte_strides[i];
    dp += dr.begin[i] * d.byte_strides[i];
  }
  copy_dims(s, sp, d, dp, sr.extent, 0);
}

void apply_slice_into(std::span<const TensorView> sources, const SliceRule& rule, const TensorView& dst) {
  KIMIRT_CHECK(!sources.empty(), "slice with no source tensor");
  for (const auto& s : sources) {
    KIMIRT_CHECK(s.dtype() == dst.dtype(), "slice source is {} but the destination is {}", dtype_name(s.dtype()),
                 dtype_name(dst.dtype()));
  }
  KIMIRT_CHECK(dst.shape() == rule.dst_shape, "slice destination has shape {}, the rule builds {}",
               shape_str(dst.shape()), shape_str(rule.dst_shape));
  int64_t filled = 0;
  for (const auto& c : rule.copies) {
    KIMIRT_CHECK(c.source >= 0 && static_cast<size_t>(c.source) < sources.size(), "slice copy names source {} of {}",
                 c.source, sources.size());
    copy_region(sources[static_cast<size_t>(c.source)], c.src, dst, c.dst);
    filled += c.dst.numel();
  }
  KIMIRT_CHECK(filled == shape_numel(rule.dst_shape), "slice copies fill {} of the {} elements of a {} destination",
               filled, shape_numel(rule.dst_shape), shape_str(rule.dst_shape));
}

Tensor apply_slice(std::span<const TensorView> sources, const SliceRule& rule) {
  KIMIRT_CHECK(!sources.empty(), "slice with no source tensor");
  Tensor out(sources[0].dtype(), rule.dst_shape);
  apply_slice_into(sources, rule, out.view());
  return out;
}

Tensor apply_slice(const TensorView& full, const SliceRule& rule) {
  return apply_slice(std::span<const TensorView>(&full, 1), rule);
}

}  // namespace kimirt::quant
