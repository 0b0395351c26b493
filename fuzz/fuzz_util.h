#ifndef MEMPROFD_FUZZ_FUZZ_UTIL_H_
#define MEMPROFD_FUZZ_FUZZ_UTIL_H_

// Helpers the libFuzzer targets share. Each target is one process running
// one input at a time, so none of this is thread-safe or needs to be.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace memprofd {
namespace fuzz {

// Aborts (a crash libFuzzer records, with the input) when `cond` is false:
// the targets' oracles, kept in release builds unlike assert().
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

// A parser's error must be one of `allowed` and carry a message; anything
// else (UNKNOWN from an escaped exception, INTERNAL, an empty message) is a
// bug in how the parser reports bad input.
void CheckBadInputStatus(const absl::Status& status,
                         std::initializer_list<absl::StatusCode> allowed);

// A directory of this process under $TMPDIR (or /tmp), made at the first
// call, removed at exit.
const std::string& ScratchDir();

// Writes `bytes` to `path`, replacing it; aborts on failure (the scratch
// directory is the fuzzer's own).
void WriteFileOrDie(const std::string& path, absl::string_view bytes);

// Removes everything inside `dir` (not `dir` itself).
void ClearDir(const std::string& dir);

// Splits `data` at each occurrence of `separator` (at most `max_parts`
// parts; the last keeps the rest).
std::vector<absl::string_view> SplitInput(absl::string_view data,
                                          absl::string_view separator, size_t max_parts);

}  // namespace fuzz
}  // namespace memprofd

#endif  // MEMPROFD_FUZZ_FUZZ_UTIL_H_
