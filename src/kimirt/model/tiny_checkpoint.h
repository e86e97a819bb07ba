// The random-checkpoint generator behind `kimirt make-tiny`: a checkpoint directory in the released layout
// (config.json via ModelConfig::to_json, generation_config.json, model.safetensors.index.json, sharded
// model-0000i-of-0000N.safetensors) of any size, for tests, benchmarks and demos.
//
// Layout, as the release and the golden k3-tiny: the first shard holds the embedding and the model-level
// norms, then the layers' non-expert parameters (whole layers per shard while they fit), then each MoE
// layer's routed experts in shards of their own (cut where the shard size is reached, so one expert may
// straddle two files), and lm_head last. Inside a file tensors are ordered as the official safetensors
// writer orders them (descending dtype alignment, then name).
//
// Values follow the goldens (testdata/k3-tiny/golden.json "weights"): linear weights and the embedding
// N(0, 1/fan_in) in BF16; norms U(0.8, 1.2); A_log = log U(0.5, 16) (K3: zero-padded to head_dim); dt_bias
// N(0, 0.5^2); conv weights N(0, 0.3^2); router bias N(0, 0.1^2); the small KDA tensors and the router bias
// in F32 as the release stores them. Routed experts as the config's quantization declares: MXFP4 (random
// E2M1 codes, E8M0 scales 2^-3..2^-6), BF16, or FP8 E4M3 with F32 128x128 block scales (amax / 448).
// Each tensor's values depend only on the seed and its name, not on the sharding.
//
// Writing streams one tensor at a time in small chunks, so the memory used does not grow with the size.
// The directory appears complete or not at all (built under a temporary name, then renamed).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "kimirt/model/config.h"

namespace kimirt::model {

// Dimensions of a generated model; an unset field keeps the family's small default.
struct TinyDims {
  std::optional<int64_t> hidden;
  std::optional<int64_t> layers;      // MLA every `mla_period`-th layer (1-based) and the last, the rest KDA
  std::optional<int64_t> mla_period;  // default 4, as the release
  std::optional<int64_t> vocab;
  std::optional<int64_t> heads;     // KDA and MLA heads
  std::optional<int64_t> head_dim;  // KDA head dim (K = V), MLA v_head_dim and qk_nope_head_dim
  std::optional<int64_t> rope_dim;  // MLA qk_rope_head_dim
  std::optional<int64_t> kv_lora_rank;
  std::optional<int64_t> q_lora_rank;  // K3 only (Kimi Linear has a single q_proj)
  std::optional<int64_t> experts;
  std::optional<int64_t> top_k;
  std::optional<int64_t> shared_experts;
  std::optional<int64_t> intermediate;      // dense MLP (layer 0)
  std::optional<int64_t> moe_intermediate;  // routed and shared expert width
  std::optional<int64_t> latent;            // K3 routed_expert_hidden_size
};

enum class ExpertStorage : uint8_t { kMxfp4, kBf16, kFp8 };

// A validated config of `family` with the release's structure (K3: AttnRes, latent MoE, SiTU, gated MLA with
// q_lora, full-rank KDA gate with a lower bound; Kimi Linear: plain residual, SiLU, q_proj, low-rank gate)
// and the golden tiny models' sizes, changed by `dims`; routed experts stored as `experts`. Throws naming the
// field when the dimensions do not make a valid model.
ModelConfig tiny_config(ModelFamily family, const TinyDims& dims = {}, ExpertStorage experts = ExpertStorage::kMxfp4);

struct TinyCheckpointOptions {
  uint64_t seed = 0;
  uint64_t shard_bytes =
      uint64_t{2} << 30;  // a shard is closed before it would pass this (a larger tensor gets its own)
  // Files copied into the checkpoint under their own names: the hook for tokenizer files
  // (tiktoken.model, tokenizer_config.json), which the text layer above this one knows how to make.
  std::vector<std::filesystem::path> side_files;
  // Writes more files into the checkpoint's temporary directory before it is moved into place, so that they
  // are part of the all-or-nothing write (the built-in tokenizer, which the text layer writes).
  std::function<void(const std::filesystem::path& dir)> add_files;
};

struct TinyCheckpointInfo {
  size_t shards = 0;
  size_t tensors = 0;
  uint64_t tensor_bytes = 0;
};

// The tensor bytes a checkpoint of `config` holds (what write_tiny_checkpoint would write).
uint64_t tiny_checkpoint_bytes(const ModelConfig& config);

// Sets config.num_experts to the smallest multiple of 8 (at least num_experts_per_token) whose checkpoint
// holds at least `target_bytes`; throws when the model has no MoE layer to grow.
void scale_experts_to_size(ModelConfig& config, uint64_t target_bytes);

// Writes the checkpoint of `config` to `dir`, which must not exist or be an empty directory.
TinyCheckpointInfo write_tiny_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                                         const TinyCheckpointOptions& options = {});

}  // namespace kimirt::model
