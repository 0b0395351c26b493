#ifndef MEMPROFD_SERVER_CONVERT_MEMORY_H_
#define MEMPROFD_SERVER_CONVERT_MEMORY_H_

// Conversions between core::memory's attribution structs (breakdowns, step
// diffs) and memprofd.v1 messages. Pure functions; thread-safe.

#include "core/memory/breakdown.h"
#include "memprofd/v1/memory.pb.h"

namespace memprofd {

memory::BreakdownRequest FromProto(const v1::GetMemoryBreakdownRequest& request);
v1::MemoryBreakdown ToProto(const memory::MemoryBreakdown& breakdown);
v1::MemoryDiff ToProto(const memory::MemoryDiff& diff);

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_CONVERT_MEMORY_H_
