#include "core/memory/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "core/memory/oom_report.h"
#include "core/memory/recorder.h"

namespace memprofd {
namespace memory {
namespace {

constexpr size_t kHeaderBytes = 64;  // Keeps c10's 64-byte data alignment.
constexpr uint32_t kMagic = 0x6d656d70;
constexpr int kShards = 16;

// Lives in the first kHeaderBytes of every wrapped allocation; the tensor's
// data starts right after it.
struct alignas(64) BlockHeader {
  BlockHeader* prev;
  BlockHeader* next;
  void* original_context;
  c10::DeleterFnPtr original_deleter;
  int64_t size;
  uint32_t shard;
  uint32_t magic;
  // Who made the block and what it holds; changed only by Retag, by a thread
  // that holds the storage (so never while it is being freed).
  Attribution origin;
};
static_assert(sizeof(BlockHeader) == kHeaderBytes, "header must be 64 bytes");

// A circular list of live blocks with a sentinel head; sharded so that
// threads allocating at once rarely share a lock. std::mutex: see the note in
// history.h (absl::Mutex costs ~9x more uncontended on Debian 12).
struct alignas(64) Shard {
  std::mutex mu;
  BlockHeader head;  // Guarded by mu.
  Shard() {
    head.prev = &head;
    head.next = &head;
  }
};

// Threads take shards round-robin; a free goes to the shard in its header.
uint32_t ThreadShard() {
  static std::atomic<uint32_t> next{0};
  thread_local const uint32_t shard =
      next.fetch_add(1, std::memory_order_relaxed) % kShards;
  return shard;
}

class CountingCpuAllocator;
CountingCpuAllocator* g_allocator = nullptr;  // Leaked; set once.
std::atomic<bool> g_installed{false};
// SetCpuMemoryLimit's cap (0: none) and the bytes the wrapper holds now,
// counted against it.
std::atomic<int64_t> g_limit{0};
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_total_bytes{0};

// Counts `n` more bytes against the cap; false (nothing counted) when they
// would go beyond it.
bool Reserve(int64_t n) {
  const int64_t limit = g_limit.load(std::memory_order_relaxed);
  const int64_t after = g_live_bytes.fetch_add(n, std::memory_order_relaxed) + n;
  if (limit <= 0 || after <= limit) {
    g_total_bytes.fetch_add(n, std::memory_order_relaxed);
    return true;
  }
  g_live_bytes.fetch_sub(n, std::memory_order_relaxed);
  return false;
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  CountingCpuAllocator(c10::Allocator* underlying, MemoryRecorder* recorder)
      : underlying_(underlying), recorder_(recorder) {}

  c10::DataPtr allocate(size_t n) override { return Allocate(n); }

  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  // Allocator::clone copies through it.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }

  std::vector<LiveBlock> Live() const {
    std::vector<LiveBlock> out;
    for (Shard& s : shards_) {
      std::lock_guard<std::mutex> lock(s.mu);
      for (const BlockHeader* h = s.head.next; h != &s.head; h = h->next) {
        out.push_back(
            {kCpuDevice,
             reinterpret_cast<uint64_t>(reinterpret_cast<const char*>(h) + kHeaderBytes),
             h->size, h->origin});
      }
    }
    return out;
  }

 private:
  c10::DataPtr Allocate(size_t n) const {
    if (n == 0 || n > SIZE_MAX - kHeaderBytes) return underlying_->allocate(n);
    const auto bytes = static_cast<int64_t>(n);
    if (!Reserve(bytes)) {
      // The device cap: refused as an allocation the memory cannot hold is,
      // with the same report and the same exception.
      NoteAllocationFailure(kCpuDevice, bytes);
      const int64_t limit = g_limit.load(std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ",
                       bytes, " bytes with ",
                       g_live_bytes.load(std::memory_order_relaxed),
                       " of the device memory limit's ", limit,
                       " bytes allocated (--device_memory_limit)");
    }
    c10::DataPtr raw;
    try {
      raw = underlying_->allocate(n + kHeaderBytes);
    } catch (...) {
      g_live_bytes.fetch_sub(bytes, std::memory_order_relaxed);
      // Seen here, before the exception unwinds the step and frees what
      // filled the memory: what is live now goes into the OOM report.
      NoteAllocationFailure(kCpuDevice, bytes);
      throw;
    }
    char* base = static_cast<char*>(raw.get());
    const c10::Device device = raw.device();
    auto* h = reinterpret_cast<BlockHeader*>(base);
    h->original_deleter = raw.get_deleter();
    h->original_context = raw.release_context();
    h->size = static_cast<int64_t>(n);
    h->shard = ThreadShard();
    h->magic = kMagic;
    h->origin = CurrentAttribution();
    Shard& s = shards_[h->shard];
    {
      std::lock_guard<std::mutex> lock(s.mu);
      h->prev = &s.head;
      h->next = s.head.next;
      s.head.next->prev = h;
      s.head.next = h;
    }
    void* data = base + kHeaderBytes;
    recorder_->RecordAlloc(kCpuDevice, reinterpret_cast<uint64_t>(data), h->size,
                           h->origin);
    // Context == data, so raw_allocate()/raw_deallocate() work too.
    return c10::DataPtr(data, data, &Delete, device);
  }

  static void Delete(void* data) {
    if (data == nullptr) return;
    auto* h = reinterpret_cast<BlockHeader*>(static_cast<char*>(data) - kHeaderBytes);
    CountingCpuAllocator* self = g_allocator;
    // Recorded before the memory is released, so that a reuse of the address
    // by another thread is always recorded after this free.
    self->recorder_->RecordFree(kCpuDevice, reinterpret_cast<uint64_t>(data), h->size,
                                h->origin);
    {
      Shard& s = self->shards_[h->shard];
      std::lock_guard<std::mutex> lock(s.mu);
      h->prev->next = h->next;
      h->next->prev = h->prev;
    }
    h->magic = 0;
    const int64_t size = h->size;
    h->original_deleter(h->original_context);
    g_live_bytes.fetch_sub(size, std::memory_order_relaxed);
  }

 public:
  // The header of a block this wrapper allocated, or nullptr.
  static BlockHeader* HeaderOf(void* data, void (*deleter)(void*)) {
    if (data == nullptr || deleter != &Delete) return nullptr;
    auto* h = reinterpret_cast<BlockHeader*>(static_cast<char*>(data) - kHeaderBytes);
    return h->magic == kMagic ? h : nullptr;
  }
  MemoryRecorder* recorder() const { return recorder_; }

 private:
  c10::Allocator* const underlying_;
  MemoryRecorder* const recorder_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace

absl::Status InstallCountingCpuAllocator() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (g_installed.load()) return absl::OkStatus();
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  if (g_allocator == nullptr) {
    g_allocator = new CountingCpuAllocator(current, &MemoryRecorder::Global());
  }
  c10::SetAllocator(c10::DeviceType::CPU, g_allocator, kCountingCpuAllocatorPriority);
  if (c10::GetAllocator(c10::DeviceType::CPU) != g_allocator) {
    return absl::FailedPreconditionError(
        "another CPU allocator with a higher c10::SetAllocator priority is installed; "
        "CPU memory cannot be counted. Remove it or install memprofd's wrapper first");
  }
  g_installed.store(true);
  return absl::OkStatus();
}

bool IsCountingCpuAllocatorInstalled() { return g_installed.load(); }

std::optional<Attribution> CpuBlockAttribution(void* data, void (*deleter)(void*)) {
  const BlockHeader* h = CountingCpuAllocator::HeaderOf(data, deleter);
  if (h == nullptr) return std::nullopt;
  return h->origin;
}

bool RetagCpuBlock(void* data, void (*deleter)(void*), ModuleId module,
                   Category category) {
  BlockHeader* h = CountingCpuAllocator::HeaderOf(data, deleter);
  if (h == nullptr || g_allocator == nullptr) return false;
  const Attribution from = h->origin;
  if (from.module == module && from.category == category) return true;
  h->origin.module = module;
  h->origin.category = category;
  g_allocator->recorder()->Retag(kCpuDevice, h->size, from, module, category);
  return true;
}

void SetCpuMemoryLimit(int64_t bytes) {
  g_limit.store(std::max<int64_t>(0, bytes), std::memory_order_relaxed);
}

int64_t CpuMemoryLimit() { return g_limit.load(std::memory_order_relaxed); }

int64_t CpuAllocatedBytes() { return g_live_bytes.load(std::memory_order_relaxed); }

int64_t CpuAllocatedBytesTotal() { return g_total_bytes.load(std::memory_order_relaxed); }

std::vector<LiveBlock> LiveCpuBlocks() {
  if (g_allocator == nullptr) return {};
  return g_allocator->Live();
}

}  // namespace memory
}  // namespace memprofd
