#ifndef MEMPROFD_SERVER_REACTORS_H_
#define MEMPROFD_SERVER_REACTORS_H_

// The service's callback-API reactors. Those that follow an Operation do so
// without blocking a gRPC thread: they subscribe to the operation and write
// (or finish) when it changes. Each deletes itself in OnDone.
//
// Lifetime: the operation's change callback may run on the owner thread at
// any moment, so it reaches the reactor through a shared Link whose mutex
// also serialises every reaction; OnDone clears the link before deleting.
// gRPC runs reactions from its own threads, never inline from StartWrite or
// Finish, so calling them under the link's mutex is safe.

#include <grpcpp/alarm.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/session/operation.h"
#include "memprofd/v1/memory.pb.h"
#include "memprofd/v1/operation.pb.h"
#include "memprofd/v1/train.pb.h"
#include "server/grpc_status.h"

namespace memprofd {

// Called once with the final status, for metrics.
using StreamDoneFn = std::function<void(const grpc::Status&)>;

template <typename Msg>
class OperationStream : public grpc::ServerWriteReactor<Msg> {
 public:
  OperationStream(std::shared_ptr<Operation> op, StreamDoneFn on_done)
      : op_(std::move(op)),
        on_done_(std::move(on_done)),
        link_(std::make_shared<Link>()) {
    link_->stream = this;
  }

  // Subscribes and sends what is there already. Call once, right after
  // construction.
  void Start() {
    std::shared_ptr<Link> link = link_;
    token_ = op_->Subscribe([link] {
      absl::MutexLock lock(&link->mu);
      if (link->stream != nullptr) link->stream->PumpLocked();
    });
    absl::MutexLock lock(&link_->mu);
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&link_->mu);
    writing_ = false;
    if (!ok) {
      FinishLocked(ToGrpcStatus(absl::CancelledError("client went away")));
      return;
    }
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&link_->mu);
    FinishLocked(ToGrpcStatus(absl::CancelledError("stream cancelled")));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&link_->mu);
      link_->stream = nullptr;
    }
    op_->Unsubscribe(token_);
    if (on_done_) on_done_(final_status_);
    delete this;
  }

 protected:
  // Under the lock: fills *msg and returns true when there is something new
  // to send.
  virtual bool Next(Msg* msg) = 0;
  // Under the lock, after Next returned false: true when nothing more will
  // ever be sent.
  virtual bool Complete() = 0;

  const std::shared_ptr<Operation> op_;

 private:
  struct Link {
    absl::Mutex mu;
    OperationStream* stream = nullptr;
  };

  void PumpLocked() {
    if (writing_ || finished_) return;
    if (Next(&msg_)) {
      writing_ = true;
      this->StartWrite(&msg_);
    } else if (Complete()) {
      FinishLocked(grpc::Status::OK);
    }
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    final_status_ = status;
    this->Finish(status);
  }

  StreamDoneFn on_done_;
  std::shared_ptr<Link> link_;
  int token_ = 0;
  Msg msg_;
  bool writing_ = false;
  bool finished_ = false;
  grpc::Status final_status_;
};

// WaitOperation: finishes when the operation is done or at the deadline.
class WaitOperationReactor : public grpc::ServerUnaryReactor {
 public:
  using Respond = std::function<void(const OperationView&)>;
  WaitOperationReactor(std::shared_ptr<Operation> op, absl::Time deadline,
                       Respond respond, StreamDoneFn on_done);
  void Start();
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Link {
    absl::Mutex mu;
    WaitOperationReactor* reactor = nullptr;
  };
  void CheckLocked(bool timed_out);
  void FinishLocked(const grpc::Status& status);

  const std::shared_ptr<Operation> op_;
  const absl::Time deadline_;
  Respond respond_;
  StreamDoneFn on_done_;
  std::shared_ptr<Link> link_;
  grpc::Alarm alarm_;
  int token_ = 0;
  bool finished_ = false;
  grpc::Status final_status_;
};

// WatchOperation: the operation's state now, then on every change, until
// done.
class WatchOperationStream : public OperationStream<v1::Operation> {
 public:
  using OperationStream::OperationStream;

 protected:
  bool Next(v1::Operation* msg) override;
  bool Complete() override { return sent_done_; }

 private:
  bool sent_any_ = false;
  bool sent_done_ = false;
  uint64_t last_version_ = 0;
};

// StreamStepReports: a TRAIN operation's step reports from `from_step`, live
// until it is done.
class StepReportStream : public OperationStream<v1::StepReport> {
 public:
  StepReportStream(std::shared_ptr<Operation> op, int64_t from_step,
                   StreamDoneFn on_done);

 protected:
  bool Next(v1::StepReport* msg) override;
  bool Complete() override { return done_; }

 private:
  int64_t next_;
  bool done_ = false;
};

// DumpMemoryHistory: a byte string made elsewhere (off gRPC's threads) and
// handed over through a Delivery, then sent in chunks of 1 MiB. A client
// that cancels before the delivery is answered CANCELLED at once.
class ChunkStream : public grpc::ServerWriteReactor<v1::DumpChunk> {
  struct Link;

 public:
  // Hands the stream what to send, or the status to fail with. Call once,
  // from any thread; after the stream is gone (the client cancelled) it
  // drops the data.
  class Delivery {
   public:
    void operator()(absl::StatusOr<std::string> data) const;
    // False once the stream has finished (its client cancelled): what it
    // would deliver is not wanted any more.
    bool wanted() const;

   private:
    friend class ChunkStream;
    explicit Delivery(std::shared_ptr<Link> link) : link_(std::move(link)) {}
    std::shared_ptr<Link> link_;
  };

  explicit ChunkStream(StreamDoneFn on_done);
  Delivery delivery() const { return Delivery(link_); }

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Link {
    absl::Mutex mu;
    ChunkStream* stream = nullptr;
  };
  static constexpr size_t kChunk = 1 << 20;
  void NextLocked();
  void FinishLocked(const grpc::Status& status);

  StreamDoneFn on_done_;
  std::shared_ptr<Link> link_;
  // Under link_->mu:
  std::string data_;
  bool delivered_ = false;
  bool finished_ = false;
  size_t offset_ = 0;
  v1::DumpChunk chunk_;
  grpc::Status final_;
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_REACTORS_H_
