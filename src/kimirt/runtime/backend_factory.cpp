#include "kimirt/runtime/backend_factory.h"

#include "kimirt/base/error.h"
#include "kimirt/runtime/cpu_backend.h"

namespace kimirt::runtime {

std::string_view device_name(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda" || name == "gpu") return Device::kCuda;
  fail("--device: \"{}\" is not a device (cpu, cuda)", name);
}

void require_device(Device device) {
  if (device == Device::kCpu) return;
#ifdef KIMIRT_HAVE_CUDA
  fail(
      "--device cuda: the CUDA forward of the whole model is not implemented yet (its KDA and MoE kernels are a "
      "later issue); run with --device cpu");
#else
  fail(
      "--device cuda: this kimirt was built without CUDA (configure with -DKIMIRT_CUDA=ON), and the CUDA forward of "
      "the whole model is not implemented yet; run with --device cpu");
#endif
}

std::unique_ptr<Backend> make_backend(Device device, const model::ModelConfig& config, const model::ParamStore& params,
                                      Comm& comm, const model::ParallelMapping& mapping, const CacheConfig& cache,
                                      MoeComm moe_comm) {
  require_device(device);
  return std::make_unique<CpuBackend>(config, params, comm, mapping, cache, moe_comm);
}

}  // namespace kimirt::runtime
