// zero-ckpt: look into, check and convert checkpoints written by Engine::SaveCheckpoint.
//
//   zero-ckpt inspect DIR                          # what it holds; are all files intact
//   zero-ckpt verify DIR                           # exit 0 only if complete and intact
//   zero-ckpt consolidate DIR --out model.safetensors [--dtype bf16]
//   zero-ckpt reshard DIR --world N --out DIR2     # offline, for a job at N ranks
//
// DIR is a checkpoint directory, or a series root whose `latest` names one (without `latest`:
// its newest checkpoint, as a load reads it).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "commands.h"
#include "common/command_line.h"

ABSL_FLAG(std::string, out, "", "consolidate: the .safetensors file; reshard: the new checkpoint directory");
ABSL_FLAG(std::string, dtype, "fp32", "consolidate: fp32 or bf16 (rounded to nearest even)");
ABSL_FLAG(int, world, 0, "reshard: the rank count of the new checkpoint");

namespace {

// Each flag and the commands that read it; given to another command it would be ignored
// silently, so that is refused.
bool FlagsBelongTo(const std::string& command, int argc, char** argv) {
  struct Owner {
    const char* flag;
    std::vector<std::string> commands;
  };
  const Owner owners[] = {{"out", {"consolidate", "reshard"}}, {"dtype", {"consolidate"}}, {"world", {"reshard"}}};
  for (const Owner& owner : owners) {
    if (!zero::tools::FlagGiven(argc, argv, owner.flag)) continue;
    if (std::find(owner.commands.begin(), owner.commands.end(), command) != owner.commands.end()) continue;
    std::string readers;
    for (const std::string& reader : owner.commands) readers += (readers.empty() ? "" : " and ") + reader;
    std::fprintf(stderr, "zero-ckpt %s: --%s is a flag of %s only; %s would ignore it\n", command.c_str(), owner.flag,
                 readers.c_str(), command.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "look into, check and convert ZeroRT checkpoints.\n\n"
      "  zero-ckpt inspect DIR                        # format, step, params, files, checksums\n"
      "  zero-ckpt verify DIR                         # exit status 0 only if complete and intact\n"
      "  zero-ckpt consolidate DIR --out model.safetensors [--dtype bf16]\n"
      "  zero-ckpt reshard DIR --world N --out DIR2   # files for a job at N ranks\n\n"
      "DIR is a checkpoint directory, or a series root whose `latest` file names one (without\n"
      "`latest`, a job that died right after its first save: its newest checkpoint).");
  const std::vector<char*> positional = zero::tools::ParseToolCommandLine(argc, argv, "zero-ckpt/");
  if (!zero::tools::NoExtraArguments(positional, 3, "zero-ckpt")) return 2;
  if (positional.size() != 3) {
    std::fprintf(stderr, "usage: zero-ckpt inspect|verify|consolidate|reshard DIR [flags] (see --help)\n");
    return 2;
  }
  const std::string command = positional[1], dir = positional[2], out = absl::GetFlag(FLAGS_out);
  const bool known = command == "inspect" || command == "verify" || command == "consolidate" || command == "reshard";
  if (known && !FlagsBelongTo(command, argc, argv)) return 2;
  zero::Status status;
  if (command == "inspect") {
    status = zero::tools::Inspect(dir);
  } else if (command == "verify") {
    status = zero::tools::Verify(dir);
  } else if (command == "consolidate" || command == "reshard") {
    if (out.empty()) {
      std::fprintf(stderr, "zero-ckpt %s: --out is required\n", command.c_str());
      return 2;
    }
    if (command == "consolidate") {
      const zero::StatusOr<zero::DType> dtype = zero::ParseDType(absl::GetFlag(FLAGS_dtype));
      status = dtype.ok() ? zero::tools::Consolidate(dir, out, *dtype)
                          : absl::InvalidArgumentError(absl::StrCat("--dtype ", absl::GetFlag(FLAGS_dtype),
                                                                    ": consolidate writes fp32 or bf16"));
    } else {
      status = zero::tools::Reshard(dir, absl::GetFlag(FLAGS_world), out);
    }
  } else {
    std::fprintf(stderr, "zero-ckpt: unknown command \"%s\" (inspect, verify, consolidate, reshard)\n", command.c_str());
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "zero-ckpt %s: %s\n", command.c_str(), std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
