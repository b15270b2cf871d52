// What the ranks of one MPI communicator tell each other beside their collectives (internal to
// comm/mpi), over the communicator's private duplicate: that a rank's group broke (its first
// error), that a rank left while its peers go on (how many collectives it issued), and whether
// every rank is healthy when the communicator is destroyed. mpi_communicator.cc's file comment
// says how the communicator uses them.
#ifndef ZERO_COMM_MPI_PEER_NOTICES_H_
#define ZERO_COMM_MPI_PEER_NOTICES_H_

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "comm/group_health.h"
#include "zero/status.h"

namespace zero::comm {

/// What the ranks agreed when a communicator is destroyed (PeerNotices::Agree).
enum class DestroyAgreement { kEveryRankHealthy, kSomeRankNot, kNoAnswer };

/// One rank's notices on `control`, a communicator used for nothing else and never freed, so a
/// notice still on its way can never reach a communicator freed (and reused) meanwhile. Used by
/// one thread at a time: the progress thread, then (once it stopped) the destructor or
/// MPI_Finalize's hook. Buffers that MPI may still use when it goes are leaked on purpose.
class PeerNotices {
 public:
  PeerNotices(MPI_Comm control, int rank, int size) : control_(control), rank_(rank), size_(size) {}

  /// Keeps a receive posted while `health` is OK and takes a notice that arrived: a peer's
  /// broken group breaks `health`, a departure is recorded. Never blocks.
  void Receive(GroupHealth& health);
  /// Whether a peer's departure notice arrived.
  bool departed() const { return departed_ >= 0; }
  /// After a departure: Unavailable, naming the rank that left and `waiting_rank`, for
  /// collective #`sequence` when the leaver never issued it; OK for one it issued (it may
  /// complete) and without a departure.
  Status DepartureError(int64_t sequence, int waiting_rank) const;

  /// Tells every peer, once, why this rank's group broke.
  void SendBroken(const Status& broken);
  bool broken_sent() const { return broken_sent_; }
  /// Tells every peer that this rank leaves having issued collectives #0 to #joined-1, from a
  /// healthy group (no broken-group notice was sent); waits up to 0.5 s for the sends.
  void SendDeparture(int64_t joined);

  /// Every rank votes with one all-reduce whether it is `healthy` (see the .cc): a rank that
  /// is not contributes without waiting, a healthy one waits up to 2 s for its peers
  /// (kNoAnswer when they do not answer: they are busy elsewhere, so this rank leaves first).
  DestroyAgreement Agree(bool healthy);
  /// Ends the posted receive; whether a notice had arrived (a last look, not taken).
  bool CancelReceive();
  /// Frees the sends that MPI has not completed (it completes them later, so their buffer is
  /// leaked).
  void ReleaseSends();

 private:
  // Sends `outgoing_` to every peer.
  void SendToPeers();

  static constexpr int kNoticeBytes = 1024;  // a broken-group notice: the first error's message
  const MPI_Comm control_;
  const int rank_, size_;
  char incoming_[kNoticeBytes] = {};
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::vector<char> outgoing_;
  std::vector<MPI_Request> sends_;
  bool broken_sent_ = false;
  int departed_ = -1;          // the peer whose departure notice named the fewest collectives
  int64_t departed_joined_ = 0;  // how many collectives it issued before it left
};

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_PEER_NOTICES_H_
