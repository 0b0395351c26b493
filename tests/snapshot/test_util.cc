#include "tests/snapshot/test_util.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace snapshot {
namespace testing {

TensorList MakeModel(int64_t seed, int layers, int64_t hidden, int64_t vocab,
                     at::ScalarType dtype) {
  at::manual_seed(seed);
  auto opts = at::TensorOptions().dtype(dtype);
  TensorList out;
  out.emplace_back("model.embed_tokens.weight", at::randn({vocab, hidden}, opts));
  for (int i = 0; i < layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    out.emplace_back(p + "self_attn.q_proj.weight", at::randn({hidden, hidden}, opts));
    out.emplace_back(p + "mlp.up_proj.weight", at::randn({2 * hidden, hidden}, opts));
    out.emplace_back(p + "input_layernorm.weight", at::rand({hidden}, opts) + 0.5);
  }
  out.emplace_back("model.norm.weight", at::rand({hidden}, opts) + 0.5);
  out.emplace_back("lm_head.weight", at::randn({vocab, hidden}, opts));
  return out;
}

TensorList MakeAllDtypes(int64_t seed) {
  at::manual_seed(seed);
  TensorList out;
  const at::Tensor base = at::randn({5, 7}, at::kDouble) * 100;
  out.emplace_back("f64", base.clone());
  out.emplace_back("f32", base.to(at::kFloat));
  out.emplace_back("f16", base.to(at::kHalf));
  out.emplace_back("bf16", base.to(at::kBFloat16));
  out.emplace_back("i64", at::randint(-1000000, 1000000, {3, 4}, at::kLong));
  out.emplace_back("i32", at::randint(-100000, 100000, {6}, at::kInt));
  out.emplace_back("i16", at::randint(-30000, 30000, {2, 2, 2}, at::kShort));
  out.emplace_back("i8", at::randint(-128, 127, {9}, at::kChar));
  out.emplace_back("u8", at::randint(0, 255, {4, 1}, at::kByte));
  out.emplace_back("bool", at::randint(0, 2, {11}, at::kLong).to(at::kBool));
  out.emplace_back("scalar", at::scalar_tensor(3.25, at::kFloat));
  out.emplace_back("empty", at::empty({0, 3}, at::kFloat));
  out.emplace_back("transposed", at::randn({4, 6}, at::kFloat).t());
  return out;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

::testing::AssertionResult BitEqual(const at::Tensor& expected,
                                    const at::Tensor& actual) {
  if (expected.scalar_type() != actual.scalar_type()) {
    return ::testing::AssertionFailure()
           << "dtype " << c10::toString(actual.scalar_type()) << " != expected "
           << c10::toString(expected.scalar_type());
  }
  if (expected.sizes() != actual.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " != expected " << expected.sizes();
  }
  const at::Tensor a = expected.contiguous(), b = actual.contiguous();
  if (a.numel() > 0 &&
      std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) != 0) {
    return ::testing::AssertionFailure() << "values differ";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing
}  // namespace snapshot
}  // namespace memprofd
