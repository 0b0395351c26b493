#include "core/common/threads.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

namespace {

// The kernel's struct sched_attr (include/uapi/linux/sched/types.h; glibc
// 2.36 has no wrapper): its first version, 48 bytes, which every kernel since
// 3.14 takes. For a fair-class thread sched_runtime is the slice asked for,
// in nanoseconds (0: the default); sched_getattr reports the slice in use.
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;
  uint64_t sched_deadline;
  uint64_t sched_period;
};
static_assert(sizeof(SchedAttr) == 48);

absl::Status GetThisThreadAttr(SchedAttr& attr) {
  attr = SchedAttr{};
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) != 0) {
    return absl::InternalError(absl::StrCat("sched_getattr: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSlice(absl::Duration slice) {
  if (slice != absl::ZeroDuration() && (slice < kMinSlice || slice > kMaxSlice)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler slice ", absl::FormatDuration(slice), " is outside ",
        absl::FormatDuration(kMinSlice), "..", absl::FormatDuration(kMaxSlice),
        " (or 0 for the kernel's default)"));
  }
  return absl::OkStatus();
}

absl::Status SetThisThreadSlice(absl::Duration slice) {
  RETURN_IF_ERROR(ValidateSlice(slice));
  SchedAttr attr;
  RETURN_IF_ERROR(GetThisThreadAttr(attr));
  // Policy, nice and priority as they are (sched_setattr sets them all); the
  // flags that only mean something on the way out are dropped.
  attr.size = sizeof(attr);
  attr.sched_flags = 0;
  attr.sched_runtime = static_cast<uint64_t>(absl::ToInt64Nanoseconds(slice));
  attr.sched_deadline = 0;
  attr.sched_period = 0;
  if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0) {
    return absl::InternalError(absl::StrFormat("sched_setattr(slice %s): %s",
                                               absl::FormatDuration(slice),
                                               std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Duration ThisThreadSlice() {
  SchedAttr attr;
  if (!GetThisThreadAttr(attr).ok()) return absl::ZeroDuration();
  if (attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH &&
      attr.sched_policy != SCHED_IDLE) {
    return absl::ZeroDuration();
  }
  return absl::Nanoseconds(static_cast<int64_t>(attr.sched_runtime));
}

void NameAndLowerThisThread(absl::string_view name, int nice_increment) {
  NameThisThread(name);
  if (absl::Status s = SetThisThreadSlice(absl::ZeroDuration()); !s.ok()) {
    LogWarning(absl::StrCat(name, ": ", s.message(), "; it keeps its slice"));
  }
  if (nice_increment == 0) return;
  if (absl::Status s = LowerThisThreadPriority(nice_increment); !s.ok()) {
    LogWarning(absl::StrCat(name, ": ", s.message(), "; it keeps its priority"));
  }
}

}  // namespace memprofd
