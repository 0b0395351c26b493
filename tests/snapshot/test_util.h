#ifndef MEMPROFD_TESTS_SNAPSHOT_TEST_UTIL_H_
#define MEMPROFD_TESTS_SNAPSHOT_TEST_UTIL_H_

// Helpers shared by the snapshot tests: small synthetic state dicts with
// Hugging Face Llama names, directory listings and bitwise tensor equality.
// Temporary directories and the venv's Python are in tests/testing/.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/snapshot/safetensors.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace snapshot {
namespace testing {

// A Llama-like state dict: embed_tokens [vocab, hidden], per layer q_proj,
// up_proj, input_layernorm, then model.norm and lm_head (its own values).
TensorList MakeModel(int64_t seed, int layers, int64_t hidden, int64_t vocab,
                     at::ScalarType dtype = at::kFloat);

// One tensor of every dtype LibTorch and safetensors share, plus a scalar,
// an empty tensor and a non-contiguous view.
TensorList MakeAllDtypes(int64_t seed);

// Entries of a directory (file names), sorted.
std::vector<std::string> ListDir(const std::string& dir);

// Expected (a.to(b.dtype)) and b equal in dtype, shape and every bit (NaNs
// included).
::testing::AssertionResult BitEqual(const at::Tensor& expected, const at::Tensor& actual);

}  // namespace testing
}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_SNAPSHOT_TEST_UTIL_H_
