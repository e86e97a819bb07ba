// Counting the stored values of a tensor that are NaN or infinite, by dtype, without converting them: IEEE
// floats (F64, F32, F16, BF16, E5M2) by an exponent of all ones, E4M3 by its NaN codes 0x7F / 0xFF (it has no
// infinities), E8M0 scales by 0xFF. Integers, bool and packed E2M1 have no such codes. For `inspect
// --check-values`: a checkpoint whose structure is right can still carry NaN weights (a bad conversion, a
// corrupted download), which otherwise show only as a request that ends in an error.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kimirt/tensor/dtype.h"

namespace kimirt {

// Whether values of this dtype can be NaN or infinite.
bool has_nonfinite_codes(DType dtype);

// Of the `count` whole elements at `data` (little-endian, as stored), how many are NaN or infinite; `*first` gets
// the index of the first such element when there is one (and is left alone otherwise). 0 for a dtype without
// such codes.
uint64_t count_nonfinite(DType dtype, const uint8_t* data, uint64_t count, uint64_t* first = nullptr);

// A tensor's bytes given piece by piece, in order, cut anywhere (a read buffer may end inside an element), handed
// on as whole elements: fn(data, elements), an element split between pieces once its last bytes are in.
class WholeElements {
 public:
  explicit WholeElements(uint64_t element_bytes) : element_bytes_(element_bytes) {}
  template <typename Fn>
  void add(const uint8_t* data, uint64_t bytes, Fn&& fn) {
    if (carried_ > 0) {
      const uint64_t take = std::min(bytes, element_bytes_ - carried_);
      std::memcpy(carry_ + carried_, data, take);
      carried_ += take, data += take, bytes -= take;
      if (carried_ < element_bytes_) return;
      fn(static_cast<const uint8_t*>(carry_), uint64_t{1});
      carried_ = 0;
    }
    const uint64_t whole = bytes / element_bytes_;
    fn(data, whole);
    carried_ = bytes - whole * element_bytes_;
    std::memcpy(carry_, data + whole * element_bytes_, carried_);
  }
  uint64_t pending_bytes() const { return carried_; }

 private:
  uint64_t element_bytes_;
  uint8_t carry_[8] = {};  // the widest element: F64
  uint64_t carried_ = 0;
};

// The same count over a tensor's bytes given piece by piece, in order, cut anywhere. Not thread-safe.
class NonfiniteCount {
 public:
  explicit NonfiniteCount(DType dtype);
  void add(const uint8_t* data, uint64_t bytes);
  uint64_t elements() const { return elements_; }                     // whole elements seen
  uint64_t nonfinite() const { return nonfinite_; }                   // of them NaN or infinite
  uint64_t first() const { return first_; }                           // the index of the first such (0 when none)
  uint64_t pending_bytes() const { return pieces_.pending_bytes(); }  // of an element not yet complete
  DType dtype() const { return dtype_; }

 private:
  void count(const uint8_t* data, uint64_t elements);

  DType dtype_;
  WholeElements pieces_;
  uint64_t elements_ = 0, nonfinite_ = 0, first_ = 0;
};

}  // namespace kimirt
