#ifndef MEMPROFD_CORE_COMMON_LOG_H_
#define MEMPROFD_CORE_COMMON_LOG_H_

// Minimal leveled logging to stderr (Abseil 20220623 has no absl/log).
// Lines look like "2026-11-29T17:00:00.123Z I memprofd: message".
// Thread-safe: each line is written with one write(2).

#include "absl/strings/string_view.h"

namespace memprofd {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug", "info", "warning", "error" (case-insensitive); false if unknown.
bool ParseLogLevel(absl::string_view text, LogLevel* level);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void Log(LogLevel level, absl::string_view message);

inline void LogInfo(absl::string_view m) { Log(LogLevel::kInfo, m); }
inline void LogWarning(absl::string_view m) { Log(LogLevel::kWarning, m); }
inline void LogError(absl::string_view m) { Log(LogLevel::kError, m); }

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_LOG_H_
