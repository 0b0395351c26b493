// ParseSafetensors on arbitrary bytes (a whole file held in memory). Oracle:
// only DATA_LOSS / INVALID_ARGUMENT for bad input; an accepted header obeys
// its documented invariants, and laying its tensors out again with
// LayoutSafetensors gives a header ParseSafetensors accepts with the same
// tensors and metadata.

#include <cstddef>
#include <cstdint>

#include "core/snapshot/safetensors_format.h"
#include "fuzz/fuzz_util.h"

using memprofd::fuzz::CheckBadInputStatus;
using memprofd::snapshot::LayoutSafetensors;
using memprofd::snapshot::ParseSafetensors;
using memprofd::snapshot::SafetensorsHeader;
using memprofd::snapshot::SafetensorsLayout;
using memprofd::snapshot::TensorSpec;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensors(file, "fuzz.safetensors");
  if (!header.ok()) {
    CheckBadInputStatus(header.status(), {absl::StatusCode::kDataLoss,
                                          absl::StatusCode::kInvalidArgument});
    return 0;
  }
  FUZZ_CHECK(header->data_start() + header->data_bytes == size);
  uint64_t expected_begin = 0;
  std::vector<TensorSpec> specs;
  for (const auto& t : header->tensors) {
    FUZZ_CHECK(t.begin == expected_begin);
    FUZZ_CHECK(t.end >= t.begin);
    expected_begin = t.end;
    specs.push_back({t.name, t.dtype, t.shape});
  }
  FUZZ_CHECK(expected_begin == header->data_bytes);

  absl::StatusOr<SafetensorsLayout> layout = LayoutSafetensors(specs, header->metadata);
  FUZZ_CHECK(layout.ok());
  FUZZ_CHECK(layout->data_bytes == header->data_bytes);
  std::string again = layout->header_bytes;
  again.resize(layout->file_size(), '\0');
  absl::StatusOr<SafetensorsHeader> reparsed =
      ParseSafetensors(again, "relaid.safetensors");
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(reparsed->metadata == header->metadata);
  FUZZ_CHECK(reparsed->tensors.size() == header->tensors.size());
  for (size_t i = 0; i < layout->entries.size(); ++i) {
    FUZZ_CHECK(reparsed->tensors[i].name == layout->entries[i].name);
    FUZZ_CHECK(reparsed->tensors[i].begin == layout->entries[i].begin);
    FUZZ_CHECK(reparsed->tensors[i].end == layout->entries[i].end);
  }
  return 0;
}
