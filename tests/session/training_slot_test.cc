// The session's one place for a training: taken once, given back exactly
// once by whichever way the training ends.

#include "core/session/training_slot.h"

#include <gtest/gtest.h>

#include <thread>

namespace memprofd {
namespace {

TEST(TrainingSlotTest, ASecondTrainingIsAbortedUntilTheFirstFinishes) {
  TrainingSlot slot;
  OperationRegistry registry;
  std::shared_ptr<Operation> op = registry.Create(OperationKind::kTrain);
  absl::StatusOr<std::shared_ptr<TrainingSlot::Ticket>> first = slot.Take();
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(slot.held());
  absl::StatusOr<std::shared_ptr<TrainingSlot::Ticket>> second = slot.Take();
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsAborted(second.status())) << second.status();
  EXPECT_NE(second.status().message().find("ListOperations"), std::string::npos);

  // Finishing frees the place before the operation reports done, and the
  // ticket's last copy going afterwards frees nothing twice.
  std::shared_ptr<TrainingSlot::Ticket> copy = *first;
  bool held_when_done = true;
  std::thread watcher([&] {
    OperationView view = op->View();
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!view.done && absl::Now() < deadline) {
      view = op->WaitForChange(view.version, deadline);
    }
    held_when_done = slot.held();
  });
  (*first)->Finish(op, absl::OkStatus());
  watcher.join();
  EXPECT_FALSE(held_when_done);
  EXPECT_TRUE(op->done());
  first->reset();
  copy.reset();
  EXPECT_FALSE(slot.held());
  absl::StatusOr<std::shared_ptr<TrainingSlot::Ticket>> again = slot.Take();
  ASSERT_TRUE(again.ok()) << again.status();
  // Finishing twice (a path that ends after another did) gives back once.
  (*again)->Finish(op, absl::OkStatus());
  (*again)->Finish(op, absl::OkStatus());
  EXPECT_FALSE(slot.held());
  EXPECT_TRUE(slot.Take().ok());
}

TEST(TrainingSlotTest, ATicketDroppedUnfinishedGivesThePlaceBack) {
  TrainingSlot slot;
  {
    absl::StatusOr<std::shared_ptr<TrainingSlot::Ticket>> ticket = slot.Take();
    ASSERT_TRUE(ticket.ok());
    // Work posted for the run holds a copy; shutdown discards it unrun.
    std::function<void()> posted = [t = *ticket] {};
    ticket->reset();
    EXPECT_TRUE(slot.held());
  }
  EXPECT_FALSE(slot.held());
}

TEST(TrainingSlotTest, AFollowersRunQueuesBehindTheOneBeforeIt) {
  TrainingSlot slot;
  std::shared_ptr<TrainingSlot::Ticket> finishing = slot.TakeInTurn();
  std::shared_ptr<TrainingSlot::Ticket> next = slot.TakeInTurn();
  finishing.reset();
  EXPECT_TRUE(slot.held());  // the next run still holds it
  EXPECT_FALSE(slot.Take().ok());
  next.reset();
  EXPECT_FALSE(slot.held());
}

}  // namespace
}  // namespace memprofd
