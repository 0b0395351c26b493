#include "core/snapshot/safetensors_format.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/json.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"

namespace memprofd {
namespace snapshot {
namespace {

struct DtypeInfo {
  const char* name;
  int64_t size;
  // Position in safetensors' Dtype enum, whose derived order is what the
  // reference writer sorts by (descending): "alignment" order.
  int rank;
};

constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1, 0},  {"U8", 1, 4},   {"I8", 1, 5},   {"I16", 2, 11}, {"F16", 2, 13},
    {"BF16", 2, 14}, {"I32", 4, 15}, {"F32", 4, 17}, {"F64", 8, 19}, {"I64", 8, 20},
};

constexpr const char* kUnsupportedDtypes[] = {
    "F4",          "F6_E2M3",     "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0",
    "F8_E4M3FNUZ", "F8_E5M2FNUZ", "U16",     "U32",     "C64",     "U64"};

const DtypeInfo* FindDtype(absl::string_view dtype) {
  for (const auto& d : kDtypes) {
    if (dtype == d.name) return &d;
  }
  return nullptr;
}

// numel * element size, or false on overflow.
bool ByteSize(const std::vector<int64_t>& shape, int64_t elem_size, uint64_t* out) {
  unsigned __int128 n = static_cast<unsigned __int128>(elem_size);
  for (const int64_t d : shape) {
    if (d < 0) return false;
    n *= static_cast<unsigned __int128>(d);
    if (n > static_cast<unsigned __int128>(INT64_MAX)) return false;
  }
  *out = static_cast<uint64_t>(n);
  return true;
}

std::string EntryJson(const TensorEntry& e) {
  std::string out =
      absl::StrCat(JsonQuote(e.name), ":{\"dtype\":", JsonQuote(e.dtype), ",\"shape\":[");
  for (size_t i = 0; i < e.shape.size(); ++i) {
    absl::StrAppend(&out, i > 0 ? "," : "", e.shape[i]);
  }
  absl::StrAppend(&out, "],\"data_offsets\":[", e.begin, ",", e.end, "]}");
  return out;
}

class Corrupt {
 public:
  explicit Corrupt(absl::string_view path) : path_(path) {}
  absl::Status operator()(absl::string_view problem) const {
    return absl::DataLossError(absl::StrCat(
        "corrupt safetensors file ", path_, ": ", problem,
        "; the file is damaged or incomplete: restore it or write the snapshot again"));
  }

 private:
  std::string path_;
};

absl::StatusOr<TensorEntry> ParseEntry(const std::string& name, const Json& v,
                                       const Corrupt& corrupt, absl::string_view path) {
  const std::string what = absl::StrCat("tensor ", JsonQuote(name));
  if (!v.is_object()) return corrupt(absl::StrCat(what, " is not a JSON object"));
  TensorEntry e;
  e.name = name;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, member] : v.items()) {
    if (key == "dtype") {
      has_dtype = true;
      if (!member.is_string())
        return corrupt(absl::StrCat(what, ": dtype is not a string"));
      e.dtype = member.get<std::string>();
      if (IsUnsupportedSafetensorsDtype(e.dtype)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "safetensors file ", path, ": tensor ", JsonQuote(name), " has dtype ",
            e.dtype,
            ", which memprofd does not read; convert the file to F32, F16 or BF16"));
      }
      if (FindDtype(e.dtype) == nullptr) {
        return corrupt(absl::StrCat(what, ": unknown dtype ", JsonQuote(e.dtype)));
      }
    } else if (key == "shape") {
      has_shape = true;
      if (!member.is_array())
        return corrupt(absl::StrCat(what, ": shape is not an array"));
      for (const Json& d : member) {
        int64_t dim;
        if (!JsonToInt64(d, &dim) || dim < 0) {
          return corrupt(absl::StrCat(what, ": shape holds ", DumpJson(d),
                                      ", not a non-negative integer"));
        }
        e.shape.push_back(dim);
      }
    } else if (key == "data_offsets") {
      has_offsets = true;
      // nlohmann reads every non-negative integer literal as unsigned.
      if (!member.is_array() || member.size() != 2 || !member[0].is_number_unsigned() ||
          !member[1].is_number_unsigned()) {
        return corrupt(
            absl::StrCat(what, ": data_offsets is not two non-negative integers"));
      }
      e.begin = member[0].get<uint64_t>();
      e.end = member[1].get<uint64_t>();
    } else {
      return corrupt(absl::StrCat(what, ": unexpected field ", JsonQuote(key)));
    }
  }
  if (!has_dtype || !has_shape || !has_offsets) {
    return corrupt(absl::StrCat(what, ": needs dtype, shape and data_offsets"));
  }
  return e;
}

}  // namespace

int64_t SafetensorsDtypeSize(absl::string_view dtype) {
  const DtypeInfo* d = FindDtype(dtype);
  return d == nullptr ? 0 : d->size;
}

bool IsUnsupportedSafetensorsDtype(absl::string_view dtype) {
  for (const char* u : kUnsupportedDtypes) {
    if (dtype == u) return true;
  }
  return false;
}

