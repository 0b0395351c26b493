#include "core/common/threads.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/log.h"
#include "core/common/status_macros.h"

namespace memprofd {

void NameThisThread(absl::string_view name) {
  // pthread_setname_np refuses (ERANGE) names over 15 bytes instead of
  // cutting them.
  const std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

absl::Status ValidateNiceIncrement(int increment) {
  if (increment < 0 || increment > kMaxNice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nice increment ", increment, " is outside 0..", kMaxNice,
        " (memprofd only lowers its bulk work's priority: 0 leaves it as it is, 19 "
        "gives it the lowest)"));
  }
  return absl::OkStatus();
}

absl::Status LowerThisThreadPriority(int increment) {
  RETURN_IF_ERROR(ValidateNiceIncrement(increment));
  const int nice = std::min(kMaxNice, ThisThreadNice() + increment);
  // On Linux, PRIO_PROCESS with a thread id sets that one thread (POSIX would
  // set the process; glibc passes the id to the kernel as it is).
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), nice) != 0) {
    return absl::InternalError(
        absl::StrCat("setpriority(nice ", nice, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

int ThisThreadNice() { return getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())); }

void NameAndLowerThisThread(absl::string_view name, int nice_increment) {
  NameThisThread(name);
  if (nice_increment == 0) return;
  if (absl::Status s = LowerThisThreadPriority(nice_increment); !s.ok()) {
    LogWarning(absl::StrCat(name, ": ", s.message(), "; it keeps its priority"));
  }
}

}  // namespace memprofd
