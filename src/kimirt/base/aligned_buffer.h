// Owning, aligned host memory. The alignment (default 64 bytes) suits SIMD loads and cache lines; page
// alignment (4096) suits O_DIRECT reads and pinning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace kimirt {

class AlignedBuffer {
 public:
  static constexpr size_t kDefaultAlignment = 64;

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes, size_t alignment = kDefaultAlignment);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept { swap(other); }
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    AlignedBuffer(std::move(other)).swap(*this);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  void swap(AlignedBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kimirt
