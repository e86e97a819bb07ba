#include "kimirt/base/aligned_buffer.h"

#include <cstdlib>
#include <cstring>

#include "kimirt/base/error.h"

namespace kimirt {

AlignedBuffer::AlignedBuffer(size_t bytes, size_t alignment) : size_(bytes) {
  KIMIRT_CHECK(alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0,
               "alignment {} is not a power of two", alignment);
  if (bytes == 0) return;
  // aligned_alloc wants a size that is a multiple of the alignment.
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  KIMIRT_CHECK(rounded >= bytes, "allocation of {} bytes overflows", bytes);
  data_ = static_cast<uint8_t*>(std::aligned_alloc(alignment, rounded));
  KIMIRT_CHECK(data_ != nullptr, "out of host memory allocating {} bytes", bytes);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

}  // namespace kimirt
