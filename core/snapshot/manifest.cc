#include "core/snapshot/manifest.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/snapshot/snapshot_options.h"

namespace memprofd {
namespace snapshot {
namespace {

constexpr int kManifestVersion = 1;

}  // namespace

std::string ManifestToJson(const SnapshotManifest& m) {
  Json files = Json::array();
  for (const SnapshotFile& f : m.files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  Json v = {
      {"memprofd_manifest_version", kManifestVersion},
      {"name", m.name},
      {"directory", m.directory},
      {"files", std::move(files)},
      {"total_size", m.total_size},
      {"bytes_written", m.bytes_written},
      {"num_tensors", m.num_tensors},
      {"num_shards", m.num_shards},
      {"dtype", m.dtype},
      {"max_shard_size", m.max_shard_size},
      {"dropped_tied_lm_head", m.dropped_tied_lm_head},
      {"duration_seconds", m.duration_seconds},
      {"throughput_bytes_per_second", m.throughput_bytes_per_second},
      {"peak_extra_host_bytes", m.peak_extra_host_bytes},
      {"peak_extra_device_bytes", m.peak_extra_device_bytes},
      {"peak_gathered_bytes", m.peak_gathered_bytes},
      {"staging_bytes", m.staging_bytes},
      {"global_step", m.global_step},
      {"kind", m.kind},
      {"optimizer_bytes", m.optimizer_bytes},
      {"model_source", m.model_source},
      {"carried_files", m.carried_files},
      {"carried_note", m.carried_note},
      {"create_time",
       absl::FormatTime(absl::RFC3339_full, m.create_time, absl::UTCTimeZone())},
  };
  if (!m.lora_base_fingerprint.empty())
    v["lora_base_fingerprint"] = m.lora_base_fingerprint;
  return DumpJson(v, 2) + "\n";
}

absl::StatusOr<SnapshotManifest> ManifestFromJson(absl::string_view text,
                                                  absl::string_view path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("snapshot manifest ", path,
                                            " is damaged: ", why,
                                            "; delete the snapshot or restore the file"));
  };
  absl::StatusOr<Json> parsed = ParseJson(text);
  if (!parsed.ok()) return bad(parsed.status().message());
  const Json& v = *parsed;
  if (!v.is_object()) return bad("not a JSON object");
  SnapshotManifest m;
  auto get_int = [&](const char* key, int64_t* out) {
    const Json* f = JsonFind(v, key);
    return f != nullptr && JsonToInt64(*f, out);
  };
  auto get_double = [&](const char* key, double* out) {
    const Json* f = JsonFind(v, key);
    if (f == nullptr || !(f->is_null() || f->is_number())) return false;
    *out = f->is_null() ? 0 : f->get<double>();
    return true;
  };
  auto get_string = [&](const char* key, std::string* out) {
    const Json* f = JsonFind(v, key);
    if (f == nullptr || !f->is_string()) return false;
    *out = f->get<std::string>();
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
  // Optional: manifests from before checkpoints have neither.
  if (const Json* kind = JsonFind(v, "kind"); kind != nullptr) {
    if (!kind->is_string() || !ParseSnapshotKind(kind->get<std::string>()).ok()) {
      return bad("kind is not \"weights\", \"checkpoint\", \"adapter\" or \"merged\"");
    }
    m.kind = kind->get<std::string>();
  }
  if (JsonFind(v, "optimizer_bytes") != nullptr &&
      !get_int("optimizer_bytes", &m.optimizer_bytes)) {
    return bad("optimizer_bytes is not an integer");
  }
  // Optional: manifests from before fully sharded runs do not have it.
  if (JsonFind(v, "peak_gathered_bytes") != nullptr &&
      !get_int("peak_gathered_bytes", &m.peak_gathered_bytes)) {
    return bad("peak_gathered_bytes is not an integer");
  }
  // Optional: manifests from before carried files do not have them.
  if (JsonFind(v, "model_source") != nullptr &&
      !get_string("model_source", &m.model_source)) {
    return bad("model_source is not a string");
  }
  if (JsonFind(v, "carried_note") != nullptr &&
      !get_string("carried_note", &m.carried_note)) {
    return bad("carried_note is not a string");
  }
  // Optional: a LoRA model's snapshots alone have it.
  if (JsonFind(v, "lora_base_fingerprint") != nullptr &&
      !get_string("lora_base_fingerprint", &m.lora_base_fingerprint)) {
    return bad("lora_base_fingerprint is not a string");
  }
  if (const Json* carried = JsonFind(v, "carried_files"); carried != nullptr) {
    if (!carried->is_array()) return bad("carried_files is not a list");
    for (const Json& name : *carried) {
      if (!name.is_string()) return bad("carried_files holds a non-string");
      m.carried_files.push_back(name.get<std::string>());
    }
  }
  const Json* tied = JsonFind(v, "dropped_tied_lm_head");
  if (tied == nullptr || !tied->is_boolean())
    return bad("dropped_tied_lm_head is missing");
  m.dropped_tied_lm_head = tied->get<bool>();
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, create_time, &m.create_time, &err)) {
    return bad(absl::StrCat("create_time: ", err));
  }
  const Json* files = JsonFind(v, "files");
  if (files == nullptr || !files->is_array()) return bad("files is missing");
  for (const Json& f : *files) {
    SnapshotFile file;
    const Json* name = JsonFind(f, "name");
    const Json* bytes = JsonFind(f, "bytes");
    if (name == nullptr || !name->is_string() || bytes == nullptr ||
        !JsonToInt64(*bytes, &file.bytes)) {
      return bad("a files entry needs name and bytes");
    }
    file.name = name->get<std::string>();
    m.files.push_back(std::move(file));
  }
  return m;
}

}  // namespace snapshot
}  // namespace memprofd
