// The `local` backend: N ranks as threads of one process (tests, and the single-process
// default of the tools), in the manner of gloo's threads-as-ranks tests.
//
// Deterministic: every reduction is taken in rank order 0..N-1 and rounded once, so a
// reduce-scatter and an all-reduce of the same data give identical bits. A rank's k-th
// collective meets the other ranks' k-th; if their signatures differ every rank's Wait()
// returns kInvalidArgument naming both sides, before any buffer is touched. Wait(timeout)
// names the ranks that never arrived. Host buffers only for now: CUDA device buffers are
// answered with kUnimplemented.
#ifndef ZERO_COMM_LOCAL_LOCAL_GROUP_H_
#define ZERO_COMM_LOCAL_LOCAL_GROUP_H_

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace zero::comm {

/// Creates the `size` (≥ 1) communicators of one in-process group; element r is rank r. Each
/// is used by one thread; the group lives as long as any of its communicators.
StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLocalGroup(int size);

}  // namespace zero::comm

#endif  // ZERO_COMM_LOCAL_LOCAL_GROUP_H_
