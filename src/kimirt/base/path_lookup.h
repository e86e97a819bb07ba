// Whether a path is there, with "cannot tell" kept apart from "absent". std::filesystem::exists(path, ec) is false
// both for a missing file and for one behind a directory without search permission or a loop of symbolic links;
// reported as absent ("no config.json", "model directory does not exist"), the second sends users after the wrong
// problem.
#pragma once

#include <filesystem>
#include <string>

namespace kimirt {

enum class PathLookup { kAbsent, kPresent, kFailed };

// Follows symbolic links (a dangling one is absent, as is a path through a file). On kFailed, `why` (when given)
// gets the system's reason.
PathLookup look_up(const std::filesystem::path& path, std::string* why = nullptr);

// " (a symbolic link to 'TARGET', which does not resolve)" when look_up calls the path absent
// and it is itself a symbolic link (a Hugging Face snapshot copied without its blobs: `ls` shows the file the error
// calls missing), else "".
std::string dangling_link_note(const std::filesystem::path& path);

// True when `path` is there, false when it is absent; throws kimirt::Error naming it when the lookup fails.
bool path_exists(const std::filesystem::path& path);

}  // namespace kimirt
