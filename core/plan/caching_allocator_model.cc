#include "core/plan/caching_allocator_model.h"

#include <algorithm>
#include <tuple>

namespace memprofd::plan {
namespace {

int64_t RoundUp(int64_t bytes, int64_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

}  // namespace

struct CachingAllocatorModel::Block {
  int64_t size = 0;
  int64_t segment = 0;  // creation order: stands in for the address
  int64_t offset = 0;   // within the segment
  bool small = false;
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
};

bool CachingAllocatorModel::BySize::operator()(const Block* a, const Block* b) const {
  return std::tie(a->size, a->segment, a->offset) <
         std::tie(b->size, b->segment, b->offset);
}

CachingAllocatorModel::CachingAllocatorModel() = default;

CachingAllocatorModel::~CachingAllocatorModel() {
  for (Block* b : segment_heads_) {
    while (b != nullptr) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

CachingAllocatorModel::Block* CachingAllocatorModel::NewSegment(int64_t size,
                                                                bool small) {
  auto* b = new Block;
  b->size = size;
  b->segment = segments();
  b->small = small;
  segment_heads_.push_back(b);
  reserved_ += size;
  return b;
}

int64_t CachingAllocatorModel::Allocate(uint64_t id, int64_t bytes) {
  if (bytes <= 0) return 0;
  const int64_t size = std::max(kMinBlockSize, RoundUp(bytes, kMinBlockSize));
  const bool small = size <= kSmallSize;
  Pool& pool = small ? small_ : large_;
  // Best fit: the first free block at least `size` large.
  Block key;
  key.size = size;
  key.segment = -1;
  Block* b = nullptr;
  if (auto it = pool.lower_bound(&key); it != pool.end()) {
    b = *it;
    pool.erase(it);
  } else {
    const int64_t segment = small                   ? kSmallBuffer
                            : size < kMinLargeAlloc ? kLargeBuffer
                                                    : RoundUp(size, kRoundLarge);
    b = NewSegment(segment, small);
  }
  const int64_t remaining = b->size - size;
  if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    auto* rest = new Block;
    rest->size = remaining;
    rest->segment = b->segment;
    rest->offset = b->offset + size;
    rest->small = b->small;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool.insert(rest);
  }
  b->allocated = true;
  allocated_ += b->size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  live_[id] = b;
  return b->size;
}

void CachingAllocatorModel::Free(uint64_t id) {
  auto found = live_.find(id);
  if (found == live_.end()) return;
  Block* b = found->second;
  live_.erase(found);
  allocated_ -= b->size;
  b->allocated = false;
  Pool& pool = b->small ? small_ : large_;
  if (Block* prev = b->prev; prev != nullptr && !prev->allocated) {
    pool.erase(prev);  // before its size (the pool's key) changes
    prev->size += b->size;
    prev->next = b->next;
    if (b->next != nullptr) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (Block* next = b->next; next != nullptr && !next->allocated) {
    pool.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (next->next != nullptr) next->next->prev = b;
    delete next;
  }
  pool.insert(b);
}

}  // namespace memprofd::plan
