#ifndef MEMPROFD_CORE_MODEL_INTERNAL_TENSOR_TEXT_H_
#define MEMPROFD_CORE_MODEL_INTERNAL_TENSOR_TEXT_H_

// How the model's messages write a tensor. Private to core/model.

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace memprofd::model_internal {

// "[4096, 11008]".
inline std::string ShapeString(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

}  // namespace memprofd::model_internal

#endif  // MEMPROFD_CORE_MODEL_INTERNAL_TENSOR_TEXT_H_
