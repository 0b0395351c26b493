#include "core/snapshot/manifest.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/common/json.h"

namespace memprofd {
namespace snapshot {
namespace {

constexpr int kManifestVersion = 1;

}  // namespace

std::string ManifestToJson(const SnapshotManifest& m) {
  JsonValue v = JsonValue::MakeObject();
  v.Set("memprofd_manifest_version", JsonValue(kManifestVersion));
  v.Set("name", JsonValue(m.name));
  v.Set("directory", JsonValue(m.directory));
  JsonValue files = JsonValue::MakeArray();
  for (const SnapshotFile& f : m.files) {
    JsonValue file = JsonValue::MakeObject();
    file.Set("name", JsonValue(f.name));
    file.Set("bytes", JsonValue(f.bytes));
    files.Append(std::move(file));
  }
  v.Set("files", std::move(files));
  v.Set("total_size", JsonValue(m.total_size));
  v.Set("bytes_written", JsonValue(m.bytes_written));
  v.Set("num_tensors", JsonValue(m.num_tensors));
  v.Set("num_shards", JsonValue(m.num_shards));
  v.Set("dtype", JsonValue(m.dtype));
  v.Set("max_shard_size", JsonValue(m.max_shard_size));
  v.Set("dropped_tied_lm_head", JsonValue(m.dropped_tied_lm_head));
  v.Set("duration_seconds", JsonValue(m.duration_seconds));
  v.Set("throughput_bytes_per_second", JsonValue(m.throughput_bytes_per_second));
  v.Set("peak_extra_host_bytes", JsonValue(m.peak_extra_host_bytes));
  v.Set("peak_extra_device_bytes", JsonValue(m.peak_extra_device_bytes));
  v.Set("staging_bytes", JsonValue(m.staging_bytes));
  v.Set("global_step", JsonValue(m.global_step));
  v.Set("create_time", JsonValue(absl::FormatTime(absl::RFC3339_full, m.create_time,
                                                  absl::UTCTimeZone())));
  return v.Serialize(2) + "\n";
}

absl::StatusOr<SnapshotManifest> ManifestFromJson(absl::string_view text,
                                                  absl::string_view path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("snapshot manifest ", path,
                                            " is damaged: ", why,
                                            "; delete the snapshot or restore the file"));
  };
  absl::StatusOr<JsonValue> parsed = JsonValue::Parse(text);
  if (!parsed.ok()) return bad(parsed.status().message());
  const JsonValue& v = *parsed;
  if (!v.is_object()) return bad("not a JSON object");
  SnapshotManifest m;
  auto get_int = [&](const char* key, int64_t* out) {
    const JsonValue* f = v.Find(key);
    return f != nullptr && f->AsInt64(out);
  };
  auto get_double = [&](const char* key, double* out) {
    const JsonValue* f = v.Find(key);
    if (f != nullptr && f->is_null()) {
      *out = 0;
      return true;
    }
    return f != nullptr && f->AsDouble(out);
  };
  auto get_string = [&](const char* key, std::string* out) {
    const JsonValue* f = v.Find(key);
    if (f == nullptr || !f->is_string()) return false;
    *out = f->string_value();
    return true;
  };
  int64_t version = 0;
  if (!get_int("memprofd_manifest_version", &version) || version != kManifestVersion) {
    return bad("unknown memprofd_manifest_version");
  }
  std::string create_time;
  if (!get_string("name", &m.name) || !get_string("directory", &m.directory) ||
      !get_int("total_size", &m.total_size) ||
      !get_int("bytes_written", &m.bytes_written) ||
      !get_int("num_tensors", &m.num_tensors) || !get_int("num_shards", &m.num_shards) ||
      !get_string("dtype", &m.dtype) || !get_int("max_shard_size", &m.max_shard_size) ||
      !get_double("duration_seconds", &m.duration_seconds) ||
      !get_double("throughput_bytes_per_second", &m.throughput_bytes_per_second) ||
      !get_int("peak_extra_host_bytes", &m.peak_extra_host_bytes) ||
      !get_int("peak_extra_device_bytes", &m.peak_extra_device_bytes) ||
      !get_int("staging_bytes", &m.staging_bytes) ||
      !get_int("global_step", &m.global_step) ||
      !get_string("create_time", &create_time)) {
    return bad("a field is missing or has the wrong type");
  }
  const JsonValue* tied = v.Find("dropped_tied_lm_head");
  if (tied == nullptr || !tied->is_bool()) return bad("dropped_tied_lm_head is missing");
  m.dropped_tied_lm_head = tied->bool_value();
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, create_time, &m.create_time, &err)) {
    return bad(absl::StrCat("create_time: ", err));
  }
  const JsonValue* files = v.Find("files");
  if (files == nullptr || !files->is_array()) return bad("files is missing");
  for (const JsonValue& f : files->array_items()) {
    SnapshotFile file;
    const JsonValue* name = f.Find("name");
    const JsonValue* bytes = f.Find("bytes");
    if (name == nullptr || !name->is_string() || bytes == nullptr ||
        !bytes->AsInt64(&file.bytes)) {
      return bad("a files entry needs name and bytes");
    }
    file.name = name->string_value();
    m.files.push_back(std::move(file));
  }
  return m;
}

}  // namespace snapshot
}  // namespace memprofd
