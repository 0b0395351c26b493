#include "core/common/phase.h"

#include <atomic>

namespace memprofd {
namespace {

std::atomic<int> g_phase{static_cast<int>(Phase::kIdle)};
std::atomic<int64_t> g_step{0};
std::atomic<PhaseListener*> g_listener{nullptr};

// This thread's domain (PhaseDomainScope), or null for the process's.
PhaseDomain*& ThisThreadDomain() {
  thread_local PhaseDomain* domain = nullptr;
  return domain;
}

}  // namespace

PhaseDomainScope::PhaseDomainScope(PhaseDomain* domain) : previous_(ThisThreadDomain()) {
  ThisThreadDomain() = domain;
}

PhaseDomainScope::~PhaseDomainScope() { ThisThreadDomain() = previous_; }

namespace {

void Enter(Phase phase) {
  if (PhaseDomain* d = ThisThreadDomain()) {
    d->phase = phase;
    if (d->listener != nullptr) d->listener->OnPhase(phase);
    return;
  }
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
  if (const PhaseDomain* d = ThisThreadDomain()) return d->phase;
  return static_cast<Phase>(g_phase.load(std::memory_order_relaxed));
}

int64_t CurrentStep() {
  if (const PhaseDomain* d = ThisThreadDomain()) return d->step;
  return g_step.load(std::memory_order_relaxed);
}

void SetPhaseListener(PhaseListener* listener) {
  g_listener.store(listener, std::memory_order_release);
}

void BeginStep(int64_t global_step) {
  if (PhaseDomain* d = ThisThreadDomain()) {
    d->step = global_step;
    if (d->listener != nullptr) d->listener->OnStepBegin(global_step);
    return;
  }
  g_step.store(global_step, std::memory_order_relaxed);
  if (PhaseListener* l = g_listener.load(std::memory_order_acquire)) {
    l->OnStepBegin(global_step);
  }
}

void EndStep(int64_t global_step) {
  if (PhaseDomain* d = ThisThreadDomain()) {
    if (d->listener != nullptr) d->listener->OnStepEnd(global_step);
    return;
  }
  if (PhaseListener* l = g_listener.load(std::memory_order_acquire)) {
    l->OnStepEnd(global_step);
  }
}

PhaseScope::PhaseScope(Phase phase) : previous_(CurrentPhase()) { Enter(phase); }

PhaseScope::~PhaseScope() { Enter(previous_); }

}  // namespace memprofd
