#include "tests/memory/test_util.h"

#include "core/memory/install.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace memory {

void EnsureAccountingInstalled() {
  const absl::Status status = InstallMemoryAccounting();
  ASSERT_TRUE(status.ok()) << status;
}

}  // namespace memory
}  // namespace memprofd
