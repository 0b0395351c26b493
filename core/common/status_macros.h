#ifndef MEMPROFD_CORE_COMMON_STATUS_MACROS_H_
#define MEMPROFD_CORE_COMMON_STATUS_MACROS_H_

// RETURN_IF_ERROR(expr): returns the absl::Status `expr` from the enclosing
// function unless it is OK.
// ASSIGN_OR_RETURN(lhs, expr): evaluates the absl::StatusOr `expr`; returns its
// status unless OK, else moves its value into `lhs` (which may be a
// declaration: `ASSIGN_OR_RETURN(auto x, F())`).

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MEMPROFD_CONCAT_INNER_(a, b) a##b
#define MEMPROFD_CONCAT_(a, b) MEMPROFD_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::absl::Status memprofd_status_ = (expr); \
    if (!memprofd_status_.ok()) {             \
      return memprofd_status_;                \
    }                                         \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, expr) \
  MEMPROFD_ASSIGN_OR_RETURN_IMPL_(MEMPROFD_CONCAT_(memprofd_or_, __LINE__), lhs, expr)

#define MEMPROFD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) {                                      \
    return std::move(tmp).status();                     \
  }                                                     \
  lhs = std::move(tmp).value()

#endif  // MEMPROFD_CORE_COMMON_STATUS_MACROS_H_
