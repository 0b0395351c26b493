#ifndef MEMPROFD_CORE_TRAIN_FLAT_SHARD_H_
#define MEMPROFD_CORE_TRAIN_FLAT_SHARD_H_

// The flat partition of a parameter among the ranks of a sharded run
// (core/dist/sharding.h says which state each level shards this way). A
// parameter of n elements, read flat in its contiguous memory order, is cut
// into world_size chunks of c = ceil(n / world_size) elements; rank r owns
// the elements [r * c, min((r + 1) * c, n)). The last ranks' pieces may be
// shorter or empty; a shard padded with zeros to c elements is what the
// collectives move (world_size equal chunks). No LibTorch here.

#include <algorithm>
#include <cstdint>

namespace memprofd {

struct FlatChunk {
  int64_t chunk = 0;   // c: every rank's padded shard, in elements
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
  c.chunk = (numel + world_size - 1) / world_size;
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

#endif  // MEMPROFD_CORE_TRAIN_FLAT_SHARD_H_
