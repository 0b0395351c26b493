#ifndef MEMPROFD_CORE_COMMON_THREADS_H_
#define MEMPROFD_CORE_COMMON_THREADS_H_

// Names and CPU priorities of the daemon's own threads (Linux).
//
// A thread created after these calls inherits its creator's name, nice value
// and scheduler slice, so what the owner thread sets at its start also holds for the
// threads it goes on to create: libgomp's pool for the parallel regions it
// starts (libgomp keeps one pool per thread that starts regions), the
// autograd engine's device threads, the offloader's writer and read-ahead
// threads, the snapshot writers. gRPC's, the metrics server's and the main
// thread are not the owner's children and keep their own.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace memprofd {

// The highest nice value Linux has: the least CPU share when others run.
inline constexpr int kMaxNice = 19;

// Names the calling thread, as top -H, ps -L, /proc/<pid>/task/<tid>/comm,
// gdb and py-spy show it. Linux keeps the first 15 bytes; longer names are
// cut there. Best effort: a failure changes nothing and is not reported.
void NameThisThread(absl::string_view name);

// OK for an increment of 0..kMaxNice, else INVALID_ARGUMENT saying what to
// give.
absl::Status ValidateNiceIncrement(int increment);

// Adds `increment` (0..kMaxNice) to the calling thread's nice value, as
// nice(1) does for a process, stopping at kMaxNice. Linux gives a thread of
// nice n + k about 1.25^-k of the CPU share of one of nice n when both want
// a CPU. Lowering priority needs no privilege; raising it back may
// (RLIMIT_NICE), which is why this only lowers and why the daemon does it
// once, at a thread's start. INVALID_ARGUMENT outside 0..19; INTERNAL when
// the kernel refuses. Affects only the calling thread.
absl::Status LowerThisThreadPriority(int increment);

// The calling thread's nice value.
int ThisThreadNice();

// The slices a thread can ask Linux's fair scheduler for (it clamps others
// into this range).
inline constexpr absl::Duration kMinSlice = absl::Microseconds(100);
inline constexpr absl::Duration kMaxSlice = absl::Milliseconds(100);

// OK for zero (the kernel's default) or kMinSlice..kMaxSlice, else
// INVALID_ARGUMENT saying what to give.
absl::Status ValidateSlice(absl::Duration slice);

// Asks the scheduler for `slice` as the calling thread's time slice; zero
// gives back the kernel's default (0.7 ms x (1 + log2 of the CPU count, the
// count capped at 8): 1.4 ms on 2 cores). On Linux 6.12 and later (EEVDF with custom
// slices) a thread that wakes with a shorter slice than the running one
// takes the CPU at once instead of waiting for the running one's slice to
// end; the CPU share between the two is unchanged (that is the nice value's
// business). Earlier kernels accept the request and ignore it. Keeps the
// thread's policy and nice value; needs no privilege. INVALID_ARGUMENT as
// ValidateSlice; INTERNAL when the kernel refuses.
absl::Status SetThisThreadSlice(absl::Duration slice);

// The calling thread's slice as the kernel reports it: zero where it does not
// (before Linux 6.12).
absl::Duration ThisThreadSlice();

// What a thread of the daemon's bulk work does first: NameThisThread(name);
// SetThisThreadSlice(zero), so that it does not keep the short slice of the
// serving thread that may have created it; then
// LowerThisThreadPriority(nice_increment) unless it is 0. A failure of either
// leaves a warning in the log, and the thread keeps what it had.
void NameAndLowerThisThread(absl::string_view name, int nice_increment);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_THREADS_H_
