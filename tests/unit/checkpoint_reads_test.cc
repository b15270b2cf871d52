// Loading reads only what a rank owns: every rank file starts with an index, and a loading
// rank reads the records that overlap its shard. Measured in bytes per rank when a 4-rank
// checkpoint loads at 4, 2 and 1 ranks. A rank that cannot read its part makes every rank
// fail, and no rank loads anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/scratch_dir.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::IsOk;
using testing::RegisterToyModel;
using testing::RunOnRanks;
using testing::StatusIs;
using testing::ToyConfig;
using testing::ToyOptions;

ToyOptions Model() {
  ToyOptions o;
  o.hidden = 301;  // about 5.7k params: the indexes are small next to the payload
  return o;
}

class CheckpointReads : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::ScratchDir("zerort-reads");
    ToyOptions o = Model();
    o.steps = 3;
    o.save_dir = dir_;
    o.save_after = 2;
    ASSERT_THAT(RunOnRanks(4, [&](int, comm::Communicator& c) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(ToyConfig(2), c));
      testing::ToyResult result;
      return testing::TrainToy(*engine, o, &result);
    }), ::testing::Each(IsOk()));
    for (int r = 0; r < 4; ++r) {
      total_ += static_cast<int64_t>(std::filesystem::file_size(dir_ + "/rank-" + std::to_string(r) + "-of-4.bin"));
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Loads the checkpoint on `world` ranks at `stage`: each rank's bytes read and status; the
  // params each rank holds before and after.
  std::vector<int64_t> Load(int world, int stage, std::vector<Status>* statuses,
                            std::vector<char>* unchanged = nullptr) {
    std::vector<int64_t> bytes(world, -1);
    if (unchanged != nullptr) unchanged->assign(world, 0);
    *statuses = RunOnRanks(world, [&](int r, comm::Communicator& c) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(ToyConfig(stage), c));
      ZERO_ASSIGN_OR_RETURN(std::vector<ParamId> ids, RegisterToyModel(*engine, Model()));
      std::vector<float> before(13 * 301, 0.5f), after(13 * 301);
      ZERO_RETURN_IF_ERROR(engine->SetParam(ids[0], before.data()));
      const Status loaded = engine->LoadCheckpoint(dir_);
      bytes[r] = engine->counters().checkpoint_bytes_read;
      ZERO_RETURN_IF_ERROR(engine->GetParam(ids[0], after.data()));
      if (unchanged != nullptr) (*unchanged)[r] = after == before ? 1 : 0;
      return loaded;
    });
    return bytes;
  }

  std::string dir_;
  int64_t total_ = 0;  // bytes of the four rank files
};

TEST_F(CheckpointReads, EachRankReadsAboutItsShare) {
  for (const int world : {4, 2, 1}) {
    std::vector<Status> statuses;
    const std::vector<int64_t> bytes = Load(world, 2, &statuses);
    ASSERT_THAT(statuses, ::testing::Each(IsOk()));
    const int64_t sum = std::accumulate(bytes.begin(), bytes.end(), int64_t{0});
    std::string line;
    for (int r = 0; r < world; ++r) {
      line += " " + std::to_string(bytes[r]);
      // A rank's share of the records, plus the others' indexes, plus the records cut by
      // the new shard boundaries: well below what the next larger share would read.
      EXPECT_LT(bytes[r], total_ * 1.25 / world + 4 * 1024) << "world " << world << " rank " << r;
    }
    // Records read twice are only those straddling a boundary of the new shards.
    EXPECT_LE(sum, total_ * 1.1 + world * 4 * 1024) << "world " << world;
    if (world == 1) {  // everything once, and each file's magic and record count twice
      EXPECT_EQ(bytes[0], total_ + 4 * 16);
    }
    std::printf("4-rank checkpoint of %lld bytes loaded at %d ranks: bytes read per rank%s\n",
                static_cast<long long>(total_), world, line.c_str());
    RecordProperty("bytes_read_at_" + std::to_string(world), line);
  }
}

TEST_F(CheckpointReads, ARankThatCannotReadItsPartFailsEveryRankAndNoneLoads) {
  // Damage the last record of rank 3's file: at 4 ranks only rank 3 reads it.
  const std::string victim = dir_ + "/rank-3-of-4.bin";
  const auto size = static_cast<std::streamoff>(std::filesystem::file_size(victim));
  std::fstream file(victim, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(size - 3);
  file.put('\x7f');
  file.close();
  std::vector<Status> statuses;
  std::vector<char> unchanged;  // not vector<bool>: ranks write it concurrently
  Load(4, 2, &statuses, &unchanged);
  EXPECT_THAT(statuses[3], StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("rank-3-of-4.bin")));
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(statuses[r], StatusIs(absl::StatusCode::kAborted, ::testing::HasSubstr("rank 3")));
  }
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(unchanged[r]) << "rank " << r << " loaded part of the checkpoint";
}

}  // namespace
}  // namespace zero
