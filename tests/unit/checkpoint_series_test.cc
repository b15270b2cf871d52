// A series of checkpoints in one root: SaveCheckpoint(root, tag) writes root/tag, points
// root/latest at it once complete, and keeps the newest checkpoint.keep_last;
// LoadCheckpoint(root) loads the one `latest` names.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/engine/scratch_dir.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::IsOk;
using testing::RunOnRanks;
using testing::ToyConfig;
using testing::ToyOptions;

std::string Latest(const std::string& root) {
  std::ifstream in(root + "/latest");
  std::string tag;
  std::getline(in, tag);
  return tag;
}

class CheckpointSeries : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::ScratchDir("zerort-series");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  // Two ranks train a toy model for one step under `config` and save it as root_/`tag`.
  std::vector<Status> TrainAndSave(const Config& config, const std::string& tag) {
    return RunOnRanks(2, [&](int, comm::Communicator& c) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, c));
      ToyOptions o;
      o.steps = 1;
      testing::ToyResult result;
      ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));
      return engine->SaveCheckpoint(root_, tag);
    });
  }
  std::string root_;
};

TEST_F(CheckpointSeries, LatestFollowsTheNewestAndOnlyKeepLastRemain) {
  Config config = ToyConfig(2);
  config.checkpoint.keep_last = 2;
  std::vector<int64_t> loaded_step(2, -1);
  std::vector<Status> statuses = RunOnRanks(2, [&](int r, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, c));
    ToyOptions o;
    o.steps = 2;
    testing::ToyResult result;
    ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));  // at step 2
    for (const char* tag : {"save-1", "save-2", "save-3"}) {
      engine->set_checkpoint_user_data(tag);
      ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(root_ + "/", tag));
      if (r == 0 && Latest(root_) != tag) return absl::InternalError("latest does not name the newest");
    }
    engine->set_checkpoint_user_data("");
    ZERO_RETURN_IF_ERROR(engine->LoadCheckpoint(root_));
    loaded_step[r] = engine->steps_taken();
    if (engine->checkpoint_user_data() != "save-3") {
      return absl::InternalError("loaded " + engine->checkpoint_user_data() + ", not the latest");
    }
    // A tag that is not a plain name is refused before anything is written.
    for (const char* bad : {"", "a/b", "latest", "..", "x.partial"}) {
      const Status s = engine->SaveCheckpoint(root_, bad);
      if (s.code() != absl::StatusCode::kInvalidArgument) return absl::InternalError("tag accepted: " + std::string(bad));
    }
    return absl::OkStatus();
  });
  ASSERT_THAT(statuses, ::testing::Each(IsOk()));
  EXPECT_EQ(loaded_step, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Latest(root_), "save-3");
  // Same step: ordered by when they were saved, so "save-1" went.
  EXPECT_FALSE(std::filesystem::exists(root_ + "/save-1"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/save-2/meta.json"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/save-3/meta.json"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/latest.tmp"));
}

// A job that died after its checkpoint was swapped in and before `latest` was written (the
// first save of a series: no older `latest` to fall back on) resumes from that checkpoint;
// with several and no `latest`, from the newest save.
TEST_F(CheckpointSeries, WithoutLatestTheNewestCompleteCheckpointLoads) {
  const Config config = ToyConfig(2);
  ASSERT_THAT(TrainAndSave(config, "step-9"), ::testing::Each(IsOk()));  // saved first
  ASSERT_TRUE(std::filesystem::remove(root_ + "/latest"));
  std::filesystem::create_directory(root_ + "/step-12.partial");  // an unfinished later save
  std::vector<std::string> loaded(2);
  auto load = [&](int r, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, c));
    ZERO_RETURN_IF_ERROR(testing::RegisterToyModel(*engine, ToyOptions{}).status());
    ZERO_RETURN_IF_ERROR(engine->LoadCheckpoint(root_));
    loaded[r] = engine->checkpoint_user_data();
    return absl::OkStatus();
  };
  ASSERT_THAT(RunOnRanks(2, load), ::testing::Each(IsOk()));  // the one saved
  EXPECT_EQ(loaded, (std::vector<std::string>{"", ""}));
  ASSERT_THAT(RunOnRanks(2, [&](int, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, c));
    ToyOptions o;
    o.steps = 1;
    testing::ToyResult result;
    ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));
    engine->set_checkpoint_user_data("the-newest");
    return engine->SaveCheckpoint(root_, "step-3");  // a smaller step, saved later
  }), ::testing::Each(IsOk()));
  ASSERT_TRUE(std::filesystem::remove(root_ + "/latest"));
  ASSERT_THAT(RunOnRanks(2, load), ::testing::Each(IsOk()));
  EXPECT_EQ(loaded, (std::vector<std::string>{"the-newest", "the-newest"}));
  // A `latest` that names nothing (a dangling link) is an error, not a guess.
  std::filesystem::create_symlink(root_ + "/gone", root_ + "/latest");
  EXPECT_THAT(RunOnRanks(2, load), ::testing::Each(::testing::Not(IsOk())));
}

