// memprofctl train: starts training, shows a live progress line (or one JSON
// object per step with --json) and a summary.

#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/flags.h"

namespace memprofd::cli {
namespace {

std::string Eta(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "?";
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 3600 ? absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60)
                   : absl::StrFormat("%dm%02ds", s / 60, s % 60);
}

}  // namespace

int TrainCommand(const Context& c, const Args& args) {
  if (!args.empty()) return Usage("train takes flags only (see usage)");
  v1::TrainRequest req;
  req.set_steps(absl::GetFlag(FLAGS_steps));
  req.set_batch_size(absl::GetFlag(FLAGS_batch_size));
  req.set_seq_len(absl::GetFlag(FLAGS_seq_len));
  req.set_learning_rate(absl::GetFlag(FLAGS_lr));
  req.set_seed(absl::GetFlag(FLAGS_seed));
  req.set_gradient_checkpointing(absl::GetFlag(FLAGS_checkpointing));
  req.set_weight_decay(absl::GetFlag(FLAGS_weight_decay));
  req.set_max_grad_norm(absl::GetFlag(FLAGS_max_grad_norm));
  req.set_grad_accumulation_steps(absl::GetFlag(FLAGS_grad_accum));
  const std::string data = absl::GetFlag(FLAGS_data);
  const std::string token_data = absl::GetFlag(FLAGS_token_data);
  if (!data.empty() && !token_data.empty())
    return Usage("give --data or --token_data, not both");
  if (!data.empty()) req.mutable_data()->set_text_file(data);
  if (!token_data.empty()) {
    req.mutable_data()->mutable_token_file()->set_path(token_data);
    req.mutable_data()->mutable_token_file()->set_bytes_per_token(
        absl::GetFlag(FLAGS_bytes_per_token));
  }
  // Offload options: only what the user gave, so that every other field keeps
  // the daemon's default (its own flags). The boolean flags can only say
  // "yes": without them the daemon's setting holds.
  const std::optional<int64_t> min_offload_bytes = absl::GetFlag(FLAGS_min_offload_bytes);
  if (absl::GetFlag(FLAGS_offload) || absl::GetFlag(FLAGS_offload_head) ||
      !absl::GetFlag(FLAGS_offload_target).empty() || min_offload_bytes.has_value() ||
      !absl::GetFlag(FLAGS_prefetch_depth).empty()) {
    v1::OffloadOptions* o = req.mutable_offload();
    if (absl::GetFlag(FLAGS_offload)) o->set_enabled(true);
    if (absl::GetFlag(FLAGS_offload_head)) o->set_offload_head(true);
    if (min_offload_bytes.has_value()) o->set_min_offload_bytes(*min_offload_bytes);
    const std::string target = absl::GetFlag(FLAGS_offload_target);
    if (target == "disk") {
      o->set_target(v1::OFFLOAD_TARGET_DISK);
    } else if (target == "host") {
      o->set_target(v1::OFFLOAD_TARGET_HOST);
    } else if (!target.empty()) {
      return Usage(
          absl::StrCat("--offload_target must be disk or host, not '", target, "'"));
    }
    // "auto" is -1 on the wire.
    const std::string prefetch = absl::GetFlag(FLAGS_prefetch_depth);
    if (!prefetch.empty()) {
      int32_t depth = -1;
      if (prefetch != "auto" && (!absl::SimpleAtoi(prefetch, &depth) || depth < 0)) {
        return Usage(absl::StrCat("--prefetch_depth must be auto or a number >= 0, not '",
                                  prefetch, "'"));
      }
      o->set_prefetch_depth(depth);
    }
  }

  v1::Operation op;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().Train(ctx.get(), req, &op);
  if (!s.ok()) return ReportRpcError("train", s);
  if (!c.json)
    std::printf("training %s: %lld steps\n", op.id().c_str(),
                static_cast<long long>(req.steps()));

  v1::StreamStepReportsRequest stream_req;
  stream_req.set_operation_id(op.id());
  auto stream_ctx = c.client->NewContext();
  auto reader = c.client->stub().StreamStepReports(stream_ctx.get(), stream_req);
  v1::StepReport r;
  const bool tty = isatty(STDOUT_FILENO);
  double seconds = 0;
  while (reader->Read(&r)) {
    if (c.json) {
      std::printf("%s\n", ToJsonLine(r).c_str());
      std::fflush(stdout);
      continue;
    }
    seconds += r.step_seconds();
    const double eta = seconds / static_cast<double>(r.step()) *
                       static_cast<double>(req.steps() - r.step());
    std::string line =
        absl::StrFormat("step %d/%d  loss %.4f  %.0f tokens/s  ETA %s", r.step(),
                        req.steps(), r.loss(), r.tokens_per_second(), Eta(eta));
    if (r.offload().bytes_out() > 0 || req.has_offload()) {
      absl::StrAppend(
          &line, "  offloaded ", HumanBytes(static_cast<double>(r.offload().bytes_out())),
          " (dedup saved ",
          HumanBytes(static_cast<double>(r.offload().dedup_bytes_saved())), ")");
    }
    // A live line on a terminal; one line per step otherwise (logs, pipes).
    std::printf(tty ? "\r\033[K%s" : "%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (tty && !c.json) std::printf("\n");
  s = reader->Finish();
  if (!s.ok()) return ReportRpcError("train (step stream)", s);
  s = WaitForOperation(c, op.id(), &op);
  if (!s.ok()) return ReportRpcError("train", s);
  if (c.json) return ExitForOperation(op);
  if (op.has_train()) {
    const auto& t = op.train();
    std::printf(
        "%s: %lld steps, loss %.4f -> %.4f, %lld tokens in %.1f s (%.0f tokens/s)\n",
        v1::OperationState_Name(op.state())
            .substr(sizeof("OPERATION_STATE_") - 1)
            .c_str(),
        static_cast<long long>(t.steps_completed()), t.first_loss(), t.last_loss(),
        static_cast<long long>(t.tokens()), t.seconds(), t.mean_tokens_per_second());
  }
  if (op.has_error()) {
    std::fprintf(stderr, "memprofctl: train: %s\n", op.error().message().c_str());
  }
  return ExitForOperation(op);
}

}  // namespace memprofd::cli
