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

std::string dangling_link_note(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec))) return {};
  if (look_up(path) != PathLookup::kAbsent) return {};  // it resolves (or cannot be told)
  const std::filesystem::path target = std::filesystem::read_symlink(path, ec);
  if (ec) return " (a symbolic link, which does not resolve)";
  return " (a symbolic link to '" + target.string() + "', which does not resolve)";
}

bool path_exists(const std::filesystem::path& path) {
  std::string why;
  const PathLookup found = look_up(path, &why);
  KIMIRT_CHECK(found != PathLookup::kFailed, "{}: cannot be looked up: {}", path.string(), why);
  return found == PathLookup::kPresent;
}

}  // namespace kimirt
