// Logger output.
#include "base/logging.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace zero::base {

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDetail: return "DETAIL";
  }
  return "?";
}

void Logger::Write(LogLevel level, std::string_view message) const {
  if (!Enabled(level)) return;
  std::string line = rank_ >= 0 ? absl::StrCat("[zero r", rank_, " ", LogLevelName(level), "] ")
                                : absl::StrCat("[zero ", LogLevelName(level), "] ");
  line.append(message.data(), message.size());
  line.push_back('\n');
  // One write(2) per line: atomic for pipes up to PIPE_BUF, never interleaved mid-line.
  const ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace zero::base
