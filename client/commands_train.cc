// memprofctl train: starts training, shows a live progress line (or one JSON
// object per step with --json) and a summary. memprofctl evaluate: the loss of
// the model on held-out data.

#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/flags.h"
#include "core/offload/offload_fields.h"
#include "core/train/request_fields.h"

namespace memprofd::cli {
namespace {

std::string Eta(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "?";
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 3600 ? absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60)
                   : absl::StrFormat("%dm%02ds", s / 60, s % 60);
}

// A flag and its short alias: *value is the one given (if any); false when
// both were.
template <typename T>
bool Either(const absl::Flag<T>& flag, const absl::Flag<T>& alias,
            std::optional<T>* value) {
  std::optional<T> a = GivenFlag(flag);
  std::optional<T> b = GivenFlag(alias);
  if (a && b) return false;
  *value = a ? a : b;
  return true;
}

// An offload flag's value as the proto's field takes it: scalars as they are,
// a target by name, a read-ahead depth as "auto" (-1) or a number >= 0. false
// when the text is neither; OffloadFlagSpelling then says what it may be.
template <typename T>
bool OffloadFlagToWire(T value, T* wire) {
  *wire = value;
  return true;
}
// Only text can be misspelt: the error's echo of the other kinds is never built.
template <typename T>
std::string OffloadFlagText(T value) {
  return absl::StrCat(value);
}
inline std::string OffloadFlagText(bool value) { return value ? "true" : "false"; }
bool OffloadFlagToWire(const std::string& text, v1::OffloadTarget* wire) {
  if (text == "disk") *wire = v1::OFFLOAD_TARGET_DISK;
  if (text == "host") *wire = v1::OFFLOAD_TARGET_HOST;
  return text == "disk" || text == "host";
}
bool OffloadFlagToWire(const std::string& text, int32_t* wire) {
  if (text == "auto") {
    *wire = -1;
    return true;
  }
  return absl::SimpleAtoi(text, wire) && *wire >= 0;
}
template <typename T>
const char* OffloadFlagSpelling(T) {
  return "see usage";
}
const char* OffloadFlagSpelling(v1::OffloadTarget) { return "use disk or host"; }
const char* OffloadFlagSpelling(int32_t) { return "use auto or a number >= 0"; }

// A request field's flag, when given, into the request `req` (the flag is
// named as the field).
#define MEMPROFD_FIELD_FROM_FLAG_(name, ...) \
  if (auto v = GivenFlag(FLAGS_##name)) req.set_##name(*v);

}  // namespace

bool DataSourceFromFlags(const std::string& text_file, const std::string& token_file,
                         v1::DataSource* source, std::string* error) {
  if (!text_file.empty() && !token_file.empty()) {
    *error = "give a text file or a token file, not both";
    return false;
  }
  if (text_file == "embedded") {
    source->set_embedded_corpus(true);
  } else if (!text_file.empty()) {
    source->set_text_file(text_file);
  }
  if (!token_file.empty()) {
    source->mutable_token_file()->set_path(token_file);
    if (auto v = GivenFlag(FLAGS_bytes_per_token)) {
      source->mutable_token_file()->set_bytes_per_token(*v);
    }
  }
  return true;
}

// --indexed_data and --indexed_windows into `source` (train's and
// evaluate's data, never eval_data). False, with `error`, for a second source
// or a windows value the flag does not name.
bool IndexedDataFromFlags(v1::DataSource* source, std::string* error) {
  const std::string prefix = absl::GetFlag(FLAGS_indexed_data);
  const std::string windows = absl::GetFlag(FLAGS_indexed_windows);
  if (prefix.empty()) {
    if (!windows.empty()) *error = "--indexed_windows goes with --indexed_data";
    return windows.empty();
  }
  if (source->source_case() != v1::DataSource::SOURCE_NOT_SET) {
    *error = "give one of --data, --token_data and --indexed_data";
    return false;
  }
  source->mutable_indexed_dataset()->set_prefix(prefix);
  if (windows == "packed") {
    source->mutable_indexed_dataset()->set_windows(v1::INDEXED_WINDOWS_PACKED);
  } else if (windows == "within_documents") {
    source->mutable_indexed_dataset()->set_windows(v1::INDEXED_WINDOWS_WITHIN_DOCUMENTS);
  } else if (!windows.empty()) {
    *error = "--indexed_windows is packed or within_documents";
    return false;
  }
  return true;
}

int EvaluateCommand(const Context& c, const Args& args) {
  if (!args.empty()) return Usage("evaluate takes flags only (see usage)");
  v1::EvaluateRequest req;
  std::string error;
  if (!DataSourceFromFlags(absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_token_data),
                           req.mutable_data(), &error)) {
    return Usage(absl::StrCat("--data / --token_data: ", error));
  }
  if (!IndexedDataFromFlags(req.mutable_data(), &error)) {
    return Usage(absl::StrCat("--indexed_data: ", error));
  }
  // Every field of request_fields.h's Evaluate lists has a flag of its name.
  MEMPROFD_EVAL_VALUE_FIELDS(MEMPROFD_FIELD_FROM_FLAG_)
  MEMPROFD_EVAL_CHOICE_FIELDS(MEMPROFD_FIELD_FROM_FLAG_)
  v1::Operation op;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().Evaluate(ctx.get(), req, &op);
  if (!s.ok()) return ReportRpcError("evaluate", s);
  s = WaitForOperation(c, op.id(), &op);
  if (!s.ok()) return ReportRpcError("evaluate", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(op).c_str());
    return ExitForOperation(op);
  }
  if (op.has_evaluate()) {
    const v1::EvaluateResult& e = op.evaluate();
    std::printf(
        "%s: loss %.4f, perplexity %.3f over %lld tokens (%lld batches) in %.2f s, at "
        "step %lld\n",
        op.id().c_str(), e.loss(), e.perplexity(), static_cast<long long>(e.tokens()),
        static_cast<long long>(e.batches()), e.seconds(),
        static_cast<long long>(e.global_step()));
    if (e.peak_gathered_parameter_bytes() > 0) {
      std::printf(
          "  fully sharded: at most %s of parameters gathered at once\n",
          HumanBytes(static_cast<double>(e.peak_gathered_parameter_bytes())).c_str());
    }
  }
  if (op.has_error()) {
    std::fprintf(stderr, "memprofctl: evaluate: %s\n", op.error().message().c_str());
  }
  return ExitForOperation(op);
}

