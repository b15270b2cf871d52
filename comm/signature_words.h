// (Internal to comm.) A collective's signature as the words a communicator's
// signature check all-gathers: every rank compares its peers' words with its own before the
// collective runs (MPI: MpiOptions::check_signatures and every tagged collective; external:
// every tagged collective).
#ifndef ZERO_COMM_SIGNATURE_WORDS_H_
#define ZERO_COMM_SIGNATURE_WORDS_H_

#include <cstdint>

#include "zero/communicator.h"

namespace zero::comm {

/// The words of one signature: kind, count, dtype, op, root, tag.
inline constexpr int kSignatureWords = 6;

/// Writes `s` into `words[0..kSignatureWords)`.
inline void EncodeSignature(const CollectiveSignature& s, int64_t* words) {
  words[0] = static_cast<int64_t>(s.kind);
  words[1] = s.count;
  words[2] = static_cast<int64_t>(s.dtype);
  words[3] = static_cast<int64_t>(s.op);
  words[4] = s.root;
  words[5] = s.tag;
}

/// The signature EncodeSignature wrote into `words`.
inline CollectiveSignature DecodeSignature(const int64_t* words) {
  CollectiveSignature s;
  s.kind = static_cast<CollectiveKind>(words[0]);
  s.count = words[1];
  s.dtype = static_cast<DType>(words[2]);
  s.op = static_cast<ReduceOp>(words[3]);
  s.root = static_cast<int>(words[4]);
  s.tag = words[5];
  return s;
}

}  // namespace zero::comm

#endif  // ZERO_COMM_SIGNATURE_WORDS_H_
