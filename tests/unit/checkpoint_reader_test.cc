// zero::CheckpointReader: a checkpoint read without an engine gives the same params as an
// engine that loads it, says what it holds, and finds every damaged or missing file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/scratch_dir.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::IsOk;
using testing::RunOnRanks;
using testing::StatusIs;
using testing::ToyConfig;
using testing::ToyOptions;

class CheckpointReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::ScratchDir("zerort-reader");
    params_.assign(4, {});
    // 3 ranks at stage 3, 4 steps: the params every rank's engine holds at the end.
    const std::vector<Status> statuses = RunOnRanks(3, [&](int r, comm::Communicator& c) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(ToyConfig(3), c));
      ToyOptions o;
      o.steps = 4;
      o.save_dir = dir_;
      o.save_after = 3;
      testing::ToyResult result;
      ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, o, &result));
      if (r == 0) params_ = result.final_params;
      return absl::OkStatus();
    });
    ASSERT_THAT(statuses, ::testing::Each(IsOk()));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::vector<std::vector<float>> params_;
};

TEST_F(CheckpointReaderTest, SaysWhatTheCheckpointHoldsAndReadsEachParamWhole) {
  auto reader = CheckpointReader::Open(dir_);
  ASSERT_THAT(reader, IsOk());
  CheckpointReader& r = **reader;
  EXPECT_EQ(r.format(), 4);
  EXPECT_EQ(r.world(), 3);
  EXPECT_EQ(r.stage(), 3);
  EXPECT_EQ(r.step(), 4);
  EXPECT_EQ(r.optimizer(), "adamw");
  EXPECT_EQ(r.moments(), 2);
  ASSERT_EQ(r.params().size(), 4u);
  EXPECT_EQ(r.params()[0].name, "fc1.weight");
  EXPECT_EQ(r.params()[0].shape, (std::vector<int64_t>{37, 13}));
  ASSERT_EQ(r.files().size(), 3u);
  for (const CheckpointReader::File& f : r.files()) {
    EXPECT_THAT(f.status, IsOk()) << f.path;
    EXPECT_GT(f.bytes, 0);
  }
  EXPECT_THAT(r.Verify(), IsOk());
  for (int p = 0; p < 4; ++p) {
    std::vector<float> values(r.params()[p].numel, -1e30f);
    ASSERT_THAT(r.ReadParam(p, values.data()), IsOk());
    EXPECT_EQ(values, params_[p]) << r.params()[p].name;  // the fp32 master is the param
  }
}

TEST_F(CheckpointReaderTest, VerifyNamesEveryDamagedOrMissingFile) {
  const std::string flipped = dir_ + "/rank-1-of-3.bin";
  {
    const auto size = static_cast<std::streamoff>(std::filesystem::file_size(flipped));
    std::fstream file(flipped, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(size - 5);
    file.put('\x55');
  }
  std::filesystem::remove(dir_ + "/rank-2-of-3.bin");
  auto reader = CheckpointReader::Open(dir_);
  ASSERT_THAT(reader, IsOk());  // meta.json is intact
  EXPECT_THAT((*reader)->files()[0].status, IsOk());
  EXPECT_THAT((*reader)->files()[2].status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("missing")));
  EXPECT_THAT((*reader)->Verify(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT((*reader)->files()[1].status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank-1-of-3.bin")));
  EXPECT_THAT((*reader)->files()[0].status, IsOk());
  std::vector<float> values(37 * 13);
  EXPECT_THAT((*reader)->ReadParam(9, values.data()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckpointReader::Open(dir_ + "-none"), Not(IsOk()));
}

// A tied weight is one param with other names (AddParamAlias): the checkpoint records them, and
// the reader gives them with the param. Names already taken, empty ones and late ones are refused.
TEST(CheckpointReaderAliases, AParamsOtherNamesAreRecorded) {
  const std::string dir = testing::ScratchDir("zerort-aliases");
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  auto created = Engine::Create(ToyConfig(2), *(*group)[0]);
  ASSERT_THAT(created, IsOk());
  Engine& engine = **created;
  ASSERT_THAT(engine.RegisterParam({"embed.weight", {7, 3}}), IsOk());
  ASSERT_THAT(engine.RegisterParam({"norm.bias", {3}}), IsOk());
  EXPECT_THAT(engine.AddParamAlias(0, "head.weight"), IsOk());
  EXPECT_THAT(engine.AddParamAlias(0, "lm.head.weight"), IsOk());
  EXPECT_THAT(engine.AddParamAlias(1, "head.weight"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("already")));
  EXPECT_THAT(engine.AddParamAlias(1, "norm.bias"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(engine.AddParamAlias(1, ""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(engine.AddParamAlias(2, "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(engine.Finalize(), IsOk());
  EXPECT_THAT(engine.AddParamAlias(1, "late"), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(engine.SaveCheckpoint(dir), IsOk());
  auto reader = CheckpointReader::Open(dir);
  ASSERT_THAT(reader, IsOk());
  ASSERT_EQ((*reader)->params().size(), 2u);
  EXPECT_EQ((*reader)->params()[0].aliases, (std::vector<std::string>{"head.weight", "lm.head.weight"}));
  EXPECT_TRUE((*reader)->params()[1].aliases.empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zero
