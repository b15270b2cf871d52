// The notices on an MPI communicator's private duplicate: broken groups, departures, and the
// agreement at destroy.
#include "comm/mpi/peer_notices.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace zero::comm {
namespace {

constexpr int kNoticeTag = 7001;
constexpr int32_t kDepartureCode = -1;  // a notice's code that says its sender left
constexpr double kAgreementSeconds = 2.0;
constexpr auto kDepartureSendWait = std::chrono::milliseconds(500);

// A departure notice as it travels (in MPI_CHARs, as broken-group notices do).
struct DepartureNotice {
  int32_t code = kDepartureCode;
  int32_t unused = 0;
  int64_t joined = 0;  // the collectives its sender issued: #0 to #joined-1
};

std::chrono::steady_clock::time_point After(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

void PeerNotices::Receive(GroupHealth& health) {
  if (receive_ == MPI_REQUEST_NULL && health.Get().ok()) {
    MPI_Irecv(incoming_, kNoticeBytes, MPI_CHAR, MPI_ANY_SOURCE, kNoticeTag, control_, &receive_);
  }
  int arrived = 0;
  MPI_Status from;
  if (receive_ == MPI_REQUEST_NULL || MPI_Test(&receive_, &arrived, &from) != MPI_SUCCESS || !arrived) return;
  int32_t code = 0;  // a broken-group notice: the first error's code, then its message
  std::memcpy(&code, incoming_, sizeof code);
  incoming_[kNoticeBytes - 1] = '\0';
  if (code != kDepartureCode) {
    health.Break(Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat("rank ", from.MPI_SOURCE, " reported its group broken: ", incoming_ + sizeof code)));
    return;
  }
  DepartureNotice notice;  // the receive is posted again on the next call
  std::memcpy(&notice, incoming_, sizeof notice);
  if (departed_ < 0 || notice.joined < departed_joined_) {
    departed_ = from.MPI_SOURCE;
    departed_joined_ = notice.joined;
  }
}

Status PeerNotices::DepartureError(int64_t sequence, int waiting_rank) const {
  if (departed_ < 0 || sequence < departed_joined_) return absl::OkStatus();
  const std::string when = departed_joined_ == 0 ? std::string(" before any collective")
                                                 : absl::StrCat(" after its collective #", departed_joined_ - 1);
  return absl::UnavailableError(absl::StrCat(
      "rank ", departed_, " left", when, ": it destroyed its MPI communicator or ended its process "
      "(MPI_Finalize), so it will never join collective #", sequence, ", which rank ", waiting_rank,
      " waits in. Rank ", departed_, "'s own output says why it ended: an exception or SystemExit "
      "outside the training loop, or a script that runs fewer steps or batches on some ranks (every "
      "rank must call the same collectives)"));
}

void PeerNotices::SendToPeers() {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    sends_.push_back(MPI_REQUEST_NULL);
    MPI_Isend(outgoing_.data(), static_cast<int>(outgoing_.size()), MPI_CHAR, peer, kNoticeTag, control_,
              &sends_.back());
  }
}

void PeerNotices::SendBroken(const Status& broken) {
  if (broken_sent_) return;
  broken_sent_ = true;
  const int32_t code = static_cast<int32_t>(broken.code());
  outgoing_.assign(kNoticeBytes, '\0');
  std::memcpy(outgoing_.data(), &code, sizeof code);
  std::memcpy(outgoing_.data() + sizeof code, broken.message().data(),
              std::min<size_t>(broken.message().size(), kNoticeBytes - sizeof code - 1));
  SendToPeers();
}

void PeerNotices::SendDeparture(int64_t joined) {
  DepartureNotice notice;
  notice.joined = joined;
  outgoing_.assign(sizeof notice, '\0');
  std::memcpy(outgoing_.data(), &notice, sizeof notice);
  SendToPeers();
  // A notice this small is sent eagerly: its sends complete at once unless MPI is stalled.
  const auto deadline = std::chrono::steady_clock::now() + kDepartureSendWait;
  int done = 0;
  while (MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
         !done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Whether the communicators may be freed: every rank reaches its destructor with a healthy
// group, so no rank abandoned a collective whose messages could still arrive. A rank that frees
// while a peer's abandoned collective still sends to it leaves those messages pending in MPI,
// and OpenMPI then hung the next MPI_Comm_dup of the job in 1 run of 3. A rank that a peer's
// departure notice reached votes as not healthy: that notice's sender keeps its communicators,
// and so must everyone.
DestroyAgreement PeerNotices::Agree(bool healthy) {
  // Heap-held: MPI may write them after this returns when the agreement is abandoned.
  auto votes = std::make_unique<int[]>(2);
  votes[0] = healthy ? 1 : 0;
  votes[1] = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Iallreduce(&votes[0], &votes[1], 1, MPI_INT, MPI_MIN, control_, &request) != MPI_SUCCESS) {
    return DestroyAgreement::kSomeRankNot;
  }
  const auto deadline = After(kAgreementSeconds);
  int done = 0;
  while (healthy && MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (done) return votes[1] == 1 ? DestroyAgreement::kEveryRankHealthy : DestroyAgreement::kSomeRankNot;
  // Abandoned: MPI forbids freeing or cancelling a collective's request, and may still complete
  // it into the votes, so both are leaked.
  static_cast<void>(votes.release());
  return healthy ? DestroyAgreement::kNoAnswer : DestroyAgreement::kSomeRankNot;
}

bool PeerNotices::CancelReceive() {
  if (receive_ == MPI_REQUEST_NULL) return false;
  int arrived = 0;
  MPI_Test(&receive_, &arrived, MPI_STATUS_IGNORE);
  if (receive_ == MPI_REQUEST_NULL) return arrived != 0;
  // A cancelled receive completes locally; MPI then no longer writes into incoming_.
  MPI_Cancel(&receive_);
  MPI_Wait(&receive_, MPI_STATUS_IGNORE);
  return false;
}

void PeerNotices::ReleaseSends() {
  bool pending = false;
  for (MPI_Request& send : sends_) {
    int done = 0;
    if (send != MPI_REQUEST_NULL) MPI_Test(&send, &done, MPI_STATUS_IGNORE);
    if (send == MPI_REQUEST_NULL) continue;
    MPI_Request_free(&send);
    pending = true;
  }
  if (pending) static_cast<void>(new std::vector<char>(std::move(outgoing_)));  // MPI may still read it
}

}  // namespace zero::comm
