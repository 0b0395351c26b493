#ifndef MEMPROFD_CORE_PLAN_CACHING_ALLOCATOR_MODEL_H_
#define MEMPROFD_CORE_PLAN_CACHING_ALLOCATOR_MODEL_H_

// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator
// with its default settings: one stream, no max_split_size, no
// expandable segments, no garbage collection, no cache release), replaying a
// dry run's allocations and frees to predict the bytes it reserves from the
// device (torch.cuda.max_memory_reserved). The rules modelled:
//
// - a request is rounded up to a multiple of 512 bytes (kMinBlockSize);
// - requests up to 1 MiB (kSmallSize) come from the small pool, larger ones
//   from the large pool; each pool's free blocks are searched best fit (the
//   smallest that is large enough, the oldest segment's first among equals);
// - when none fits, a new segment is reserved: 2 MiB (kSmallBuffer) for a
//   small request, 20 MiB (kLargeBuffer) for one under 10 MiB
//   (kMinLargeAlloc), else the request rounded up to 2 MiB (kRoundLarge);
// - a free block larger than the request is split when the remainder is at
//   least 512 bytes (small pool) or more than 1 MiB (large pool); otherwise
//   the whole block is handed out;
// - a freed block merges with the free blocks beside it in its segment;
// - segments are never released (a real allocator releases its cache only
//   when a cudaMalloc fails, or on empty_cache).
//
// Not modelled: other streams (blocks freed while another stream uses them),
// the allocator's garbage collection and PYTORCH_CUDA_ALLOC_CONF settings,
// and the process's allocations outside the dry run.
//
// Thread-compatible: the caller serialises.

#include <cstdint>
#include <set>
#include <unordered_map>
#include <vector>

namespace memprofd::plan {

class CachingAllocatorModel {
 public:
  static constexpr int64_t kMinBlockSize = 512;
  static constexpr int64_t kSmallSize = 1 << 20;
  static constexpr int64_t kSmallBuffer = 2 << 20;
  static constexpr int64_t kLargeBuffer = 20 << 20;
  static constexpr int64_t kMinLargeAlloc = 10 << 20;
  static constexpr int64_t kRoundLarge = 2 << 20;

  CachingAllocatorModel();
  ~CachingAllocatorModel();

  // A block of `bytes` for the allocation `id` (ids are unique among live
  // allocations; a request of 0 bytes takes no block). Returns the block's
  // size: the request rounded up, or more when a free block is handed out
  // whole (what torch.cuda.memory_allocated counts for it); 0 for none.
  int64_t Allocate(uint64_t id, int64_t bytes);
  // Frees allocation `id`'s block; unknown ids are ignored.
  void Free(uint64_t id);

  // Reserved bytes now and at their most (the same: segments are kept).
  int64_t reserved_bytes() const { return reserved_; }
  // Bytes of the blocks handed out now, and at their most: a block handed
  // out whole counts whole, as torch.cuda.memory_allocated counts it.
  int64_t allocated_bytes() const { return allocated_; }
  int64_t peak_allocated_bytes() const { return peak_allocated_; }
  int64_t segments() const { return static_cast<int64_t>(segment_heads_.size()); }

 private:
  struct Block;
  // Free blocks of a pool, ordered as the allocator searches them: by size,
  // then segment, then address.
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BySize>;

  Block* NewSegment(int64_t size, bool small);

  Pool small_;
  Pool large_;
  // Each segment's first block; a segment's blocks are a list through
  // prev/next, owned by the model (split makes them, merge deletes them).
  std::vector<Block*> segment_heads_;
  std::unordered_map<uint64_t, Block*> live_;
  int64_t reserved_ = 0;
  int64_t allocated_ = 0;
  int64_t peak_allocated_ = 0;
};

}  // namespace memprofd::plan

#endif  // MEMPROFD_CORE_PLAN_CACHING_ALLOCATOR_MODEL_H_
