// (Internal to comm/mpi.) One collective as the MPI communicator's progress thread runs it, and
// the Work its caller waits on.
#ifndef ZERO_COMM_MPI_MPI_OPERATION_H_
#define ZERO_COMM_MPI_MPI_OPERATION_H_

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/completion.h"
#include "comm/group_health.h"
#include "comm/mpi/device_staging.h"
#include "comm/mpi/mpi_rounds.h"
#include "comm/signature_words.h"
#include "comm/mpi/scratch_pool.h"
#include "zero/communicator.h"

namespace zero::comm {

// One collective as the progress thread sees it.
struct Operation {
  enum class Phase { kQueued, kChecking, kRunning };
  CollectiveSignature signature;
  MPI_Comm comm = MPI_COMM_NULL;  // the communicator it runs on: tagged ones have their own
  int64_t sequence = 0;
  std::vector<MpiRound> rounds;   // the collective (mpi_rounds.h)
  size_t next_round = 0;
  std::function<Status()> finish;  // after the last round: copy out of staging
  ScratchBuffer scratch;          // the rounds' temporaries (from the communicator's pool)
  PinnedBuffer staged_send, staged_recv;  // CUDA device buffers copied through host memory
  int device = -1;                        // their CUDA device, for the copy back
  std::shared_ptr<Completion> completion = std::make_shared<Completion>();
  Phase phase = Phase::kQueued;
  std::vector<MPI_Request> requests;  // the signature check's, or the current round's
  int64_t mine[kSignatureWords] = {};
  std::vector<int64_t> everyone;  // size × kSignatureWords, for the signature check
};

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<Completion> completion, std::shared_ptr<GroupHealth> health, std::string what)
      : completion_(std::move(completion)), health_(std::move(health)), what_(std::move(what)) {}

  ~MpiWork() override {
    if (completion_->Abandon()) {
      health_->Break(absl::CancelledError(absl::StrCat(
          what_, " was abandoned: its Work was destroyed before the collective completed")));
    }
  }

  Status Wait(double timeout_s) override {
    Status status;
    if (!completion_->Wait(timeout_s, &status)) {
      if (completion_->Abandon()) {
        status = absl::DeadlineExceededError(absl::StrCat(
            what_, " did not complete within ", timeout_s, " s: at least one peer rank never joined "
            "it (diverged, stuck, or failed earlier; see that rank's log)"));
      } else {
        completion_->Wait(kNoTimeout, &status);  // it completed just now
      }
    }
    health_->Break(status);
    return status;
  }
  bool Test() override { return completion_->done(); }

 private:
  std::shared_ptr<Completion> completion_;
  std::shared_ptr<GroupHealth> health_;
  std::string what_;
};

// A round that is one non-blocking MPI call.
inline MpiRound OneCall(std::function<int(MPI_Request*)> call) {
  return [call = std::move(call)](std::vector<MPI_Request>* requests) {
    requests->push_back(MPI_REQUEST_NULL);
    return call(&requests->back());
  };
}

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_OPERATION_H_
