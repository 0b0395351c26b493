#ifndef MEMPROFD_CORE_MODEL_JSON_H_
#define MEMPROFD_CORE_MODEL_JSON_H_

// Deprecated forwarding header: memprofd's JSON type lives in
// core/common/json.h (memprofd_common). Kept only for the files that still
// include this path (tests/model/config_test.cc, tests/model/llama_test.cc,
// tests/bench/train_bench.cc); new code includes core/common/json.h.

#include "core/common/json.h"  // IWYU pragma: export

#endif  // MEMPROFD_CORE_MODEL_JSON_H_
