// The loader: builds the load plan, then streams every planned read through the read engine into a
// LoadTarget, routing each staged byte block to its destination and driving the routed-expert protocol
// (expert_stream.h). Nothing is half-loaded: any error abandons the target and is rethrown naming the
// tensor or file; only a complete load reaches finish().
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "kimirt/io/checkpoint.h"
#include "kimirt/model/config.h"
#include "kimirt/model/load_plan.h"
#include "kimirt/model/load_target.h"
#include "kimirt/model/parallel.h"
#include "kimirt/model/param_store.h"
#include "kimirt/model/schema.h"

namespace kimirt::model {

struct LoadOptions {
  uint64_t staging_bytes = 1ull << 30;  // bound on staging memory, whatever the checkpoint size
  int io_threads = 4;                   // files read at once
  bool strict = false;                  // unexpected checkpoint keys are an error, not a warning
  bool progress = true;                 // a progress bar when stderr is a terminal
};

// Loads this rank's parameters of `schema` from `checkpoint` into a host ParamStore.
ParamStore load_params(const io::Checkpoint& checkpoint, const Schema& schema, const ParallelMapping& mapping,
                       const LoadOptions& options = {});
// The same through any target (the GPU backend's upload target later).
void load_into(LoadTarget& target, const io::Checkpoint& checkpoint, const Schema& schema,
               const ParallelMapping& mapping, const LoadOptions& options);

struct LoadStats {
  io::ReadStats read;
  uint64_t dest_bytes = 0;  // bytes delivered to the target
  size_t expert_layers_finalized = 0;
  uint64_t e8m0_zero_scales = 0;  // MXFP4 block scales of code 0x00 (quant/scale_codes.h): loaded, and warned of
  double seconds = 0;             // reading and delivering (the plan is built before)
};

// Executes a plan built from the same checkpoint and schema (load_into = LoadPlan::build + this).
LoadStats execute_plan(const LoadPlan& plan, LoadTarget& target, const LoadOptions& options);

// The host target: one Tensor per destination, allocated on its first write (so that the zero fill happens on
// the I/O threads, overlapped with reading), handed over as a ParamStore once the load finished.
class ParamStoreTarget : public LoadTarget {
 public:
  ParamStoreTarget();
  ~ParamStoreTarget() override;

  void begin(const LoadPlan& plan) override;
  void write(const StagedWrite& w) override;
  void finish() override;
  void abandon() noexcept override;

  // The store of the finished load (empty before finish()).
  ParamStore take();

 private:
  struct State;
  std::unique_ptr<State> state_;
  ParamStore store_;
};

// A checkpoint directory loaded for one rank: config.json parsed, the schema of its keys, the parameters.
// The schema is held by pointer because the store's parameters point into it.
struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Schema> schema;
  ParamStore params;
};

LoadedModel load_model(const std::filesystem::path& dir, const ParallelMapping& mapping,
                       const LoadOptions& options = {});
// The same from a checkpoint already open (its config.json and headers parsed once for every rank of a
// process: ranks on threads may share it, it is only read).
LoadedModel load_model(const io::Checkpoint& checkpoint, const ParallelMapping& mapping,
                       const LoadOptions& options = {});

}  // namespace kimirt::model
