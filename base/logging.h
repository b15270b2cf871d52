// Rank-prefixed logging to stderr, filtered by level (ZERO_DEBUG=WARN|INFO|DETAIL).
//
// A Logger is a small value owned by whoever logs (the engine, a communicator, a tool): no
// global state. Lines look like `[zero r3 INFO] bucket 2 launched (4 params, 1.0 MB)`; the
// rank appears once it is known.
//
//   ZERO_LOG(logger, kInfo) << "bucket " << b << " launched";
#ifndef ZERO_BASE_LOGGING_H_
#define ZERO_BASE_LOGGING_H_

#include <sstream>
#include <string_view>

namespace zero::base {

/// Verbosity, from least to most: warnings only, progress, per-gradient detail.
enum class LogLevel : int { kWarn = 0, kInfo = 1, kDetail = 2 };

/// "WARN", "INFO", "DETAIL".
const char* LogLevelName(LogLevel level);

/// Writes whole lines to stderr for levels up to the configured one.
class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kWarn, int rank = -1)
      : level_(level), rank_(rank) {}

  /// True when lines of `level` are written; cheap enough for hot paths.
  bool Enabled(LogLevel level) const { return level <= level_; }
  LogLevel level() const { return level_; }
  /// The rank shown in the prefix; negative hides it.
  void set_rank(int rank) { rank_ = rank; }

  /// Writes one line (a trailing newline is added) with one write call, so lines from
  /// concurrent ranks do not interleave.
  void Write(LogLevel level, std::string_view message) const;

 private:
  LogLevel level_;
  int rank_;
};

/// Collects one line through operator<< and writes it when destroyed. Use via ZERO_LOG.
class LogLine {
 public:
  LogLine(const Logger& logger, LogLevel level) : logger_(logger), level_(level) {}
  ~LogLine() { logger_.Write(level_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  const Logger& logger_;
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace zero::base

/// Streams one log line at `level` (kWarn, kInfo, kDetail); the operands are not evaluated
/// when the level is disabled.
#define ZERO_LOG(logger, level)                                           \
  if (!(logger).Enabled(::zero::base::LogLevel::level)) {                 \
  } else                                                                  \
    ::zero::base::LogLine((logger), ::zero::base::LogLevel::level).stream()

#endif  // ZERO_BASE_LOGGING_H_
