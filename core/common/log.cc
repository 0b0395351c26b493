#include "core/common/log.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace memprofd {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace

bool ParseLogLevel(absl::string_view text, LogLevel* level) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "debug") {
    *level = LogLevel::kDebug;
  } else if (t == "info") {
    *level = LogLevel::kInfo;
  } else if (t == "warning" || t == "warn") {
    *level = LogLevel::kWarning;
  } else if (t == "error") {
    *level = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  static constexpr char kTag[] = {'D', 'I', 'W', 'E'};
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
      std::string(1, kTag[static_cast<int>(level)]), " memprofd: ", message, "\n");
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace memprofd
