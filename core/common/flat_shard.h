#ifndef MEMPROFD_CORE_COMMON_FLAT_SHARD_H_
#define MEMPROFD_CORE_COMMON_FLAT_SHARD_H_

// The flat partition of a parameter among the ranks of a sharded run
// (core/dist/sharding.h says which state each level shards this way). A
// parameter of n elements, read flat in its contiguous memory order, is cut
// into world_size chunks of c elements, c being ceil(n / world_size) rounded
// up to a multiple of kFlatShardAlignment; rank r owns the elements
// [r * c, min((r + 1) * c, n)). The last ranks' pieces may be shorter or
// empty; a shard padded with zeros to c elements is what the collectives
// move (world_size equal chunks). No LibTorch here.
//
// Why the alignment: every piece then starts a multiple of 16 elements into
// the parameter (64 bytes of float32), so the CPU's vectorised AdamW splits a piece
// into vector body and scalar tail exactly where it splits the whole
// parameter. Unaligned pieces move elements from the body to a tail, whose
// arithmetic rounds differently (no fused multiply-add), and a sharded run
// would drift from an unsharded one by float32 ulps after the first step
// that reads the moments. It also keeps collective chunks cache-line
// aligned. The price: up to kFlatShardAlignment elements of padding per
// rank and parameter.

#include <algorithm>
#include <cstdint>

namespace memprofd {

inline constexpr int64_t kFlatShardAlignment = 16;

struct FlatChunk {
  int64_t chunk = 0;  // c: every rank's padded shard, in elements
  // The first element this rank owns, r * c; n for an empty piece (r * c may
  // pass n), so that [begin, begin + length) is always within the parameter.
  int64_t begin = 0;
  int64_t length = 0;  // the elements it owns, 0 to c
};

// Rank `rank`'s piece of a parameter of `numel` elements among `world_size`
// ranks.
inline FlatChunk ChunkOf(int64_t numel, int rank, int world_size) {
  FlatChunk c;
  if (world_size <= 0 || numel <= 0) return c;
  const int64_t even = (numel + world_size - 1) / world_size;
  c.chunk = (even + kFlatShardAlignment - 1) / kFlatShardAlignment * kFlatShardAlignment;
  c.begin = std::min(c.chunk * rank, numel);
  c.length = std::min(numel - c.begin, c.chunk);
  return c;
}

// A run's place in the partition: this rank among world_size.
struct FlatShardSpec {
  int rank = 0;
  int world_size = 1;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_FLAT_SHARD_H_
