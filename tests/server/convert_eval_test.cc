// The conversions of the schedule, precision and evaluation fields: requests
// carry only what the client set, and step reports and EVALUATE operations
// come back whole.
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "server/convert.h"

namespace memprofd {
namespace {

TEST(ConvertEvalTest, TrainRequestScheduleEvalAndPrecisionOnlyWhenSet) {
  v1::TrainRequest req;
  absl::StatusOr<TrainSpec> none = FromProto(req);
  ASSERT_TRUE(none.ok());
  const TrainOverrides& n = none->train;
  EXPECT_FALSE(n.lr_scheduler_type.has_value());
  EXPECT_FALSE(n.warmup_steps.has_value());
  EXPECT_FALSE(n.min_lr_ratio.has_value());
  EXPECT_FALSE(n.mixed_precision.has_value());
  EXPECT_FALSE(n.eval_every_steps.has_value());
  EXPECT_FALSE(n.eval_data.has_value());
  EXPECT_FALSE(n.eval_max_batches.has_value());

  req.set_lr_scheduler_type("cosine_with_min_lr");
  req.set_warmup_steps(0);
  req.set_min_lr_ratio(0.25);
  req.set_mixed_precision("bf16");
  req.set_eval_every_steps(7);
  req.mutable_eval_data()->mutable_token_file()->set_path("/data/val.bin");
  req.mutable_eval_data()->mutable_token_file()->set_bytes_per_token(4);
  req.set_eval_max_batches(3);
  absl::StatusOr<TrainSpec> all = FromProto(req);
  ASSERT_TRUE(all.ok());
  const TrainOverrides& t = all->train;
  EXPECT_EQ(t.lr_scheduler_type, std::optional<std::string>("cosine_with_min_lr"));
  EXPECT_EQ(t.warmup_steps, std::optional<int64_t>(0));
  EXPECT_EQ(t.min_lr_ratio, std::optional<double>(0.25));
  EXPECT_EQ(t.mixed_precision, std::optional<std::string>("bf16"));
  EXPECT_EQ(t.eval_every_steps, std::optional<int64_t>(7));
  ASSERT_TRUE(t.eval_data.has_value());
  EXPECT_EQ(t.eval_data->kind, DataSpec::Kind::kTokenFile);
  EXPECT_EQ(t.eval_data->path, "/data/val.bin");
  EXPECT_EQ(t.eval_data->bytes_per_token, 4);
  EXPECT_EQ(t.eval_max_batches, std::optional<int64_t>(3));
  // The training data is left unset: the defaults' (or a resumed run's).
  EXPECT_FALSE(t.data.has_value());
}

TEST(ConvertEvalTest, EvaluateRequestCarriesOnlyTheFieldsSet) {
  v1::EvaluateRequest req;
  EvalSpec none = FromProto(req);
  EXPECT_EQ(none.data.kind, DataSpec::Kind::kEmbeddedCorpus);
  EXPECT_FALSE(none.batch_size.has_value());
  EXPECT_FALSE(none.seq_len.has_value());
  EXPECT_FALSE(none.max_batches.has_value());
  EXPECT_FALSE(none.attn_implementation.has_value());
  EXPECT_FALSE(none.mixed_precision.has_value());
  req.mutable_data()->mutable_inline_tokens()->add_ids(5);
  req.mutable_data()->mutable_inline_tokens()->add_ids(9);
  req.set_batch_size(0);  // set: 0, for the session to refuse
  req.set_seq_len(64);
  req.set_max_batches(2);
  req.set_attn_implementation("eager");
  req.set_mixed_precision("no");
  EvalSpec e = FromProto(req);
  EXPECT_EQ(e.data.kind, DataSpec::Kind::kInlineTokens);
  EXPECT_EQ(e.data.tokens, (std::vector<int64_t>{5, 9}));
  EXPECT_EQ(e.batch_size, std::optional<int64_t>(0));
  EXPECT_EQ(e.seq_len, std::optional<int64_t>(64));
  EXPECT_EQ(e.max_batches, std::optional<int64_t>(2));
  EXPECT_EQ(e.attn_implementation, std::optional<std::string>("eager"));
  EXPECT_EQ(e.mixed_precision, std::optional<std::string>("no"));
}

TEST(ConvertEvalTest, StepReportsAndEvaluateOperationsCarryRatesAndLosses) {
  SessionStepReport r;
  r.step.step = 3;
  r.step.learning_rate = 2.5e-4;
  v1::StepReport p = ToProto(r);
  EXPECT_EQ(p.learning_rate(), 2.5e-4);
  EXPECT_FALSE(p.has_eval());
  EvalResult e;
  e.loss = 2.0;
  e.perplexity = 7.389;
  e.tokens = 4096;
  e.batches = 4;
  e.seconds = 0.5;
  e.global_step = 3;
  r.step.eval = e;
  p = ToProto(r);
  ASSERT_TRUE(p.has_eval());
  EXPECT_EQ(p.eval().loss(), 2.0);
  EXPECT_EQ(p.eval().tokens(), 4096);
  EXPECT_EQ(p.eval().global_step(), 3);

  OperationView view;
  view.kind = OperationKind::kEvaluate;
  view.state = OperationState::kSucceeded;
  view.done = true;
  view.result = e;
  v1::Operation op = ToProto(view);
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_EVALUATE);
  ASSERT_EQ(op.result_case(), v1::Operation::kEvaluate);
  EXPECT_EQ(op.evaluate().perplexity(), 7.389);
  EXPECT_EQ(op.evaluate().batches(), 4);
  EXPECT_EQ(op.evaluate().seconds(), 0.5);
}

}  // namespace
}  // namespace memprofd