TEST_F(CheckpointSeries, OlderStepsGoFirstAndOtherDirectoriesStay) {
  Config config = ToyConfig(1);
  config.checkpoint.keep_last = 1;
  std::filesystem::create_directories(root_ + "/notes");  // not a checkpoint: never deleted
  const std::vector<Status> statuses = RunOnRanks(3, [&](int, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, c));
    ToyOptions o;
    o.steps = 1;
    testing::ToyResult result;
    ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));
    return engine->SaveCheckpoint(root_, "z-1");
  });
  ASSERT_THAT(statuses, ::testing::Each(IsOk()));
  // A later save under a name that sorts first: still the newest, so "z-1" goes.
  const std::vector<Status> again = RunOnRanks(3, [&](int, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, c));
    ToyOptions o;
    o.steps = 2;
    testing::ToyResult result;
    ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));
    return engine->SaveCheckpoint(root_, "a-2");
  });
  ASSERT_THAT(again, ::testing::Each(IsOk()));
  EXPECT_EQ(Latest(root_), "a-2");
  EXPECT_FALSE(std::filesystem::exists(root_ + "/z-1"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/notes"));
}

// After a rollback (load step-10, abandoning step-20) the saves that follow are the newest:
// keep_last keeps them and deletes the abandoned later step; a tag that does not end in a
// number ("best") is never deleted.
TEST_F(CheckpointSeries, AfterARollbackTheNewestSavesStayAndNamedTagsAreKept) {
  Config config = ToyConfig(2);
  config.checkpoint.keep_last = 2;
  auto run = [&](int steps, const std::string& load, std::vector<std::string> tags) {
    const std::vector<Status> statuses = RunOnRanks(2, [&](int, comm::Communicator& c) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, c));
      ToyOptions o;
      o.steps = steps;
      testing::ToyResult result;
      ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));
      if (!load.empty()) ZERO_RETURN_IF_ERROR(engine->LoadCheckpoint(root_ + "/" + load));
      for (const std::string& tag : tags) ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(root_, tag));
      return absl::OkStatus();
    });
    ASSERT_THAT(statuses, ::testing::Each(IsOk()));
  };
  run(1, "", {"step-10", "best"});
  run(2, "", {"step-20"});
  run(1, "step-10", {"step-11", "step-12", "step-13"});
  for (const char* gone : {"step-10", "step-11", "step-20"}) EXPECT_FALSE(std::filesystem::exists(root_ + "/" + gone)) << gone;
  for (const char* kept : {"step-12", "step-13", "best"}) EXPECT_TRUE(std::filesystem::exists(root_ + "/" + kept + "/meta.json")) << kept;
  EXPECT_EQ(Latest(root_), "step-13");
}

