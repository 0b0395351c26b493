// The server library in-process: option validation, auth, status mapping,
// and the operation RPCs (get, wait, watch, cancel) over a real channel.

#include "server/server.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "core/common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/grpc_status.h"
#include "server/metrics.h"
#include "tests/server/scrape.h"
#include "tests/testing/session.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;

TEST(ListenAddressTest, AcceptsHostPortForms) {
  for (const char* a :
       {"127.0.0.1:0", "0.0.0.0:50051", "[::1]:9464", "localhost:65535"}) {
    EXPECT_TRUE(ValidateListenAddress("listen", a).ok()) << a;
  }
}

TEST(ListenAddressTest, RejectsWithTheFlagName) {
  for (const char* a :
       {"", "127.0.0.1", ":80", "h:-1", "h:65536", "h:http", "[::1:80", "a b:1"}) {
    absl::Status s = ValidateListenAddress("metrics_listen", a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << a;
    EXPECT_THAT(s.message(), HasSubstr("--metrics_listen")) << a;
  }
}

TEST(GrpcStatusTest, CodesAndMessagesCarryOver) {
  grpc::Status s = ToGrpcStatus(absl::ResourceExhaustedError("out of memory: 1 GiB"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "out of memory: 1 GiB");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::DATA_LOSS), "DATA_LOSS");
}

TEST(GrpcStatusTest, LongMessagesAreCutAtACharacterBoundaryAndSayHowMuch) {
  // 3000 two-byte characters: a cut at kMaxStatusMessageBytes lands between
  // the bytes of one unless it backs up.
  std::string long_message = "x";
  for (int i = 0; i < 3000; ++i) long_message += "\xc3\xa9";
  const grpc::Status s = ToGrpcStatus(absl::InvalidArgumentError(long_message));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LE(s.error_message().size(), kMaxStatusMessageBytes + 40);
  EXPECT_TRUE(IsValidUtf8(s.error_message()));
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("more bytes cut)"));
  EXPECT_EQ(s.error_message().rfind("x\xc3\xa9", 0), 0u);
  // Short messages carry over whole, invalid bytes made visible as U+FFFD.
  EXPECT_EQ(ToGrpcStatus(absl::InternalError("a\xff")).error_message(), "a\xef\xbf\xbd");
}

TEST(TokenAuthTest, FileErrorsAreClear) {
  auto missing = TokenAuth::Create("/nonexistent/token");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  const testing::TempDir tmp;
  EXPECT_THAT(TokenAuth::Create(tmp.WriteFile("empty_token", "  \n")).status().message(),
              HasSubstr("holds no token"));
  auto disabled = TokenAuth::Create("");
  ASSERT_TRUE(disabled.ok());
  EXPECT_FALSE((*disabled)->enabled());
}

TEST(TokenAuthTest, RefusesATokenFileOtherUsersCanReadOrChange) {
  const testing::TempDir tmp;
  const std::string path = tmp.WriteFile("token", "s3cret\nsecond line ignored\n");
  for (mode_t mode : {0644, 0604, 0620, 0666, 0602}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    auto auth = TokenAuth::Create(path);
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kFailedPrecondition) << mode;
    EXPECT_THAT(auth.status().message(), HasSubstr("chmod 600")) << mode;
  }
  for (mode_t mode : {0600, 0400, 0440, 0640}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    auto auth = TokenAuth::Create(path);
    ASSERT_TRUE(auth.ok()) << mode << ": " << auth.status();
    EXPECT_TRUE((*auth)->enabled());
  }
}

