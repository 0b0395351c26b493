#include "core/common/phase.h"

#include <atomic>

namespace memprofd {
namespace {

std::atomic<int> g_phase{static_cast<int>(Phase::kIdle)};
std::atomic<int64_t> g_step{0};
std::atomic<PhaseListener*> g_listener{nullptr};

void Enter(Phase phase) {
  g_phase.store(static_cast<int>(phase), std::memory_order_relaxed);
  if (PhaseListener* l = g_listener.load(std::memory_order_acquire)) {
    l->OnPhase(phase);
  }
}

}  // namespace

absl::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kIdle:
      return "idle";
    case Phase::kLoad:
      return "load";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kSnapshot:
      return "snapshot";
  }
  return "unknown";
}

Phase CurrentPhase() {
  return static_cast<Phase>(g_phase.load(std::memory_order_relaxed));
}

int64_t CurrentStep() { return g_step.load(std::memory_order_relaxed); }

void SetPhaseListener(PhaseListener* listener) {
  g_listener.store(listener, std::memory_order_release);
}

void BeginStep(int64_t global_step) {
  g_step.store(global_step, std::memory_order_relaxed);
  if (PhaseListener* l = g_listener.load(std::memory_order_acquire)) {
    l->OnStepBegin(global_step);
  }
}

void EndStep(int64_t global_step) {
  if (PhaseListener* l = g_listener.load(std::memory_order_acquire)) {
    l->OnStepEnd(global_step);
  }
}

PhaseScope::PhaseScope(Phase phase) : previous_(CurrentPhase()) { Enter(phase); }

PhaseScope::~PhaseScope() { Enter(previous_); }

}  // namespace memprofd
