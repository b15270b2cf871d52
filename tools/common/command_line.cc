#include "common/command_line.h"

#include <cstdio>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace zero::tools {

void HelpShowsOwnFlags(const char* dir) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [dir](absl::string_view file) { return absl::StrContains(file, dir); };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.normalize_filename = [dir](absl::string_view file) {
    const size_t at = file.find(dir);
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  absl::SetFlagsUsageConfig(usage);
}

std::vector<char*> HelpAliases(int argc, char** argv) {
  static char help[] = "--help";
  std::vector<char*> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && std::string(args[i]) != "--"; ++i) {
    if (std::string(args[i]) == "-h") args[i] = help;
  }
  return args;
}

std::vector<char*> ParseToolCommandLine(int argc, char** argv, const char* dir) {
  HelpShowsOwnFlags(dir);
  std::vector<char*> args = HelpAliases(argc, argv);
  return absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
}

bool NoExtraArguments(const std::vector<char*>& positional, size_t allowed, const char* tool) {
  if (positional.size() <= allowed) return true;
  std::fprintf(stderr, "%s: unexpected argument \"%s\" (flags are written --name value or --name=value; see --help)\n",
               tool, positional[allowed]);
  return false;
}

bool FlagGiven(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") return false;
    if (!absl::ConsumePrefix(&arg, "--")) {
      if (!absl::ConsumePrefix(&arg, "-")) continue;
    }
    if (arg == name || absl::StartsWith(arg, absl::StrCat(name, "="))) return true;
  }
  return false;
}

}  // namespace zero::tools
