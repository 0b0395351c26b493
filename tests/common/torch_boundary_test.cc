#include "core/common/torch_boundary.h"

#include <torch/torch.h>

#include <new>
#include <stdexcept>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;

TEST(TorchBoundaryTest, OkWhenNothingThrows) {
  int ran = 0;
  EXPECT_TRUE(TorchBoundary("work", [&] { ran = 1; }).ok());
  EXPECT_EQ(ran, 1);
}

TEST(TorchBoundaryTest, ShapeErrorIsInternalWithContext) {
  absl::Status s = TorchBoundary("forward pass", [] {
    auto a = torch::ones({2, 3});
    auto b = torch::ones({4, 5});
    (void)torch::matmul(a, b);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("forward pass: "));
  EXPECT_THAT(s.message(), HasSubstr("shapes cannot be multiplied"));
}

TEST(TorchBoundaryTest, CpuAllocatorFailureIsResourceExhausted) {
  // 2^60 bytes: LibTorch's CPU allocator refuses with "can't allocate memory".
  absl::Status s = TorchBoundary(
      "step", [] { (void)torch::empty({int64_t{1} << 58}, torch::kFloat32); });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("out of memory"));
}

TEST(TorchBoundaryTest, BadAllocIsResourceExhausted) {
  absl::Status s = TorchBoundary("x", [] { throw std::bad_alloc(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
}

TEST(TorchBoundaryTest, LongMessagesAreTruncated) {
  absl::Status s =
      TorchBoundary("x", [] { throw std::runtime_error(std::string(5000, 'a')); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_LE(s.message().size(), 1024u);
}

TEST(TorchBoundaryTest, AFullDiskIsResourceExhausted) {
  for (const char* text :
       {"cannot bring back an offloaded activation: RESOURCE_EXHAUSTED: "
        "the spill directory \"/x\" is full",
        "write failed: No space left on device"}) {
    absl::Status s = TorchBoundary("backward", [&] { TORCH_CHECK(false, text); });
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << text;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(text));
  }
}

}  // namespace
}  // namespace memprofd
