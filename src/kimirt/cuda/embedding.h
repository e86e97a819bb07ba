// Token embedding on the device: out[t, :] = table[ids[t], :] (BF16 rows, no scaling).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

// ids [tokens] on the device. A kernel cannot throw, so an id outside [0, vocab) gets a zero row and is
// counted into *bad_ids (device int32, may be null); the runtime checks ids on the host before upload and
// reads the counter in debug builds. hidden must be a multiple of 8, table and out 16-byte aligned.
void embedding_gather(cudaStream_t stream, const __nv_bfloat16* table, int64_t vocab, int64_t hidden,
                      const int32_t* ids, int64_t tokens, __nv_bfloat16* out, int64_t ld_out,
                      int32_t* bad_ids = nullptr);

}  // namespace kimirt::cuda
