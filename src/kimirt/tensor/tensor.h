// Tensor (owning, host memory, aligned) and TensorView (non-owning: dtype, shape, strides, pointer).
// Strides count elements; packed F4 views must be contiguous (an element is half a byte).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "kimirt/base/aligned_buffer.h"
#include "kimirt/base/error.h"
#include "kimirt/tensor/dtype.h"

namespace kimirt {

using Shape = std::vector<int64_t>;

// Product of the dimensions; throws on a negative dimension or an overflow.
int64_t shape_numel(std::span<const int64_t> shape);
std::string shape_str(std::span<const int64_t> shape);  // "[3, 4]"
Shape contiguous_strides(std::span<const int64_t> shape);

class TensorView {
 public:
  TensorView() = default;
  TensorView(DType dtype, Shape shape, void* data);                   // contiguous
  TensorView(DType dtype, Shape shape, Shape strides, void* data);   // strided

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim(int i) const;  // negative i counts from the end
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  // Bytes spanned by a contiguous view of this shape.
  uint64_t nbytes() const;
  bool is_contiguous() const;
  void* data() const { return data_; }

  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  // Typed contiguous access; checks that T's size matches the dtype.
  template <typename T>
  std::span<T> span() const {
    KIMIRT_CHECK(sizeof(T) * 8 == static_cast<size_t>(dtype_bits(dtype_)) && is_contiguous(),
                 "span<{}-byte> of a {} {} tensor", sizeof(T), dtype_name(dtype_), shape_str(shape_));
    return {static_cast<T*>(data_), static_cast<size_t>(numel())};
  }

  // Rows [begin, end) of dimension 0 (stays contiguous if this view is).
  TensorView slice_rows(int64_t begin, int64_t end) const;
  // Same storage, new contiguous shape of equal element count.
  TensorView reshape(Shape shape) const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
  void* data_ = nullptr;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Bytes left as the allocator gives them: for a producer that writes every byte anyway (the loader,
  // whose plan fills each destination exactly once), so that a large load does not touch memory twice.
  static Tensor uninitialized(DType dtype, Shape shape);
  static Tensor from_f32(std::span<const float> values, Shape shape);
  Tensor clone() const;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return view().dim(i); }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  uint64_t nbytes() const { return buffer_.size(); }
  bool empty() const { return shape_.empty() && buffer_.empty(); }
  void* data() { return buffer_.data(); }
  const void* data() const { return buffer_.data(); }
  template <typename T>
  T* data_as() {
    return reinterpret_cast<T*>(buffer_.data());
  }
  template <typename T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(buffer_.data());
  }
  template <typename T>
  std::span<T> span() {
    return view().span<T>();
  }
  template <typename T>
  std::span<const T> span() const {
    return view().span<const T>();
  }

  TensorView view() const {
    return TensorView(dtype_, shape_, const_cast<uint8_t*>(buffer_.data()));
  }
  // Keeps the bytes, changes the shape (same element count).
  void reshape(Shape shape);
  // Float contents as f32 (any float dtype; packed F4 included).
  std::vector<float> to_f32() const;

 private:
  struct NoFill {};
  Tensor(DType dtype, Shape shape, NoFill);

  DType dtype_ = DType::kF32;
  Shape shape_;
  AlignedBuffer buffer_;
};

}  // namespace kimirt
