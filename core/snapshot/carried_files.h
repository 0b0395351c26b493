#ifndef MEMPROFD_CORE_SNAPSHOT_CARRIED_FILES_H_
#define MEMPROFD_CORE_SNAPSHOT_CARRIED_FILES_H_

// The files of a Hugging Face model directory that are neither weights nor
// config.json but that a drop-in copy of the model needs: its generation
// settings and its tokenizer. A model loaded from a directory keeps them,
// read whole at load, and every snapshot of it carries them unchanged, so
// that AutoTokenizer and generate() work on the snapshot alone. Plain data,
// no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {
class PathRoots;  // core/common/files.h
}  // namespace memprofd

namespace memprofd {
namespace snapshot {

struct CarriedFile {
  std::string name;   // one of CarriedFileNames()
  std::string bytes;  // the file's contents
};

struct CarriedFiles {
  // In CarriedFileNames() order.
  std::vector<CarriedFile> files;
  // Files the directory has but that were not kept, each "name: why" (a
  // symbolic link, not a regular file, over the size limits, unreadable).
  std::vector<std::string> skipped;
};

// generation_config.json and the tokenizer files transformers and
// tokenizers write (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, added_tokens.json, chat templates, and the slow
// tokenizers' vocabularies: tokenizer.model, vocab.json, merges.txt,
// vocab.txt). Nothing else of a directory is carried.
const std::vector<std::string>& CarriedFileNames();
bool IsCarriedFileName(absl::string_view name);

// The largest file kept, and the most bytes kept in all: a tokenizer.json is
// a few MB to a few tens of MB (Gemma's, the largest common one, 33 MB).
inline constexpr int64_t kMaxCarriedFileBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxCarriedBytes = int64_t{128} << 20;

// Reads the carried files model directory `dir` holds (`dir` confined by the
// caller). A missing file is not carried, and one that cannot be read
// safely (ReadSmallRegularFile's refusals: a FIFO, a file over
// kMaxCarriedFileBytes, a symbolic link when there are no `roots`; or past
// kMaxCarriedBytes in all) is listed in `skipped`. With `roots`, a link
// inside them is followed and one leading outside is PERMISSION_DENIED,
// the load's error as for every other file of the directory. Blocks on file
// reads: never on gRPC's threads.
absl::StatusOr<CarriedFiles> ReadCarriedFiles(const std::string& dir,
                                              const PathRoots* roots = nullptr);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_CARRIED_FILES_H_
