#include "server/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/utf8.h"
#include "server/option_flags.h"

namespace memprofd {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // A status about one of the daemon's options says which flag sets it.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      BoundedStatusMessage(MessageWithFlag(status)));
}

std::string BoundedStatusMessage(absl::string_view message) {
  if (message.size() <= kMaxStatusMessageBytes) return ToValidUtf8(message);
  // Cut at a character boundary: never inside a UTF-8 sequence.
  size_t cut = kMaxStatusMessageBytes;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(ToValidUtf8(message.substr(0, cut)), "... (", message.size() - cut,
                      " more bytes cut)");
}

std::string GrpcCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace memprofd