bool TrainRequestFromFlags(v1::TrainRequest* out, std::string* error) {
  v1::TrainRequest& req = *out;
  // Every field of request_fields.h's Train lists has a flag of its name.
  MEMPROFD_TRAIN_VALUE_FIELDS(MEMPROFD_FIELD_FROM_FLAG_)
  MEMPROFD_TRAIN_CHOICE_FIELDS(MEMPROFD_FIELD_FROM_FLAG_)
  // Short spellings of three flags.
  std::optional<double> learning_rate;
  std::optional<bool> gradient_checkpointing;
  std::optional<int64_t> grad_accumulation_steps;
  if (!Either(FLAGS_learning_rate, FLAGS_lr, &learning_rate)) {
    *error = "give --learning_rate or --lr, not both";
    return false;
  }
  if (!Either(FLAGS_gradient_checkpointing, FLAGS_checkpointing,
              &gradient_checkpointing)) {
    *error = "give --gradient_checkpointing or --checkpointing, not both";
    return false;
  }
  if (!Either(FLAGS_grad_accumulation_steps, FLAGS_grad_accum,
              &grad_accumulation_steps)) {
    *error = "give --grad_accumulation_steps or --grad_accum, not both";
    return false;
  }
  if (learning_rate) req.set_learning_rate(*learning_rate);
  if (gradient_checkpointing) req.set_gradient_checkpointing(*gradient_checkpointing);
  if (grad_accumulation_steps) req.set_grad_accumulation_steps(*grad_accumulation_steps);
  if (!DataSourceFromFlags(absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_token_data),
                           req.mutable_data(), error)) {
    *error = absl::StrCat("--data / --token_data: ", *error);
    return false;
  }
  if (!IndexedDataFromFlags(req.mutable_data(), error)) {
    *error = absl::StrCat("--indexed_data: ", *error);
    return false;
  }
  const std::string eval_data = absl::GetFlag(FLAGS_eval_data);
  const std::string eval_token_data = absl::GetFlag(FLAGS_eval_token_data);
  if (!eval_data.empty() || !eval_token_data.empty()) {
    if (!DataSourceFromFlags(eval_data, eval_token_data, req.mutable_eval_data(),
                             error)) {
      *error = absl::StrCat("--eval_data / --eval_token_data: ", *error);
      return false;
    }
  }
  // Every field of offload_fields.h has a flag (its CLI_FLAG).
  v1::OffloadOptions offload;
  bool any_offload = false;
