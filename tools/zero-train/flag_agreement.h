// Every rank of a zero-train job runs with the same trainer flags: the engine compares its own
// config and params, but not the trainer's seed, batch, step count or checkpoint settings. A
// job launched with different ones per rank (an MPMD mpirun line) would train on different
// data without a word, or wait in a collective until guard.timeout_s (ranks that stop at
// different steps, or save at different ones).
#ifndef ZERO_TOOLS_ZERO_TRAIN_FLAG_AGREEMENT_H_
#define ZERO_TOOLS_ZERO_TRAIN_FLAG_AGREEMENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zero/communicator.h"
#include "zero/status.h"

namespace zero::tools {

/// A trainer flag as the ranks compare it: its name and its value as a number (text flags
/// hashed by TextFingerprint).
using ComparedFlag = std::pair<std::string, int64_t>;

/// A stable 64-bit fingerprint of `text` (FNV-1a): the same on every rank and build.
int64_t TextFingerprint(const std::string& text);

/// Collective: kInvalidArgument on every rank when the ranks' `flags` (the same names in the
/// same order on each) differ, naming the first flag that does and each rank's value.
Status AgreeOnTrainerFlags(comm::Communicator& comm, const std::vector<ComparedFlag>& flags, double timeout_s);

}  // namespace zero::tools

#endif  // ZERO_TOOLS_ZERO_TRAIN_FLAG_AGREEMENT_H_
