#include "kimirt/cli/value_check.h"

#include <optional>

#include "kimirt/base/progress.h"
#include "kimirt/base/timer.h"
#include "kimirt/io/read_engine.h"
#include "kimirt/tensor/finite_values.h"

namespace kimirt::cli {
namespace {

// One tensor being counted; its pieces arrive in order from one I/O thread (io::ReadSink).
struct Counted {
  const io::TensorInfo* info = nullptr;
  const io::SafetensorsFile* shard = nullptr;
  NonfiniteCount count;
};

class CountingSink : public io::ReadSink {
 public:
  explicit CountingSink(std::vector<Counted>& counted) : counted_(counted) {}
  void consume(const io::Piece& piece) override { counted_[piece.id].count.add(piece.data, piece.size); }
  std::string describe(uint64_t id) const override { return counted_[id].info->name; }

 private:
  std::vector<Counted>& counted_;
};

// The dtype a tensor's values are counted as: its own, or E8M0 for the scale codes among `e8m0_codes`; nullopt for a
// tensor without NaN or infinity codes.
std::optional<DType> counted_dtype(const io::TensorInfo& info, const std::set<std::string>& e8m0_codes) {
  if (e8m0_codes.contains(info.name)) return DType::kF8E8M0;
  if (!has_nonfinite_codes(info.dtype)) return std::nullopt;
  return info.dtype;
}

}  // namespace

ValueCheck check_values(const io::Checkpoint& checkpoint, const std::set<std::string>& e8m0_codes, bool progress) {
  const Timer timer;
  ValueCheck check;
  std::vector<Counted> counted;
  std::vector<io::FileRanges> files;
  for (const auto& shard : checkpoint.shards()) {
    io::FileRanges f{&shard, {}};
    for (const auto& info : shard.tensors()) {  // in data order: ascending offsets
      const auto dtype = counted_dtype(info, e8m0_codes);
      if (!dtype) {
        ++check.skipped;
        continue;
      }
      if (info.nbytes() == 0) {  // nothing to read: finite
        ++check.tensors;
        continue;
      }
      f.ranges.push_back({shard.absolute_offset(info), info.nbytes(), counted.size()});
      counted.push_back({&info, &shard, NonfiniteCount(*dtype)});
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
    if (c.count.nonfinite() == 0) continue;
    check.nonfinite.push_back({c.info->name, c.shard->path().filename().string(),
                               std::string(dtype_name(c.count.dtype())), c.count.elements(), c.count.nonfinite(),
                               c.count.first()});
  }
  check.seconds = timer.seconds();
  return check;
}

}  // namespace kimirt::cli