#define MEMPROFD_OFFLOAD_FROM_FLAG_(name, type, flag, ...)                  \
  if (auto v = GivenFlag(FLAGS_##flag)) {                                   \
    std::decay_t<decltype(offload.name())> wire{};                          \
    if (!OffloadFlagToWire(*v, &wire)) {                                    \
      *error = absl::StrCat("--" #flag " cannot be '", OffloadFlagText(*v), \
                            "': ", OffloadFlagSpelling(wire));              \
      return false;                                                         \
    }                                                                       \
    offload.set_##name(wire);                                               \
    any_offload = true;                                                     \
  }
  MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_FROM_FLAG_)
#undef MEMPROFD_OFFLOAD_FROM_FLAG_
  if (any_offload) *req.mutable_offload() = offload;
  return true;
}

int TrainCommand(const Context& c, const Args& args) {
  if (!args.empty()) return Usage("train takes flags only (see usage)");
  // Only what the user gave, so that every other field keeps the daemon's
  // default; steps has no default there, so memprofctl always sends its own.
  v1::TrainRequest req;
  req.set_resume(absl::GetFlag(FLAGS_resume));
  if (auto budget = GivenFlag(FLAGS_memory_budget)) {
    req.set_memory_budget_bytes(budget->bytes);
  }
  std::string error;
  if (!TrainRequestFromFlags(&req, &error)) return Usage(error);
  // A resume without --steps runs the rest of the resumed run; otherwise
  // steps goes even when not given, since the daemon has no default for it.
  if (!req.resume() && !req.has_steps()) req.set_steps(absl::GetFlag(FLAGS_steps));

  v1::Operation op;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().Train(ctx.get(), req, &op);
  if (!s.ok()) return ReportRpcError("train", s);
  if (!c.json && req.has_steps()) {
    std::printf("training %s: %lld steps\n", op.id().c_str(),
                static_cast<long long>(req.steps()));
  } else if (!c.json) {
    std::printf("training %s: the rest of the resumed run\n", op.id().c_str());
  }

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
    if (!r.budget_choice().empty()) {
      std::printf("under the budget: %s, planned peak %s\n", r.budget_choice().c_str(),
                  HumanBytes(static_cast<double>(r.planned_peak_bytes())).c_str());
    }
    seconds += r.step_seconds();
    std::string line;
    if (req.has_steps()) {
      const double eta = seconds / static_cast<double>(r.step()) *
                         static_cast<double>(req.steps() - r.step());
      line = absl::StrFormat("step %d/%d  loss %.4f  lr %.3g  %.0f tokens/s  ETA %s",
                             r.step(), req.steps(), r.loss(), r.learning_rate(),
                             r.tokens_per_second(), Eta(eta));
    } else {
      line = absl::StrFormat("step %d (global %d)  loss %.4f  lr %.3g  %.0f tokens/s",
                             r.step(), r.global_step(), r.loss(), r.learning_rate(),
                             r.tokens_per_second());
    }
    if (r.has_eval()) {
      absl::StrAppend(&line, absl::StrFormat("  eval loss %.4f (ppl %.2f)",
                                             r.eval().loss(), r.eval().perplexity()));
    }
    if (r.offload().bytes_out() > 0 || req.has_offload()) {
      absl::StrAppend(
          &line, "  offloaded ", HumanBytes(static_cast<double>(r.offload().bytes_out())),
          " (dedup saved ",
          HumanBytes(static_cast<double>(r.offload().dedup_bytes_saved())), ")");
      if (r.offload().ineffective_bytes() > 0) {
        absl::StrAppend(&line, ", ",
                        HumanBytes(static_cast<double>(r.offload().ineffective_bytes())),
                        " of it still held on the device");
      }
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
  // A failed run's error goes to stderr in every mode: with --json, stdout
  // holds the step reports alone.
  if (c.json) {
    if (op.has_error()) {
      std::fprintf(stderr, "memprofctl: train: %s\n", op.error().message().c_str());
    }
    return ExitForOperation(op);
  }
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
