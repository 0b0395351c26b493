#include "core/memory/op_attribution.h"

#include <ATen/record_function.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "core/common/attribution.h"

namespace memprofd {
namespace memory {
namespace {

// What a RecordFunction start replaced, restored at its end. Start and end
// callbacks nest on a thread; deeper than kMaxDepth only the depth is kept.
constexpr int kMaxDepth = 128;
struct OpStack {
  std::array<OpId, kMaxDepth> ops{};
  std::array<ModuleId, kMaxDepth> modules{};
  int depth = 0;
  // Op names seen on this thread, by content: a backward node's name is a
  // string made per call, so its address says nothing.
  absl::flat_hash_map<std::string, OpId> by_name;
};

OpStack& ThisThreadOps() {
  thread_local OpStack stack;
  return stack;
}

// Forward ops' sequence numbers (which the autograd node each creates
// carries into backward) -> the module the op ran in. A direct-mapped table:
// (sequence number << 16 | module id); an older sequence number in the slot
// is overwritten, and a lookup that finds another number finds nothing.
constexpr size_t kSeqSlots = 1 << 16;
std::array<std::atomic<uint64_t>, kSeqSlots>& SeqModules() {
  static auto* const table = new std::array<std::atomic<uint64_t>, kSeqSlots>();
  return *table;
}

void RememberModule(int64_t seq, ModuleId module) {
  SeqModules()[static_cast<size_t>(seq) & (kSeqSlots - 1)].store(
      (static_cast<uint64_t>(seq) << 16) | module, std::memory_order_relaxed);
}

ModuleId ModuleOfSeq(int64_t seq) {
  const uint64_t v = SeqModules()[static_cast<size_t>(seq) & (kSeqSlots - 1)].load(
      std::memory_order_relaxed);
  if ((v >> 16) != (static_cast<uint64_t>(seq) & ((uint64_t{1} << 48) - 1))) return 0;
  return static_cast<ModuleId>(v & 0xffff);
}

OpId Intern(OpStack& s, const char* name) {
  const absl::string_view key(name);
  auto it = s.by_name.find(key);
  if (it == s.by_name.end())
    it = s.by_name.emplace(std::string(key), InternOp(key)).first;
  return it->second;
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  OpStack& s = ThisThreadOps();
  ThreadAttribution& t = ThisThreadAttribution();
  if (s.depth < kMaxDepth) {
    s.ops[static_cast<size_t>(s.depth)] = t.op;
    s.modules[static_cast<size_t>(s.depth)] = t.module;
  }
  ++s.depth;
  const char* name = fn.name();
  if (name == nullptr) return nullptr;
  const int64_t seq = fn.seqNr();
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    t.op = Intern(s, name);
    if (seq >= 0) {
      const ModuleId module = ModuleOfSeq(seq);
      if (module != 0) t.module = module;
    }
    return nullptr;
  }
  // An aten op inside a backward node keeps the node as the op: the node is
  // what backward is doing; the kernels it calls are its details.
  if (seq >= 0 && t.module != 0) RememberModule(seq, t.module);
  if (s.depth > 1 && s.depth <= kMaxDepth) {
    // Only the outermost op of a nest names the allocation (aten::linear
    // rather than the aten::mm inside it), unless nothing named it yet.
    if (t.op != 0) return nullptr;
  }
  t.op = Intern(s, name);
  return nullptr;
}

void OnEnd(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  OpStack& s = ThisThreadOps();
  if (s.depth == 0) return;
  --s.depth;
  if (s.depth < kMaxDepth) {
    ThreadAttribution& t = ThisThreadAttribution();
    t.op = s.ops[static_cast<size_t>(s.depth)];
    t.module = s.modules[static_cast<size_t>(s.depth)];
  }
}

at::RecordFunctionCallback Callbacks() {
  return at::RecordFunctionCallback(&OnStart, &OnEnd)
      .needsInputs(false)
      .needsOutputs(false)
      .needsIds(false)
      .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION});
}

}  // namespace

OpAttribution::OpAttribution() {
  // A global callback rather than a thread-local one: LibTorch copies
  // thread-local callbacks into every at::parallel_for worker and autograd
  // thread with its ThreadLocalState, which rebuilds their callback lists
  // per parallel region (memory_bench: +4.6% to +7.7% on the tiny step).
  handle_ = at::addGlobalCallback(Callbacks());
}

OpAttribution::~OpAttribution() { at::removeCallback(handle_); }

ThreadOpAttribution::ThreadOpAttribution() {
  handle_ = at::addThreadLocalCallback(Callbacks());
}

ThreadOpAttribution::~ThreadOpAttribution() { at::removeCallback(handle_); }

}  // namespace memory
}  // namespace memprofd
