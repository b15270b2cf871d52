// Library version and what this build of it contains.
#ifndef ZERO_VERSION_H_
#define ZERO_VERSION_H_

namespace zero {

/// "MAJOR.MINOR.PATCH".
const char* Version();

/// One line naming the version and the optional parts compiled in, e.g.
/// "ZeroRT 0.1.0 (cuda: yes, mpi: yes, cpu isa: avx512)". The ISA is the one detected now.
const char* BuildSummary();

}  // namespace zero

#endif  // ZERO_VERSION_H_
