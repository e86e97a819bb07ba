#include "kimirt/tensor/tensor.h"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kimirt/tensor/float_convert.h"

namespace kimirt {

int64_t shape_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    KIMIRT_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    KIMIRT_CHECK(!__builtin_mul_overflow(n, d, &n), "element count of shape {} overflows", shape_str(shape));
  }
  return n;
}

std::string shape_str(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Shape contiguous_strides(std::span<const int64_t> shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

TensorView::TensorView(DType dtype, Shape shape, void* data)
    : dtype_(dtype), shape_(std::move(shape)), strides_(contiguous_strides(shape_)), data_(data) {}

TensorView::TensorView(DType dtype, Shape shape, Shape strides, void* data)
    : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)), data_(data) {
  KIMIRT_CHECK(shape_.size() == strides_.size(), "shape {} and strides {} differ in rank", shape_str(shape_),
               shape_str(strides_));
  KIMIRT_CHECK(dtype_ != DType::kF4 || is_contiguous(), "a packed F4 view must be contiguous");
}

int64_t TensorView::dim(int i) const {
  const int r = rank();
  if (i < 0) i += r;
  KIMIRT_CHECK(i >= 0 && i < r, "dimension {} of a rank-{} tensor", i, r);
  return shape_[static_cast<size_t>(i)];
}

uint64_t TensorView::nbytes() const {
  auto bytes = dtype_bytes(dtype_, static_cast<uint64_t>(numel()));
  KIMIRT_CHECK(bytes.has_value(), "{} {} is not a whole number of bytes", dtype_name(dtype_), shape_str(shape_));
  return *bytes;
}

bool TensorView::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

TensorView TensorView::slice_rows(int64_t begin, int64_t end) const {
  KIMIRT_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows [{}, {}) of a {} tensor",
               begin, end, shape_str(shape_));
  Shape shape = shape_;
  shape[0] = end - begin;
  const int64_t offset_elems = begin * (rank() >= 1 ? strides_[0] : 0);
  auto offset_bytes = dtype_bytes(dtype_, static_cast<uint64_t>(offset_elems));
  KIMIRT_CHECK(offset_bytes.has_value(), "row {} of a packed {} tensor does not start on a byte", begin,
               dtype_name(dtype_));
  return TensorView(dtype_, std::move(shape), strides_, static_cast<uint8_t*>(data_) + *offset_bytes);
}

TensorView TensorView::reshape(Shape shape) const {
  KIMIRT_CHECK(is_contiguous(), "reshape of a non-contiguous view");
  KIMIRT_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_str(shape_), shape_str(shape));
  return TensorView(dtype_, std::move(shape), data_);
}

Tensor::Tensor(DType dtype, Shape shape, NoFill) : dtype_(dtype), shape_(std::move(shape)) {
  auto bytes = dtype_bytes(dtype_, static_cast<uint64_t>(shape_numel(shape_)));
  KIMIRT_CHECK(bytes.has_value(), "{} {} is not a whole number of bytes", dtype_name(dtype_), shape_str(shape_));
  buffer_ = AlignedBuffer(*bytes);
}

Tensor::Tensor(DType dtype, Shape shape) : Tensor(dtype, std::move(shape), NoFill{}) {
  if (!buffer_.empty()) std::memset(buffer_.data(), 0, buffer_.size());
}

Tensor Tensor::uninitialized(DType dtype, Shape shape) { return Tensor(dtype, std::move(shape), NoFill{}); }

Tensor Tensor::from_f32(std::span<const float> values, Shape shape) {
  Tensor t(DType::kF32, std::move(shape));
  KIMIRT_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "{} values for shape {}", values.size(),
               shape_str(t.shape()));
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data(), data(), nbytes());
  return t;
}

void Tensor::reshape(Shape shape) {
  KIMIRT_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_str(shape_), shape_str(shape));
  shape_ = std::move(shape);
}

std::vector<float> Tensor::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  convert_to_f32(dtype_, data(), out.data(), numel());
  return out;
}

}  // namespace kimirt
