#ifndef MEMPROFD_SERVER_CONVERT_H_
#define MEMPROFD_SERVER_CONVERT_H_

// Conversions between core:: structs and memprofd.v1 messages. Pure
// functions; thread-safe.

#include "core/common/operation.h"
#include "memprofd/v1/operation.pb.h"

namespace memprofd {

// Fills the typed result from the view's std::any by the operation's kind.
v1::Operation ToProto(const OperationView& view);

int64_t UnixMicros(absl::Time t);

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_CONVERT_H_