absl::StatusOr<SafetensorsLayout> LayoutSafetensors(
    std::vector<TensorSpec> specs, const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const TensorSpec& s : specs) {
    // The empty name is a valid key, written and read by the reference
    // implementation; only the metadata's key is reserved.
    if (s.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name ", JsonQuote(s.name), " is reserved in safetensors"));
    }
    if (!IsValidUtf8(s.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name ", JsonQuote(s.name),
                       " is not valid UTF-8, which a safetensors header must be"));
    }
    if (!names.insert(s.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name ", JsonQuote(s.name)));
    }
    if (FindDtype(s.dtype) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", JsonQuote(s.name), " has unsupported dtype ", JsonQuote(s.dtype)));
    }
  }
  // The reference writer's order (safetensors `prepare`): dtype descending,
  // then name.
  std::stable_sort(
      specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) {
        const int ra = FindDtype(a.dtype)->rank, rb = FindDtype(b.dtype)->rank;
        if (ra != rb) return ra > rb;
        return a.name < b.name;
      });
  SafetensorsLayout layout;
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors metadata ", JsonQuote(k),
                         " is not valid UTF-8, which a safetensors header must be"));
      }
      absl::StrAppend(&json, first ? "" : ",", JsonQuote(k), ":", JsonQuote(v));
      first = false;
    }
    json += "}";
  }
  uint64_t offset = 0;
  for (TensorSpec& s : specs) {
    uint64_t bytes;
    if (!ByteSize(s.shape, FindDtype(s.dtype)->size, &bytes) || offset + bytes < offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", JsonQuote(s.name), " has an invalid or too large shape"));
    }
    TensorEntry e{std::move(s.name), std::move(s.dtype), std::move(s.shape), offset,
                  offset + bytes};
    offset += bytes;
    absl::StrAppend(&json, json.size() > 1 ? "," : "", EntryJson(e));
    layout.entries.push_back(std::move(e));
  }
  json += "}";
  // Pad with spaces so that the data starts 8-byte aligned (safetensors#235).
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header of ", json.size(), " bytes exceeds the limit of ",
        kMaxSafetensorsHeaderBytes, "; split the tensors over more shards"));
  }
  uint64_t n = json.size();
  layout.header_bytes.resize(8);
  for (int i = 0; i < 8; ++i)
    layout.header_bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  layout.header_bytes += json;
  layout.data_bytes = offset;
  return layout;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file,
                                                   absl::string_view path) {
  const Corrupt corrupt(path);
  if (file.size() < 8) {
    return corrupt(absl::StrCat("header too small: the file has ", file.size(),
                                " bytes, fewer than the 8-byte length prefix"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  if (n > kMaxSafetensorsHeaderBytes) {
    return corrupt(absl::StrCat("header too large: length prefix says ", n,
                                " bytes, over the limit of ",
                                kMaxSafetensorsHeaderBytes));
  }
  if (n + 8 > file.size()) {
    return corrupt(absl::StrCat("invalid header length ", n, ": the file has only ",
                                file.size(), " bytes"));
  }
  const absl::string_view text = file.substr(8, n);
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) {
    return corrupt(absl::StrCat("header is not valid UTF-8 (byte ", 8 + bad, ")"));
  }
  if (text.empty() || text[0] != '{') return corrupt("header does not start with '{'");
  absl::StatusOr<Json> json = ParseJson(text);
  if (!json.ok()) return corrupt(absl::StrCat("header: ", json.status().message()));
  if (!json->is_object()) return corrupt("header is not a JSON object");

  SafetensorsHeader header;
  header.header_size = n;
  for (const auto& [name, value] : json->items()) {
    if (name == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object()) return corrupt("__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) {
          return corrupt(
              absl::StrCat("__metadata__ value of ", JsonQuote(k), " is not a string"));
        }
        header.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(TensorEntry e, ParseEntry(name, value, corrupt, path));
    header.tensors.push_back(std::move(e));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
            });
  uint64_t expected = 0;
  for (const TensorEntry& e : header.tensors) {
    if (e.begin != expected || e.end < e.begin) {
      return corrupt(absl::StrCat("invalid offset for tensor ", JsonQuote(e.name),
                                  ": data_offsets [", e.begin, ", ", e.end,
                                  "] but the previous tensor ends at ", expected,
                                  e.begin > expected ? " (a gap)" : " (an overlap)"));
    }
    uint64_t bytes = 0;
    if (!ByteSize(e.shape, SafetensorsDtypeSize(e.dtype), &bytes)) {
      return corrupt(absl::StrCat("tensor ", JsonQuote(e.name), "'s dtype ", e.dtype,
                                  " and shape [", absl::StrJoin(e.shape, ", "),
                                  "] need more bytes than a file can hold (over 2^63)"));
    }
    if (bytes != e.bytes()) {
      return corrupt(absl::StrCat("tensor ", JsonQuote(e.name), " spans ", e.bytes(),
                                  " bytes but its dtype ", e.dtype, " and shape need ",
                                  bytes));
    }
    expected = e.end;
  }
  header.data_bytes = expected;
  if (8 + n + expected != file.size()) {
    return corrupt(absl::StrCat(
        "the file has ", file.size(), " bytes but its header describes ",
        8 + n + expected,
        file.size() < 8 + n + expected ? " (truncated)" : " (trailing bytes)"));
  }
  return header;
}

}  // namespace snapshot
}  // namespace memprofd
