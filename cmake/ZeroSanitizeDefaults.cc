// Run-time defaults of the sanitizer builds (cmake/ZeroSanitize.cmake links this file into
// every executable of a ZERO_SANITIZE=address|thread build). The sanitizer runtimes call these
// hooks at start-up; the environment's ASAN_OPTIONS, LSAN_OPTIONS, UBSAN_OPTIONS and
// TSAN_OPTIONS are applied after them, so a caller can still override any of them.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>

#define ZERO_SANITIZER_HOOK extern "C" __attribute__((visibility("default"), used))

namespace {

// Whether the process was started with the environment variable `name` set. Read from
// /proc/self/environ through raw system calls: the ASan hook runs before libc has set up
// `environ` (getenv() sees nothing yet) and before ASan's interceptors of open/read work, and
// nothing here may allocate nor be instrumented (ASan's shadow memory is not mapped yet).
[[maybe_unused]] __attribute__((no_sanitize("address", "undefined"))) bool StartedWith(const char* name) {
  const long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/environ", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t length = 0;
  while (name[length] != '\0') ++length;
  bool found = false;
  long matched = 0;  // characters of "name=" matched at the start of this entry; -1: no match
  char chunk[4096];
  long got;
  while (!found && (got = syscall(SYS_read, fd, chunk, sizeof chunk)) > 0) {
    for (long i = 0; i < got && !found; ++i) {
      const char c = chunk[i];
      if (c == '\0') {
        matched = 0;
      } else if (matched >= 0) {
        const char want = static_cast<size_t>(matched) < length ? name[matched] : '=';
        matched = c == want ? matched + 1 : -1;
        found = static_cast<size_t>(matched) == length + 1;
      }
    }
  }
  syscall(SYS_close, fd);
  return found;
}

}  // namespace

#if defined(ZERO_SANITIZE_ADDRESS)

// ASan, for every process of the build:
//   allocator_may_return_null=1: an allocation too large for the machine returns null, as
//     aligned_alloc/malloc do without ASan (ASan's default aborts instead), so the library's
//     own out-of-memory path (kResourceExhausted; Allocator.RejectsBadSizes...) is what runs.
//   check_initialization_order / strict_init_order: globals read before their initialiser.
// LeakSanitizer is on, except in processes started by OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE
// is set in them, i.e. the ranks of the mpi-labelled tests): OpenMPI leaves some 100 KB of its
// own allocations (MPI_Init, PMIx, its plugins) at exit, and they cannot be told apart from
// ours by a suppression list: the plugins that made them are dlclose()d in MPI_Finalize, so
// LSan shows their frames as "<unknown module>" (no library name to match), and OpenMPI is
// built without frame pointers, so the stacks stop there. The unit-labelled tests still check
// the engine, the local communicator and the tools for leaks in-process; what this build does
// not check for leaks is comm/mpi itself (which, after a failure, keeps its requests on purpose).
ZERO_SANITIZER_HOOK __attribute__((no_sanitize("address", "undefined")))
const char* __asan_default_options() {
  if (StartedWith("OMPI_COMM_WORLD_SIZE")) {
    return "detect_leaks=0:check_initialization_order=1:strict_init_order=1:"
           "allocator_may_return_null=1";
  }
  return "detect_leaks=1:check_initialization_order=1:strict_init_order=1:"
         "allocator_may_return_null=1";
}

// UBSan: the stack of every report (the build already makes any report fatal with
// -fno-sanitize-recover=undefined).
ZERO_SANITIZER_HOOK const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}

#elif defined(ZERO_SANITIZE_THREAD)

// TSan: both stacks of a lock-order inversion. A report makes the process exit with 66 at
// the end (the default), which fails the test.
ZERO_SANITIZER_HOOK const char* __tsan_default_options() {
  return "second_deadlock_stack=1";
}

#endif