TEST(TokenAuthTest, RefusesADirectoryAsTokenFile) {
  const testing::TempDir tmp;
  auto auth = TokenAuth::Create(tmp.path());
  EXPECT_EQ(auth.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(auth.status().message(), HasSubstr("regular file"));
}

class InProcessServerTest : public ::testing::Test {
 protected:
  // Shorter than the daemon's 3 s, so that the test of a stream that outlives
  // it waits one second.
  static constexpr double kGraceSeconds = 1.0;

  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.session.device = "cpu";
    options.shutdown_grace_seconds = kGraceSeconds;
    server_ = std::make_unique<Server>(options, testing::ProcessRuntime());
    ASSERT_TRUE(server_->Start().ok());
    ClientOptions client_options;
    client_options.addr = absl::StrCat("127.0.0.1:", server_->grpc_port());
    auto client = Client::Create(client_options);
    ASSERT_TRUE(client.ok());
    client_ = *std::move(client);
  }
  void TearDown() override { server_->Shutdown(); }

  OperationRegistry& ops() { return server_->session()->operations_for_testing(); }

  struct StreamEnd {
    grpc::Status status;
    v1::Operation last;  // the last message the stream delivered
    std::chrono::milliseconds shutdown_took{0};
  };
  // Calls Shutdown() on another thread while reading `reader` to its end;
  // `last` is the message read before. A Shutdown still running after 30 s
  // cannot be unwound from a test: the binary aborts, saying so, instead of
  // waiting for ctest's timeout.
  StreamEnd ShutdownWhileReading(grpc::ClientReaderInterface<v1::Operation>* reader,
                                 const v1::Operation& last) {
    std::future<std::chrono::milliseconds> took = std::async(std::launch::async, [this] {
      const auto start = std::chrono::steady_clock::now();
      server_->Shutdown();
      return std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
    });
    StreamEnd end;
    end.last = last;
    while (reader->Read(&end.last)) {
    }
    end.status = reader->Finish();
    if (took.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      std::fprintf(stderr, "Server::Shutdown has not returned after 30 s\n");
      std::abort();
    }
    end.shutdown_took = took.get();
    return end;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(InProcessServerTest, ASingleProcessLabelsEveryMetricRankZeroNodeZero) {
  absl::StatusOr<std::string> text = testing::ScrapeMetrics(server_->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  // The server's registry, the process collectable and the session's.
  for (const char* name :
       {"memprofd_build_info{", "process_resident_memory_bytes{",
        "memprofd_train_steps_total{", "memprofd_memory_allocated_bytes{",
        "memprofd_train_step_seconds_count{"}) {
    EXPECT_THAT(*text, HasSubstr(name));
  }
  EXPECT_THAT(*text, HasSubstr("memprofd_world_size{node=\"0\",rank=\"0\"} 1"));
  EXPECT_THAT(testing::SamplesWithoutLabels(*text, {"rank=\"0\"", "node=\"0\""}),
              ::testing::ElementsAre());
}

TEST_F(InProcessServerTest, WatchStreamsEveryChangeUntilDone) {
  auto op = ops().Create(OperationKind::kTrain);
  std::thread worker([op] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    op->MarkRunning();
    for (int i = 1; i <= 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      op->SetProgress(i, 3, "steps", absl::StrCat("step ", i));
    }
    op->Finish(absl::OkStatus());
  });
  v1::WatchOperationRequest req;
  req.set_id(op->id());
  auto ctx = client_->NewContext(std::chrono::seconds(20));
  auto reader = client_->stub().WatchOperation(ctx.get(), req);
  v1::Operation msg;
  std::vector<v1::Operation> seen;
  while (reader->Read(&msg)) seen.push_back(msg);
  worker.join();
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.front().state(), v1::OPERATION_STATE_QUEUED);
  EXPECT_TRUE(seen.back().done());
  EXPECT_EQ(seen.back().state(), v1::OPERATION_STATE_SUCCEEDED);
  EXPECT_EQ(seen.back().progress().completed(), 3);
  for (size_t i = 0; i + 1 < seen.size(); ++i) EXPECT_FALSE(seen[i].done());
}

TEST_F(InProcessServerTest, WaitReturnsAtTimeoutThenWhenDone) {
  auto op = ops().Create(OperationKind::kSnapshot);
  v1::WaitOperationRequest req;
  req.set_id(op->id());
  req.set_timeout_ms(200);
  v1::Operation resp;
  auto start = std::chrono::steady_clock::now();
  auto ctx = client_->NewContext(std::chrono::seconds(10));
  ASSERT_TRUE(client_->stub().WaitOperation(ctx.get(), req, &resp).ok());
  EXPECT_FALSE(resp.done());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(190));

  std::thread finisher([op] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    op->Finish(
        absl::ResourceExhaustedError("disk full: free space under the snapshot root"));
  });
  req.set_timeout_ms(10000);
  auto ctx2 = client_->NewContext(std::chrono::seconds(20));
  ASSERT_TRUE(client_->stub().WaitOperation(ctx2.get(), req, &resp).ok());
  finisher.join();
  EXPECT_TRUE(resp.done());
  EXPECT_EQ(resp.state(), v1::OPERATION_STATE_FAILED);
  EXPECT_EQ(resp.error().code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(resp.error().message(), HasSubstr("disk full"));
}

