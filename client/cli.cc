#include "client/cli.h"

#include <google/protobuf/util/json_util.h>

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memprofd::cli {

int ReportRpcError(absl::string_view what, const grpc::Status& status) {
  std::fprintf(
      stderr, "memprofctl: %.*s: %s: %s\n", static_cast<int>(what.size()), what.data(),
      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
          .c_str(),
      status.error_message().c_str());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return kExitUnreachable;
  }
  return kExitRpcError;
}

std::string ToJsonLine(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.add_whitespace = false;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string HumanBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double v = bytes;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", v)
                   : absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

int Usage(const std::string& message) {
  std::fprintf(
      stderr, "memprofctl: %s\n%s", message.c_str(),
      "usage: memprofctl [--addr=HOST:PORT] [--token_file=F] [--json] COMMAND [flags]\n"
      "commands:\n"
      "  status                        build, device, model, uptime\n"
      "  health [--service=NAME]       SERVING (exit 0) or not (exit 1)\n"
      "  operations [list]             known operations, newest first\n"
      "  operations get|wait|watch|cancel ID\n"
      "  load --preset=NAME | --hf_dir=DIR [--resume | --init_weights] [--seed=S] "
      "[--lora_adapter=DIR] "
      "[--base_dtype=bf16] [--placement=m=device,...]\n"
      "  model                         the loaded model and its parameters\n"
      "  train [--steps N] [--batch_size B] [--seq_len T] [--learning_rate X] [--seed "
      "S]\n"
      "        [--data PATH | --token_data PATH | --indexed_data PREFIX\n"
      "         [--indexed_windows packed|within_documents]]\n"
      "        [--gradient_checkpointing [--checkpoint_layers N]]\n"
      "        [--attn_implementation sdpa|eager]\n"
      "        [--weight_decay W] [--beta1 B] [--beta2 B] [--adam_eps E]\n"
      "        [--max_grad_norm N] [--grad_accumulation_steps K]\n"
      "        [--[no]offload [--offload_target disk|host] [--prefetch_depth auto|N]\n"
      "         [--min_offload_bytes N] [--max_copies_in_flight N] "
      "[--[no]offload_head]]\n"
      "        [--lr_scheduler_type constant|constant_with_warmup|linear|cosine|\n"
      "         cosine_with_min_lr] [--warmup_steps N] [--min_lr_ratio R]\n"
      "        [--mixed_precision no|bf16] [--loss_chunk_tokens N|0 (auto)|-1 (off)]\n"
      "        [--lora_r R [--lora_alpha A] [--lora_targets q_proj,v_proj|all-linear]\n"
      "         [--lora_use_rslora] [--lora_dropout P] [--base_dtype float32|bf16]]\n"
      "        [--eval_every_steps N (--eval_data PATH|embedded | --eval_token_data "
      "PATH)\n"
      "         [--eval_max_batches N]] [--memory_budget BYTES|6GiB]\n"
      "        flags not given keep the daemon's defaults; --lr, --checkpointing and\n"
      "        --grad_accum are short for the long names; --resume continues the last\n"
      "        run (restored by load --resume) at its next step, its values for every\n"
      "        flag not given (--steps: the rest of the run); --memory_budget runs the\n"
      "        fastest configuration planned to fit (batch split, checkpointing,\n"
      "        offloading)\n"
      "  evaluate [--data PATH | --token_data PATH | --indexed_data PREFIX] "
      "[--batch_size B]\n"
      "        [--seq_len T]\n"
      "        [--max_batches N] [--attn_implementation sdpa|eager]\n"
      "        [--mixed_precision no|bf16] [--loss_chunk_tokens N]  the model's loss\n"
      "        and perplexity, no gradients\n"
      "  plan [--preset NAME | --hf_config DIR] [--target cpu|cuda] [--capacity BYTES]\n"
      "       [--world_size N --sharding none|optimizer|gradients|full]\n"
      "       [train's flags: --batch_size B --seq_len T --gradient_checkpointing\n"
      "        --checkpoint_layers N\n"
      "        --grad_accumulation_steps K --attn_implementation A\n"
      "        --loss_chunk_tokens N --mixed_precision M --offload ...]\n"
      "        where every byte of one training step would go, before it runs\n"
      "        (default model: the loaded one)\n"
      "  snapshot NAME [--kind weights|checkpoint|adapter] [--max_shard_size 2GB] "
      "[--dtype "
      "bf16]\n"
      "                [--mode blocking|async]\n"
      "  snapshots [list] | snapshots describe|delete NAME\n"
      "  memory [--all_ranks] [reset-peak | record start [--max_entries N]\n"
      "         | record stop [--clear]\n"
      "         | dump -o FILE\n"
      "         | top [--by module|op|category] [--phase P] [--top N]\n"
      "         | diff STEP_A STEP_B [--top N] | oom]\n"
      "exit codes: 0 ok, 1 the daemon answered an error, 2 usage, 3 unreachable,\n"
      "            4 the operation failed or was cancelled\n");
  return kExitUsage;
}

void PrintOperation(const Context& c, const v1::Operation& op) {
  if (c.json) {
    std::printf("%s\n", ToJsonLine(op).c_str());
    return;
  }
  std::string line = absl::StrFormat(
      "%-8s %-10s %-10s %d/%d %s", op.id(),
      v1::OperationKind_Name(op.kind()).substr(sizeof("OPERATION_KIND_") - 1),
      v1::OperationState_Name(op.state()).substr(sizeof("OPERATION_STATE_") - 1),
      op.progress().completed(), op.progress().total(), op.progress().unit());
  if (!op.progress().message().empty())
    absl::StrAppend(&line, "  ", op.progress().message());
  if (op.has_error()) absl::StrAppend(&line, "  error: ", op.error().message());
  std::printf("%s\n", line.c_str());
}

int ExitForOperation(const v1::Operation& op) {
  return op.done() && op.state() != v1::OPERATION_STATE_SUCCEEDED ? kExitOperationFailed
                                                                  : kExitOk;
}

grpc::Status WaitForOperation(const Context& c, const std::string& id,
                              v1::Operation* op) {
  for (;;) {
    v1::WaitOperationRequest req;
    req.set_id(id);
    auto ctx = c.client->NewContext(std::chrono::milliseconds(70000));
    grpc::Status s = c.client->stub().WaitOperation(ctx.get(), req, op);
    if (!s.ok() || op->done()) return s;
  }
}

}  // namespace memprofd::cli
