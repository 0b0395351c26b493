#include "core/common/torch_boundary.h"

#include <c10/util/Exception.h>

#include <new>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace memprofd {
namespace {

constexpr size_t kMaxMessageBytes = 1024;

absl::Status Make(absl::StatusCode code, absl::string_view what,
                  absl::string_view detail) {
  std::string message =
      what.empty() ? std::string(detail) : absl::StrCat(what, ": ", detail);
  if (message.size() > kMaxMessageBytes) {
    message.resize(kMaxMessageBytes - 3);
    message += "...";
  }
  return absl::Status(code, message);
}

}  // namespace

bool IsOutOfMemoryMessage(absl::string_view message) {
  return absl::StrContains(message, "can't allocate memory") ||
         absl::StrContains(message, "out of memory") ||
         absl::StrContains(message, "Out of memory");
}

absl::Status StatusFromException(absl::string_view what, std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    // what_without_backtrace() keeps messages short. OOM is a
    // c10::OutOfMemoryError (a c10::Error) on CUDA and CPU alike; the message
    // test also catches allocators that throw a plain c10::Error.
    absl::string_view msg = err.what_without_backtrace();
    if (IsOutOfMemoryMessage(msg)) {
      return Make(absl::StatusCode::kResourceExhausted, what,
                  absl::StrCat("out of memory: ", msg));
    }
    // A full disk under LibTorch (the offloader's spill file read back in
    // backward carries its RESOURCE_EXHAUSTED status as text): out of a
    // resource the caller can free, as the snapshot writer reports it.
    if (absl::StrContains(msg, "RESOURCE_EXHAUSTED: ") ||
        absl::StrContains(msg, "No space left on device")) {
      return Make(absl::StatusCode::kResourceExhausted, what, msg);
    }
    return Make(absl::StatusCode::kInternal, what, msg);
  } catch (const std::bad_alloc& err) {
    return Make(absl::StatusCode::kResourceExhausted, what,
                absl::StrCat("out of memory: ", err.what()));
  } catch (const std::exception& err) {
    return Make(absl::StatusCode::kInternal, what, err.what());
  } catch (...) {
    return Make(absl::StatusCode::kInternal, what, "unknown exception");
  }
}

absl::Status TorchBoundary(absl::string_view what, absl::FunctionRef<void()> fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (...) {
    return StatusFromException(what, std::current_exception());
  }
}

}  // namespace memprofd
