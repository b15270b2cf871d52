// Checkpoints: saved during training, resumed at the same world size and stage (bit-identical
// continuation) and at other world sizes and stages (the same trajectory within float summation
// order), with clear errors for a different model or optimizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "tests/engine/toy_trainer.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::ToyConfig;
using testing::ToyOptions;
using testing::ToyResult;

std::vector<ToyResult> Train(int world, const Config& config, const ToyOptions& options, std::vector<Status>* statuses) {
  auto group = comm::CreateLocalGroup(world);
  std::vector<ToyResult> results(world);
  statuses->assign(world, absl::OkStatus());
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto engine = Engine::Create(config, *(*group)[r]);
      (*statuses)[r] = engine.ok() ? testing::TrainToy(**engine, options, &results[r]) : engine.status();
    });
  }
  for (auto& t : ranks) t.join();
  return results;
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "zerort-ckpt-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    // The uninterrupted run: 20 steps on 2 ranks at stage 2, saved after step 9.
    ToyOptions full;
    full.steps = 20;
    full.save_dir = dir_;
    full.save_after = 9;
    std::vector<Status> statuses;
    full_ = Train(2, ToyConfig(2), full, &statuses)[0];
    for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ToyOptions Resume() const {
    ToyOptions o;
    o.steps = 10;
    o.first_step = 10;
    o.load_dir = dir_;
    return o;
  }

  std::string dir_;
  ToyResult full_;
};

TEST_F(Checkpoint, ResumesBitIdenticallyAtTheSameWorldSizeAndStage) {
  std::vector<Status> statuses;
  const ToyResult resumed = Train(2, ToyConfig(2), Resume(), &statuses)[0];
  for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(resumed.losses, std::vector<double>(full_.losses.begin() + 10, full_.losses.end()));
  EXPECT_EQ(resumed.final_params, full_.final_params);
  EXPECT_EQ(resumed.infos.back().step, full_.infos.back().step);  // the step count came back
}

TEST_F(Checkpoint, ResumesAtAnyWorldSizeAndStage) {
  for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{1, 0}, {3, 1}, {4, 3}, {3, 2}}) {
    std::vector<Status> statuses;
    const ToyResult resumed = Train(world, ToyConfig(stage), Resume(), &statuses)[0];
    for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << "world " << world << " stage " << stage << ": " << s;
    for (size_t i = 0; i < resumed.losses.size(); ++i) {
      EXPECT_NEAR(resumed.losses[i], full_.losses[10 + i], 1e-5 * full_.losses[10 + i])
          << "world " << world << " stage " << stage << " step " << 10 + i;
    }
  }
}

TEST_F(Checkpoint, ADifferentModelOrOptimizerIsAClearError) {
  auto group = comm::CreateLocalGroup(1);
  {
    auto engine = Engine::Create(ToyConfig(2), *(*group)[0]);
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->RegisterParam({"fc1.weight", {37, 14}}).ok());  // 14, not 13
    ASSERT_TRUE((*engine)->Finalize().ok());
    const Status s = (*engine)->LoadCheckpoint(dir_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("fc1.weight"), std::string::npos) << s;
  }
  Config sgd = ToyConfig(2);
  sgd.optimizer.type = OptimizerType::kSgd;
  ToyOptions o = Resume();
  std::vector<Status> statuses;
  Train(1, sgd, o, &statuses);
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(statuses[0].message().find("moment"), std::string::npos) << statuses[0];
  o.load_dir = dir_ + "-missing";
  Train(1, ToyConfig(2), o, &statuses);
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace zero
