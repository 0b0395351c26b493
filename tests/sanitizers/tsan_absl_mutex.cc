// absl::Mutex made visible to ThreadSanitizer, for the TSan build only.
//
// Debian's Abseil is not built with -fsanitize=thread, so the annotations
// absl::Mutex carries for TSan (ABSL_TSAN_MUTEX_*) are compiled out of
// libabsl_synchronization.so: TSan never sees a Lock or an Unlock, and every
// pair of accesses to state guarded by an absl::Mutex from two threads is
// reported as a race (session_test: 115 reports in one test case, all of
// them on guarded state). This library, linked into the TSan build's test
// binaries ahead of Abseil, defines the public lock and unlock entry points
// itself: each calls the TSan mutex interface around Abseil's own function
// (found with dlsym(RTLD_NEXT)), as Abseil does when it is built with TSan.
// An Await or a CondVar wait is a release before and an acquire after. The
// *WithTimeout forms are not defined here: Abseil's own compute a deadline
// and call the *WithDeadline form through the PLT, so they reach these.
// Conditions that Abseil evaluates on the unlocking thread still look
// unsynchronized; tsan.supp suppresses those by their Abseil frames.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace {

// Abseil's definition of the member function whose mangled name is `name`.
template <typename Fn>
Fn Real(const char* name) {
  void* sym = dlsym(RTLD_NEXT, name);
  if (sym == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found in Abseil\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(sym);
}

using MutexFn = void (*)(absl::Mutex*);
using TryFn = bool (*)(absl::Mutex*);
using CondFn = void (*)(absl::Mutex*, const absl::Condition&);
using CondTimeFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Time);
using WaitFn = void (*)(absl::CondVar*, absl::Mutex*);
using WaitTimeFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Time);

void Acquired(void* mu, unsigned flags) {
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
}

void Releasing(void* mu, unsigned flags) {
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
}

}  // namespace

// The mangled names are those of Debian 12's Abseil (inline namespace
// debian3); another Abseil fails loudly in Real() rather than silently.
#define MEMPROFD_ABSL_NS "N4absl7debian3"

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const MutexFn real = Real<MutexFn>("_Z" MEMPROFD_ABSL_NS "5Mutex4LockEv");
  real(this);
  Acquired(this, 0);
}

void Mutex::ReaderLock() {
  static const MutexFn real = Real<MutexFn>("_Z" MEMPROFD_ABSL_NS "5Mutex10ReaderLockEv");
  real(this);
  Acquired(this, __tsan_mutex_read_lock);
}

bool Mutex::TryLock() {
  static const TryFn real = Real<TryFn>("_Z" MEMPROFD_ABSL_NS "5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquired(this, __tsan_mutex_try_lock);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static const TryFn real = Real<TryFn>("_Z" MEMPROFD_ABSL_NS "5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquired(this, __tsan_mutex_read_lock | __tsan_mutex_try_lock);
  return locked;
}

void Mutex::Unlock() {
  static const MutexFn real = Real<MutexFn>("_Z" MEMPROFD_ABSL_NS "5Mutex6UnlockEv");
  Releasing(this, 0);
  real(this);
}

void Mutex::ReaderUnlock() {
  static const MutexFn real =
      Real<MutexFn>("_Z" MEMPROFD_ABSL_NS "5Mutex12ReaderUnlockEv");
  Releasing(this, __tsan_mutex_read_lock);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  static const CondFn real =
      Real<CondFn>("_Z" MEMPROFD_ABSL_NS "5Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  Acquired(this, 0);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const CondTimeFn real = Real<CondTimeFn>(
      "_Z" MEMPROFD_ABSL_NS "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool met = real(this, cond, deadline);
  Acquired(this, 0);
  return met;
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const CondFn real =
      Real<CondFn>("_Z" MEMPROFD_ABSL_NS "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  real(this, cond);
  Acquired(this, __tsan_mutex_read_lock);
}

void Mutex::Await(const Condition& cond) {
  static const CondFn real =
      Real<CondFn>("_Z" MEMPROFD_ABSL_NS "5Mutex5AwaitERKNS0_9ConditionE");
  Releasing(this, 0);
  real(this, cond);
  Acquired(this, 0);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static const CondTimeFn real = Real<CondTimeFn>(
      "_Z" MEMPROFD_ABSL_NS "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Releasing(this, 0);
  const bool met = real(this, cond, deadline);
  Acquired(this, 0);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  static const WaitFn real =
      Real<WaitFn>("_Z" MEMPROFD_ABSL_NS "7CondVar4WaitEPNS0_5MutexE");
  Releasing(mu, 0);
  real(this, mu);
  Acquired(mu, 0);
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static const WaitTimeFn real = Real<WaitTimeFn>(
      "_Z" MEMPROFD_ABSL_NS "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Releasing(mu, 0);
  const bool timed_out = real(this, mu, deadline);
  Acquired(mu, 0);
  return timed_out;
}

ABSL_NAMESPACE_END
}  // namespace absl