TEST_F(InProcessServerTest, CancelAsksAndRefusesWhenDone) {
  auto op = ops().Create(OperationKind::kTrain);
  v1::CancelOperationRequest req;
  req.set_id(op->id());
  v1::Operation resp;
  auto ctx = client_->NewContext(std::chrono::seconds(10));
  ASSERT_TRUE(client_->stub().CancelOperation(ctx.get(), req, &resp).ok());
  EXPECT_TRUE(op->cancel_requested());
  op->Finish(absl::CancelledError("cancelled by request"));
  auto ctx2 = client_->NewContext(std::chrono::seconds(10));
  grpc::Status s = client_->stub().CancelOperation(ctx2.get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  v1::ListOperationsRequest list;
  list.set_kind(v1::OPERATION_KIND_TRAIN);
  v1::ListOperationsResponse listed;
  auto ctx3 = client_->NewContext(std::chrono::seconds(10));
  ASSERT_TRUE(client_->stub().ListOperations(ctx3.get(), list, &listed).ok());
  ASSERT_EQ(listed.operations_size(), 1);
  EXPECT_EQ(listed.operations(0).state(), v1::OPERATION_STATE_CANCELLED);
}

// A training still running when the daemon stops: the drain stops it at its
// next step boundary, and the watch stream ends with the drain's ending
// (FAILED, ABORTED, reason DRAINING: not a cancel) and an OK status.
TEST_F(InProcessServerTest, ShutdownEndsTheWatchStreamOfARunningTraining) {
  v1::TrainRequest train;
  train.set_steps(1'000'000);  // hours: only Shutdown ends it
  train.set_batch_size(1);
  train.set_seq_len(16);
  v1::Operation started;
  auto ctx = client_->NewContext(std::chrono::seconds(10));
  ASSERT_TRUE(client_->stub().Train(ctx.get(), train, &started).ok());
  v1::WatchOperationRequest req;
  req.set_id(started.id());
  auto watch_ctx = client_->NewContext(std::chrono::seconds(60));
  auto reader = client_->stub().WatchOperation(watch_ctx.get(), req);
  v1::Operation msg;
  // Until a step has run: the owner thread is inside the training loop.
  while (reader->Read(&msg) && !msg.done() && msg.progress().completed() < 1) {
  }
  ASSERT_EQ(msg.state(), v1::OPERATION_STATE_RUNNING) << msg.DebugString();

  const StreamEnd end = ShutdownWhileReading(reader.get(), msg);
  // OK, not UNAVAILABLE: the stream ended with the operation, not at the end
  // of the grace period (see the next test).
  EXPECT_TRUE(end.status.ok()) << GrpcCodeName(end.status.error_code()) << ": "
                               << end.status.error_message();
  EXPECT_TRUE(end.last.done());
  EXPECT_EQ(end.last.state(), v1::OPERATION_STATE_FAILED);
  EXPECT_GE(end.last.train().steps_completed(), 1);
  EXPECT_EQ(end.last.error().code(), static_cast<int>(grpc::StatusCode::ABORTED));
  EXPECT_EQ(end.last.error().reason(), "DRAINING");
  // The step that was running, then the join: a fraction of a second here,
  // with room for a loaded machine.
  EXPECT_LT(end.shutdown_took.count(), 10'000);
}

// Work that does not stop when asked (here an operation nothing finishes):
// the watch stream still ends at the end of the grace period, when gRPC's
// server ends the calls still open with UNAVAILABLE ("Cancelling all calls",
// which tells a client to retry elsewhere), and Shutdown returns then.
TEST_F(InProcessServerTest, ShutdownEndsTheWatchStreamOfWorkThatDoesNotStop) {
  auto op = ops().Create(OperationKind::kSnapshot);
  op->MarkRunning();
  v1::WatchOperationRequest req;
  req.set_id(op->id());
  auto ctx = client_->NewContext(std::chrono::seconds(60));
  auto reader = client_->stub().WatchOperation(ctx.get(), req);
  v1::Operation msg;
  while (reader->Read(&msg) && msg.state() != v1::OPERATION_STATE_RUNNING) {
  }
  ASSERT_EQ(msg.state(), v1::OPERATION_STATE_RUNNING);

  const StreamEnd end = ShutdownWhileReading(reader.get(), msg);
  EXPECT_EQ(end.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << GrpcCodeName(end.status.error_code()) << ": " << end.status.error_message();
  EXPECT_FALSE(end.last.done());
  EXPECT_TRUE(op->cancel_requested());
  // In-flight calls get the whole grace period, and not much more.
  EXPECT_GE(end.shutdown_took.count(), kGraceSeconds * 1000 - 100);
  EXPECT_LT(end.shutdown_took.count(), kGraceSeconds * 1000 + 5000);
}

// DumpMemoryHistory's pickle is built on the service's own thread and handed
// to the stream afterwards (work_queue.h): its error, a client that cancels
// before the hand-over, and the whole dump all go through that path.
class DumpStreamTest : public InProcessServerTest {
 protected:
  void SetRecording(bool on) {
    grpc::Status s;
    if (on) {
      v1::StartMemoryRecordingResponse resp;
      s = client_->stub().StartMemoryRecording(client_->NewContext().get(), {}, &resp);
    } else {
      v1::StopMemoryRecordingRequest req;
      req.set_clear(true);
      v1::StopMemoryRecordingResponse resp;
      s = client_->stub().StopMemoryRecording(client_->NewContext().get(), req, &resp);
    }
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // Reads a whole dump; its status, and its bytes in *data.
  grpc::Status Dump(std::string* data) {
    auto ctx = client_->NewContext(std::chrono::seconds(60));
    auto reader = client_->stub().DumpMemoryHistory(ctx.get(), {});
    v1::DumpChunk chunk;
    while (reader->Read(&chunk)) data->append(chunk.data());
    return reader->Finish();
  }
  void TearDown() override {
    SetRecording(false);
    InProcessServerTest::TearDown();
  }
};

TEST_F(DumpStreamTest, NothingRecordedFailsTheStreamSayingWhatToDo) {
  SetRecording(false);
  std::string data;
  const grpc::Status s = Dump(&data);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("StartMemoryRecording"));
  EXPECT_TRUE(data.empty());
}

TEST_F(DumpStreamTest, DumpsCancelledBeforeTheHandOverGiveTheirSlotsBack) {
  SetRecording(true);
  // Three times the daemon's cap of concurrent dumps: a slot kept by a
  // cancelled dump would leave none.
  for (int i = 0; i < 12; ++i) {
    auto ctx = client_->NewContext(std::chrono::seconds(60));
    auto reader = client_->stub().DumpMemoryHistory(ctx.get(), {});
    ctx->TryCancel();
    const grpc::Status s = reader->Finish();
    // OK when the pickle was sent before the cancel arrived; a slot whose
    // OnDone has not run yet refuses with RESOURCE_EXHAUSTED.
    EXPECT_THAT(s.error_code(),
                ::testing::AnyOf(grpc::StatusCode::CANCELLED, grpc::StatusCode::OK,
                                 grpc::StatusCode::RESOURCE_EXHAUSTED))
        << s.error_message();
  }
  // Slots are given back in OnDone, just after the client saw its status.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  grpc::Status s;
  std::string data;
  do {
    data.clear();
    s = Dump(&data);
    if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // A pickle: protocol 2 or higher opens with PROTO, ends with STOP.
  ASSERT_GE(data.size(), 3u);
  EXPECT_EQ(static_cast<unsigned char>(data.front()), 0x80);
  EXPECT_EQ(data.back(), '.');
}

}  // namespace
}  // namespace memprofd
