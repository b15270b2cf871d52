// Command-line conveniences shared by the tools (zero-train, zero-mem, zero-ckpt).
#ifndef ZERO_TOOLS_COMMON_COMMAND_LINE_H_
#define ZERO_TOOLS_COMMON_COMMAND_LINE_H_

#include <cstddef>
#include <vector>

namespace zero::tools {

/// --help and --helpshort list the flags defined in files under `dir` (e.g. "zero-mem/"),
/// with paths from `dir` on (abseil's default looks for a file named after the program and
/// finds none). `dir` must outlive the program's flag parsing (a string literal).
void HelpShowsOwnFlags(const char* dir);

/// The arguments with -h spelled --help (before any "--").
std::vector<char*> HelpAliases(int argc, char** argv);

/// HelpShowsOwnFlags(dir), then abseil's parse of the arguments (with -h as --help): the
/// positional arguments, the program name first.
std::vector<char*> ParseToolCommandLine(int argc, char** argv, const char* dir);

/// Whether `positional` (ParseToolCommandLine's) holds no more than `allowed` entries, the
/// program name included; if it holds more, says on stderr which word `tool` did not expect (a
/// flag's value given without its flag, "zero-train 4" for "--ranks 4", would be ignored).
bool NoExtraArguments(const std::vector<char*>& positional, size_t allowed, const char* tool);

/// Whether flag `name` (without dashes) was given in `argv` as --name, --name=value, -name or
/// -name=value before any "--" (for flags that only one of a tool's commands reads).
bool FlagGiven(int argc, char** argv, const char* name);

}  // namespace zero::tools

#endif  // ZERO_TOOLS_COMMON_COMMAND_LINE_H_
