// memprofctl status, health, operations, load, model.

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "client/flags.h"

namespace memprofd::cli {

int StatusCommand(const Context& c, const Args&) {
  v1::ServerStatus status;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().GetStatus(ctx.get(), v1::GetStatusRequest(), &status);
  if (!s.ok()) return ReportRpcError("status", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(status).c_str());
    return kExitOk;
  }
  const auto& b = status.build();
  std::printf("memprofd %s (LibTorch %s, gRPC %s, %s%s)\n", b.version().c_str(),
              b.torch_version().c_str(), b.grpc_version().c_str(), b.build_type().c_str(),
              b.cuda_compiled() ? ", CUDA" : "");
  std::printf("state:      %s, up %.0f s\n", status.serving_state().c_str(),
              status.uptime_seconds());
  std::printf("device:     %s\n", status.device().c_str());
  if (const auto& dp = status.data_parallel(); dp.world_size() > 1) {
    std::printf("ranks:      rank %d of %d (%s, %s, node %d), store %s, sharding %s",
                dp.rank(), dp.world_size(), dp.role().c_str(), dp.launcher().c_str(),
                dp.node_rank(), dp.store().c_str(), dp.sharding().c_str());
    if (dp.has_parameter_drift()) std::printf(", drift %g", dp.parameter_drift());
    if (dp.model_sharded()) std::printf(", model kept sharded");
    std::printf("\n");
  }
  if (status.has_model()) {
    const auto& m = status.model();
    std::printf("model:      %s, %lld parameters (%s), %lld steps trained\n",
                m.source().c_str(), static_cast<long long>(m.num_parameters()),
                HumanBytes(static_cast<double>(m.parameter_bytes())).c_str(),
                static_cast<long long>(m.steps_trained()));
  } else {
    std::printf("model:      none loaded\n");
  }
  if (status.has_last_step()) {
    const auto& r = status.last_step();
    std::printf("last step:  %lld, loss %.4f, %.0f tokens/s\n",
                static_cast<long long>(r.global_step()), r.loss(), r.tokens_per_second());
  }
  const auto& o = status.offload_totals();
  if (o.tensors_seen() > 0) {
    std::printf(
        "offload:    %lld of %lld saved tensors offloaded, %s out, %s saved by dedup, "
        "%s back (%s read ahead)\n",
        static_cast<long long>(o.tensors_offloaded()),
        static_cast<long long>(o.tensors_seen()),
        HumanBytes(static_cast<double>(o.bytes_out())).c_str(),
        HumanBytes(static_cast<double>(o.dedup_bytes_saved())).c_str(),
        HumanBytes(static_cast<double>(o.bytes_in())).c_str(),
        HumanBytes(static_cast<double>(o.bytes_prefetched())).c_str());
    if (o.bytes_out() > 0) {
      std::printf(
          "            %s of it freed on the device, %s moved but kept alive by "
          "another reference\n",
          HumanBytes(static_cast<double>(o.effective_bytes())).c_str(),
          HumanBytes(static_cast<double>(o.ineffective_bytes())).c_str());
    }
  }
  std::printf("operations: %lld active\n",
              static_cast<long long>(status.active_operations()));
  std::string features;
  for (const auto& f : b.features())
    absl::StrAppend(&features, features.empty() ? "" : ", ", f);
  std::printf("features:   %s\n", features.c_str());
  return kExitOk;
}

int HealthCommand(const Context& c, const Args&) {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->health().Check(ctx.get(), req, &resp);
  if (!s.ok()) return ReportRpcError("health", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(resp).c_str());
  } else {
    std::printf(
        "%s\n",
        grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()).c_str());
  }
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk
                                                                         : kExitRpcError;
}

int OperationsCommand(const Context& c, const Args& args) {
  const std::string verb = args.empty() ? "list" : args[0];
  if (verb == "list") {
    v1::ListOperationsResponse resp;
    auto ctx = c.client->NewContext(c.timeout);
    grpc::Status s =
        c.client->stub().ListOperations(ctx.get(), v1::ListOperationsRequest(), &resp);
    if (!s.ok()) return ReportRpcError("operations list", s);
    for (const auto& op : resp.operations()) PrintOperation(c, op);
    return kExitOk;
  }
  if (args.size() != 2) return Usage(absl::StrCat("operations ", verb, " needs an ID"));
  const std::string& id = args[1];
  v1::Operation op;
  grpc::Status s;
  if (verb == "get") {
    v1::GetOperationRequest req;
    req.set_id(id);
    auto ctx = c.client->NewContext(c.timeout);
    s = c.client->stub().GetOperation(ctx.get(), req, &op);
  } else if (verb == "cancel") {
    v1::CancelOperationRequest req;
    req.set_id(id);
    auto ctx = c.client->NewContext(c.timeout);
    s = c.client->stub().CancelOperation(ctx.get(), req, &op);
  } else if (verb == "wait") {
    s = WaitForOperation(c, id, &op);
  } else if (verb == "watch") {
    v1::WatchOperationRequest req;
    req.set_id(id);
    auto ctx = c.client->NewContext();
    auto reader = c.client->stub().WatchOperation(ctx.get(), req);
    while (reader->Read(&op)) PrintOperation(c, op);
    s = reader->Finish();
    if (!s.ok()) return ReportRpcError("operations watch", s);
    return ExitForOperation(op);
  } else {
    return Usage(absl::StrCat("unknown operations verb '", verb, "'"));
  }
  if (!s.ok()) return ReportRpcError(absl::StrCat("operations ", verb), s);
  PrintOperation(c, op);
  return verb == "wait" ? ExitForOperation(op) : kExitOk;
}

