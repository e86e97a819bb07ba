#include "kimirt/cli/value_check.h"

#include <algorithm>
#include <optional>

#include "kimirt/base/progress.h"
#include "kimirt/base/timer.h"
#include "kimirt/io/read_engine.h"
#include "kimirt/tensor/finite_values.h"

namespace kimirt::cli {
namespace {

// The scales the loader refuses among a block-scale tensor's values given piece by piece, in order, cut anywhere
// (as NonfiniteCount takes them).
class ScaleCheck {
 public:
  ScaleCheck(quant::ScaleCode code, DType dtype)
      : code_(code), dtype_(dtype), pieces_(static_cast<uint64_t>(std::max(dtype_bits(dtype) / 8, 1))) {}

  void add(const uint8_t* data, uint64_t bytes) {
    pieces_.add(data, bytes, [this](const uint8_t* d, uint64_t elements) {
      const quant::ScaleCodeCount n = quant::count_scale_codes(code_, dtype_, d, elements);
      if (n.invalid > 0 && invalid_ == 0) first_ = elements_ + n.first_invalid;
      invalid_ += n.invalid;
      elements_ += elements;
    });
  }
  uint64_t invalid() const { return invalid_; }
  uint64_t first() const { return first_; }

 private:
  quant::ScaleCode code_;
  DType dtype_;
  WholeElements pieces_;
  uint64_t elements_ = 0, invalid_ = 0, first_ = 0;
};

// One tensor being counted; its pieces arrive in order from one I/O thread (io::ReadSink).
struct Counted {
  const io::TensorInfo* info = nullptr;
  const io::SafetensorsFile* shard = nullptr;
  NonfiniteCount count;
  std::optional<ScaleCheck> scales;  // for a block-scale tensor
};

class CountingSink : public io::ReadSink {
 public:
  explicit CountingSink(std::vector<Counted>& counted) : counted_(counted) {}
  void consume(const io::Piece& piece) override {
    Counted& c = counted_[piece.id];
    c.count.add(piece.data, piece.size);
    if (c.scales) c.scales->add(piece.data, piece.size);
  }
  std::string describe(uint64_t id) const override { return counted_[id].info->name; }

 private:
  std::vector<Counted>& counted_;
};

// The dtype a tensor's values are counted as: its own, or E8M0 for E8M0 scale codes; nullopt for a tensor without
// NaN or infinity codes.
std::optional<DType> counted_dtype(const io::TensorInfo& info, quant::ScaleCode code) {
  if (code == quant::ScaleCode::kE8M0) return DType::kF8E8M0;
  if (!has_nonfinite_codes(info.dtype)) return std::nullopt;
  return info.dtype;
}

}  // namespace

ValueCheck check_values(const io::Checkpoint& checkpoint, const std::map<std::string, quant::ScaleCode>& block_scales,
                        bool progress) {
  const Timer timer;
  ValueCheck check;
  std::vector<Counted> counted;
  std::vector<io::FileRanges> files;
  for (const auto& shard : checkpoint.shards()) {
    io::FileRanges f{&shard, {}};
    for (const auto& info : shard.tensors()) {  // in data order: ascending offsets
      const auto scale = block_scales.find(info.name);
      const quant::ScaleCode code = scale == block_scales.end() ? quant::ScaleCode::kNone : scale->second;
      const auto dtype = counted_dtype(info, code);
      if (!dtype) {
        ++check.skipped;
        continue;
      }
      if (info.nbytes() == 0) {  // nothing to read: finite
        ++check.tensors;
        continue;
      }
      f.ranges.push_back({shard.absolute_offset(info), info.nbytes(), counted.size()});
      counted.push_back({&info, &shard, NonfiniteCount(*dtype), std::nullopt});
      if (code != quant::ScaleCode::kNone) counted.back().scales.emplace(code, info.dtype);
      check.bytes += info.nbytes();
    }
    if (!f.ranges.empty()) files.push_back(std::move(f));
  }
  check.tensors += counted.size();
  ProgressBar bar("checking values", check.bytes, progress && ProgressBar::stderr_is_terminal());
  io::ReadOptions options;
  options.progress = &bar;
  // Only the counted tensors' bytes: the packed weights between them are not read to bridge a gap (so the bar's
  // total and the bytes said read are what the reads move).
  options.max_gap_bytes = 0;
  CountingSink sink(counted);
  io::read_ranges(files, sink, options);
  bar.finish();
  for (const auto& c : counted) {
    const std::string shard = c.shard->path().filename().string(), dtype(dtype_name(c.count.dtype()));
    if (c.count.nonfinite() > 0) {
      check.nonfinite.push_back({c.info->name, shard, dtype, c.count.elements(), c.count.nonfinite(), c.count.first()});
    }
    if (c.scales && c.scales->invalid() > c.count.nonfinite()) {
      check.invalid_scales.push_back({c.info->name, shard, dtype, c.count.elements(), c.scales->invalid(),
                                      c.count.nonfinite(), c.scales->first()});
    }
  }
  check.seconds = timer.seconds();
  return check;
}

}  // namespace kimirt::cli
