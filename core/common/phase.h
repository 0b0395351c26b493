#ifndef MEMPROFD_CORE_COMMON_PHASE_H_
#define MEMPROFD_CORE_COMMON_PHASE_H_

// What the owner thread is doing, process-wide, so that memory accounting can
// attribute every allocation to a phase and a step.

#include <cstdint>

#include "absl/strings/string_view.h"

namespace memprofd {

enum class Phase : uint8_t {
  kIdle = 0,
  kLoad = 1,
  kForward = 2,
  kBackward = 3,
  kOptimizer = 4,
  kSnapshot = 5,
};
inline constexpr int kNumPhases = 6;

// "idle", "load", "forward", "backward", "optimizer", "snapshot".
absl::string_view PhaseName(Phase phase);

// Told of every phase change and step boundary. Implementations must be
// cheap and thread-safe: they run on the owner thread, inside training steps.
class PhaseListener {
 public:
  virtual ~PhaseListener() = default;
  // A training step `global_step` (1-based) begins or ends.
  virtual void OnStepBegin(int64_t global_step) = 0;
  virtual void OnStepEnd(int64_t global_step) = 0;
  // The process entered `phase`.
  virtual void OnPhase(Phase phase) = 0;
};

// The current phase and step; readable from any thread (relaxed atomics).
// On a thread inside a PhaseDomainScope: the domain's.
Phase CurrentPhase();
int64_t CurrentStep();

// Sets the process-wide listener (nullptr to clear); not owned, must outlive
// its registration. Call before training starts.
void SetPhaseListener(PhaseListener* listener);

// Step boundary markers; called by the trainer on the owner thread.
void BeginStep(int64_t global_step);
void EndStep(int64_t global_step);

// A phase and step of their own for the threads that enter it, so that a dry
// run (core/plan: a training step planned on the meta device) can mark its
// steps and phases beside a real training whose markers stay process-wide.
// While a PhaseDomainScope is alive on a thread, that thread's CurrentPhase,
// CurrentStep, BeginStep, EndStep and PhaseScope read and tell the domain
// and its listener, never the process's (and other threads never see the
// domain's). Not thread-safe: one thread uses a domain at a time.
struct PhaseDomain {
  // Told of the domain's boundaries and phases (null: nobody); not owned,
  // must outlive the domain's use.
  PhaseListener* listener = nullptr;
  Phase phase = Phase::kIdle;
  int64_t step = 0;
};

// Enters `domain` on this thread for its lifetime (nests; restores the
// previous one after). Create and destroy on one thread.
class PhaseDomainScope {
 public:
  explicit PhaseDomainScope(PhaseDomain* domain);
  ~PhaseDomainScope();
  PhaseDomainScope(const PhaseDomainScope&) = delete;
  PhaseDomainScope& operator=(const PhaseDomainScope&) = delete;

 private:
  PhaseDomain* const previous_;
};

// Enters `phase` for its lifetime and restores the previous phase after.
// Owner thread only (or a thread inside a PhaseDomainScope).
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase previous_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_PHASE_H_