int LoadCommand(const Context& c, const Args& args) {
  if (!args.empty()) return Usage("load takes flags only: --preset=NAME or --hf_dir=DIR");
  v1::LoadModelRequest req;
  const std::string preset = absl::GetFlag(FLAGS_preset);
  const std::string dir = absl::GetFlag(FLAGS_hf_dir);
  if (preset.empty() == dir.empty())
    return Usage("load needs one of --preset or --hf_dir");
  if (!preset.empty()) req.set_preset(preset);
  if (!dir.empty()) req.set_hf_directory(dir);
  req.set_seed(absl::GetFlag(FLAGS_seed));
  req.set_resume(absl::GetFlag(FLAGS_resume));
  req.set_init_weights(absl::GetFlag(FLAGS_init_weights));
  req.set_lora_adapter(absl::GetFlag(FLAGS_lora_adapter));
  if (auto dtype = GivenFlag(FLAGS_base_dtype)) req.set_base_dtype(*dtype);
  const std::string placement = absl::GetFlag(FLAGS_placement);
  if (!placement.empty()) {
    for (absl::string_view item : absl::StrSplit(placement, ',')) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, '=');
      v1::ModulePlacement* p = req.add_placement();
      p->set_module(kv.first);
      if (kv.second == "device") {
        p->set_placement(v1::PLACEMENT_DEVICE);
      } else if (kv.second == "cpu") {
        p->set_placement(v1::PLACEMENT_CPU);
      } else if (kv.second == "disk") {
        p->set_placement(v1::PLACEMENT_DISK);
      } else {
        return Usage(
            absl::StrCat("--placement: '", item, "' is not module=device|cpu|disk"));
      }
    }
  }
  v1::Operation op;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().LoadModel(ctx.get(), req, &op);
  if (!s.ok()) return ReportRpcError("load", s);
  s = WaitForOperation(c, op.id(), &op);
  if (!s.ok()) return ReportRpcError("load", s);
  PrintOperation(c, op);
  return ExitForOperation(op);
}

namespace {

// "qwen2, head_dim 64, rope default (theta 1e+06), q/k/v biases, sliding
// window 64 in 4 of 24 layers": what sets this model apart in its family.
std::string ArchitectureLine(const v1::ModelConfig& cfg) {
  const v1::RopeParameters& rope = cfg.rope();
  std::string line =
      absl::StrCat(cfg.model_type(), ", head_dim ", cfg.head_dim(), ", rope ",
                   rope.rope_type(), " (theta ", cfg.rope_theta());
  if (rope.rope_type() != "default") absl::StrAppend(&line, ", factor ", rope.factor());
  if (rope.original_max_position_embeddings() > 0) {
    absl::StrAppend(&line, ", original context ",
                    rope.original_max_position_embeddings());
  }
  if (rope.rope_type() == "llama3") {
    absl::StrAppend(&line, ", low/high freq factor ", rope.low_freq_factor(), "/",
                    rope.high_freq_factor());
  }
  absl::StrAppend(&line, ")");
  if (cfg.qkv_bias()) absl::StrAppend(&line, ", q/k/v biases");
  if (cfg.o_proj_bias()) absl::StrAppend(&line, ", o_proj bias");
  if (cfg.mlp_bias()) absl::StrAppend(&line, ", MLP biases");
  if (cfg.qk_norm()) absl::StrAppend(&line, ", q/k norms");
  if (cfg.sliding_window() > 0) {
    absl::StrAppend(&line, ", sliding window ", cfg.sliding_window(), " in ",
                    cfg.sliding_window_layers_size(), " of ", cfg.num_hidden_layers(),
                    " layers");
  }
  return line;
}

}  // namespace

int ModelCommand(const Context& c, const Args&) {
  v1::ModelInfo info;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s =
      c.client->stub().DescribeModel(ctx.get(), v1::DescribeModelRequest(), &info);
  if (!s.ok()) return ReportRpcError("model", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(info).c_str());
    return kExitOk;
  }
  const auto& cfg = info.config();
  std::printf("%s on %s: %s, %lld layers, hidden %lld, heads %lld/%lld kv, vocab %lld\n",
              info.source().c_str(), info.device().c_str(), cfg.architecture().c_str(),
              static_cast<long long>(cfg.num_hidden_layers()),
              static_cast<long long>(cfg.hidden_size()),
              static_cast<long long>(cfg.num_attention_heads()),
              static_cast<long long>(cfg.num_key_value_heads()),
              static_cast<long long>(cfg.vocab_size()));
  std::printf("%s\n", ArchitectureLine(cfg).c_str());
  std::printf("%lld parameters (%s), %lld steps trained\n",
              static_cast<long long>(info.num_parameters()),
              HumanBytes(static_cast<double>(info.parameter_bytes())).c_str(),
              static_cast<long long>(info.steps_trained()));
  for (const auto& p : info.parameters()) {
    std::string shape;
    for (int64_t d : p.shape()) absl::StrAppend(&shape, shape.empty() ? "" : "x", d);
    std::string tied;
    for (const std::string& t : p.tied()) absl::StrAppend(&tied, " (tied: ", t, ")");
    std::printf("  %-48s %-14s %-8s %s%s\n", p.name().c_str(), shape.c_str(),
                p.dtype().c_str(), HumanBytes(static_cast<double>(p.bytes())).c_str(),
                tied.c_str());
  }
  for (const std::string& note : info.load_notes())
    std::printf("note: %s\n", note.c_str());
  return kExitOk;
}

}  // namespace memprofd::cli