// Two jobs saving into one root never mix their files: while one saves (it holds the root's
// lock; here the test holds it, as another job would), the other waits, and after
// guard.timeout_s says why instead of writing.
TEST_F(CheckpointSeries, ASecondJobWaitsForTheRootsLockAndSaysWhy) {
  Config config = ToyConfig(2);
  config.guard.timeout_s = 0.5;
  std::filesystem::create_directories(root_);
  const int held = ::open((root_ + "/.zerort-lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  auto save = [&]() { return TrainAndSave(config, "step-1"); };
  const std::vector<Status> refused = save();
  EXPECT_THAT(refused[0], testing::StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("another job")));
  EXPECT_THAT(refused[1], testing::StatusIs(absl::StatusCode::kAborted));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/step-1.partial"));
  ::close(held);  // the other job finished
  EXPECT_THAT(save(), ::testing::Each(IsOk()));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/step-1/meta.json"));
}

// A tag that is a link to another directory saves where it points, beside the link's target:
// that directory is locked for the save too, as any directory saved into is.
TEST_F(CheckpointSeries, ATagLinkedElsewhereSavesUnderItsTargetsLock) {
  Config config = ToyConfig(2);
  config.guard.timeout_s = 0.5;
  const std::string elsewhere = root_ + "-elsewhere";
  std::filesystem::create_directories(elsewhere + "/step-1");
  std::filesystem::create_directories(root_);
  std::filesystem::create_directory_symlink(elsewhere + "/step-1", root_ + "/step-1");
  const int held = ::open((elsewhere + "/.zerort-lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);  // another job saving there
  auto save = [&]() { return TrainAndSave(config, "step-1"); };
  const std::vector<Status> refused = save();
  EXPECT_THAT(refused[0], testing::StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("another job")));
  EXPECT_FALSE(std::filesystem::exists(elsewhere + "/step-1.partial"));
  ::close(held);
  EXPECT_THAT(save(), ::testing::Each(IsOk()));
  EXPECT_TRUE(std::filesystem::is_symlink(root_ + "/step-1"));
  EXPECT_TRUE(std::filesystem::exists(elsewhere + "/step-1/meta.json"));
  EXPECT_EQ(Latest(root_), "step-1");
  std::filesystem::remove_all(elsewhere);
}

// A job holds its series root from its first save into it until its engine goes: a second job
// saving the same tags there would replace its checkpoints between two of its saves. The job's
// own later saves, tagged or into a directory of the root, go on. Here the second job is
// another engine of the same process: it is refused at once (waiting would never end), naming
// the holder; another process waits as ASecondJobWaitsForTheRootsLockAndSaysWhy shows.
TEST_F(CheckpointSeries, AJobHoldsItsSeriesRootUntilItsEngineGoes) {
  Config config = ToyConfig(2);
  config.guard.timeout_s = 60;
  Config other = ToyConfig(2);
  other.guard.timeout_s = 0;  // waits forever for another process: never for its own
  auto train_and_save = [&](const Config& c, comm::Communicator& comm, const char* tag)
      -> StatusOr<std::unique_ptr<Engine>> {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(c, comm));
    ToyOptions o;
    o.steps = 1;
    testing::ToyResult result;
    ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));
    ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(root_, tag));
    return engine;
  };
  auto other_job = [&]() {
    return RunOnRanks(2, [&](int, comm::Communicator& c) -> Status {
      return train_and_save(other, c, "step-1").status();
    });
  };
  std::vector<Status> refused;
  const std::vector<Status> first = RunOnRanks(2, [&](int r, comm::Communicator& c) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, train_and_save(config, c, "step-1"));
    if (r == 0) refused = other_job();  // between two saves of the first job
    ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(root_, "step-2"));
    return engine->SaveCheckpoint(root_ + "/exported");
  });
  EXPECT_THAT(first, ::testing::Each(IsOk()));
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_THAT(refused[0],
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("another engine")));
  EXPECT_THAT(refused[0], testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                            ::testing::HasSubstr(absl::StrCat("pid ", ::getpid()))));
  EXPECT_EQ(Latest(root_), "step-2");
  EXPECT_TRUE(std::filesystem::exists(root_ + "/exported/meta.json"));
  // The first job's engines are gone: the root is free.
  EXPECT_THAT(other_job(), ::testing::Each(IsOk()));
  EXPECT_EQ(Latest(root_), "step-1");
}

}  // namespace
}  // namespace zero
