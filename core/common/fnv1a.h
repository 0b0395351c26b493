#ifndef MEMPROFD_CORE_COMMON_FNV1A_H_
#define MEMPROFD_CORE_COMMON_FNV1A_H_

// FNV-1a, 64 bits: a hash stable across processes, builds and machines
// (unlike absl::Hash), for fingerprints that are written down or compared
// between ranks.

#include <cstddef>
#include <cstdint>

namespace memprofd {

inline constexpr uint64_t kFnv1aOffsetBasis = 14695981039346656037ull;

// Mixes `size` bytes at `data` into *hash (start from kFnv1aOffsetBasis).
inline void Fnv1a(const void* data, size_t size, uint64_t* hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    *hash ^= p[i];
    *hash *= 1099511628211ull;
  }
}

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_FNV1A_H_
