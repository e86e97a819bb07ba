#include "kimirt/base/path_lookup.h"

#include <system_error>

#include "kimirt/base/error.h"

namespace kimirt {

PathLookup look_up(const std::filesystem::path& path, std::string* why) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::exists(status)) return PathLookup::kPresent;
  // ENOTDIR (a component of the path is a file) is an absence, as std::filesystem::exists has it.
  if (!ec || ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
    return PathLookup::kAbsent;
  }
  if (why) *why = ec.message();
  return PathLookup::kFailed;
}

bool path_exists(const std::filesystem::path& path) {
  std::string why;
  const PathLookup found = look_up(path, &why);
  KIMIRT_CHECK(found != PathLookup::kFailed, "{}: cannot be looked up: {}", path.string(), why);
  return found == PathLookup::kPresent;
}

}  // namespace kimirt
