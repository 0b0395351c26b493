#ifndef MEMPROFD_CORE_COMMON_THREADS_H_
#define MEMPROFD_CORE_COMMON_THREADS_H_

// Names and CPU priorities of the daemon's own threads (Linux).
//
// A thread created after these calls inherits its creator's name and nice
// value, so what the owner thread sets at its start also holds for the
// threads it goes on to create: libgomp's pool for the parallel regions it
// starts (libgomp keeps one pool per thread that starts regions), the
// autograd engine's device threads, the offloader's writer and read-ahead
// threads, the snapshot writers. gRPC's, the metrics server's and the main
// thread are not the owner's children and keep their own.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

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

// What a thread of the daemon's bulk work does first: NameThisThread(name),
// then LowerThisThreadPriority(nice_increment) unless it is 0, with a
// warning in the log (the thread then keeps its priority) when that fails.
void NameAndLowerThisThread(absl::string_view name, int nice_increment);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_THREADS_H_
