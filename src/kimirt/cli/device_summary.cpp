#include "kimirt/cli/device_summary.h"

namespace kimirt::cli {

// Filled in by the CUDA backend's memory plan; until then the device part says what it knows.
std::string device_summary_text(const std::optional<model::ModelConfig>&) {
#ifdef KIMIRT_HAVE_CUDA
  return "  device      (memory plan: see the CUDA backend)\n";
#else
  return "  device      none: this kimirt was built without CUDA\n";
#endif
}

nlohmann::json device_summary_json(const std::optional<model::ModelConfig>&) {
#ifdef KIMIRT_HAVE_CUDA
  return {{"cuda", true}};
#else
  return {{"cuda", false}};
#endif
}

}  // namespace kimirt::cli
