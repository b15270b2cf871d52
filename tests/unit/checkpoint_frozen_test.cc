// Frozen params in checkpoints (checkpoint.save_frozen): a LoRA-shaped model (a frozen fp32
// base weight and bf16 bias, trainable adapters) saved with its frozen params at one world size
// and stage loads at others with every frozen value back, bit for bit; the reader, consolidate's
// source, returns them; offline resharding keeps them; without the option they stay out.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/scratch_dir.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/checkpoint.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::RunOnRanks;
using testing::StatusIs;

struct Spec {
  const char* name;
  std::vector<int64_t> shape;
  DType dtype;
  bool requires_grad;
};

// base.weight and base.bias frozen (units 0 and 1), the adapters trainable (units 2 and 3).
std::vector<Spec> LoraSpecs(int64_t base_rows = 37) {
  return {{"base.weight", {base_rows, 13}, DType::kFP32, false},
          {"base.bias", {base_rows}, DType::kBF16, false},
          {"lora.a", {4, 13}, DType::kFP32, true},
          {"lora.b", {base_rows, 4}, DType::kFP32, true}};
}

int64_t Numel(const Spec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return n;
}

// Values of every param as SetParam takes them (bf16 as its bits), fresh per seed, never 0.
std::vector<std::vector<char>> RandomValues(const std::vector<Spec>& specs, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
  std::vector<std::vector<char>> values;
  for (const Spec& s : specs) {
    std::vector<char> bytes(static_cast<size_t>(Numel(s)) * DTypeSize(s.dtype));
    for (int64_t i = 0; i < Numel(s); ++i) {
      const float v = uniform(rng) * (i % 2 == 0 ? 1.0f : -1.0f);
      if (s.dtype == DType::kBF16) {
        const uint16_t bits = FloatToBf16(v);
        std::memcpy(bytes.data() + i * 2, &bits, 2);
      } else {
        std::memcpy(bytes.data() + i * 4, &v, 4);
      }
    }
    values.push_back(std::move(bytes));
  }
  return values;
}

Config LoraConfig(int stage, bool save_frozen) {
  Config config;
  config.stage = stage;
  config.stage3.persistence_threshold = 0;  // every unit sharded
  config.checkpoint.save_frozen = save_frozen;
  return config;
}

StatusOr<std::unique_ptr<Engine>> LoraEngine(const Config& config, comm::Communicator& comm,
                                             const std::vector<Spec>& specs) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
  for (size_t p = 0; p < specs.size(); ++p) {
    const int unit = config.stage == 3 ? static_cast<int>(p) : -1;
    ZERO_RETURN_IF_ERROR(
        engine->RegisterParam({specs[p].name, specs[p].shape, specs[p].dtype, specs[p].requires_grad, 0, unit})
            .status());
  }
  ZERO_RETURN_IF_ERROR(engine->Finalize());
  return engine;
}

// Saves `values` from `world` ranks at `stage` into `dir`.
void Save(int world, int stage, bool save_frozen, const std::vector<std::vector<char>>& values,
          const std::string& dir) {
  const std::vector<Status> statuses = RunOnRanks(world, [&](int, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, LoraEngine(LoraConfig(stage, save_frozen), comm, LoraSpecs()));
    for (size_t p = 0; p < values.size(); ++p) ZERO_RETURN_IF_ERROR(engine->SetParam(p, values[p].data()));
    return engine->SaveCheckpoint(dir);
  });
  ASSERT_THAT(statuses, Each(IsOk()));
}

// Loads `dir` on `world` ranks at `stage` into params first set to `before`; every rank's
// values of every param after the load.
std::vector<std::vector<std::vector<char>>> Load(int world, int stage, const std::vector<std::vector<char>>& before,
                                                 const std::string& dir) {
  std::vector<std::vector<std::vector<char>>> after(world, before);
  const std::vector<Status> statuses = RunOnRanks(world, [&](int r, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, LoraEngine(LoraConfig(stage, false), comm, LoraSpecs()));
    for (size_t p = 0; p < before.size(); ++p) ZERO_RETURN_IF_ERROR(engine->SetParam(p, before[p].data()));
    ZERO_RETURN_IF_ERROR(engine->LoadCheckpoint(dir));
    for (size_t p = 0; p < before.size(); ++p) {
      std::fill(after[r][p].begin(), after[r][p].end(), char{0x7f});  // poisoned
      ZERO_RETURN_IF_ERROR(engine->GetParam(p, after[r][p].data()));
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
  return after;
}

class CheckpointFrozen : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::ScratchDir("zerort-ckpt-frozen"); }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(dir_ + "-resharded");
  }
  std::string dir_;
};

TEST_F(CheckpointFrozen, SavedWithSaveFrozenTheyLoadAtAnyWorldSizeAndStage) {
  const std::vector<std::vector<char>> saved = RandomValues(LoraSpecs(), 1);
  const std::vector<std::vector<char>> other = RandomValues(LoraSpecs(), 2);
  for (const auto& [save_world, save_stage] : std::vector<std::pair<int, int>>{{3, 3}, {2, 1}, {1, 0}}) {
    std::filesystem::remove_all(dir_);
    Save(save_world, save_stage, /*save_frozen=*/true, saved, dir_);
    for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{2, 3}, {3, 2}, {1, 0}, {4, 1}}) {
      const auto after = Load(world, stage, other, dir_);
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(after[r], saved) << "saved on " << save_world << " ranks at stage " << save_stage << ", loaded on "
                                   << world << " at stage " << stage << ", rank " << r;
      }
    }
  }
}

TEST_F(CheckpointFrozen, WithoutTheOptionTheyStayOutAndLoadingLeavesThem) {
  const std::vector<std::vector<char>> saved = RandomValues(LoraSpecs(), 3);
  const std::vector<std::vector<char>> other = RandomValues(LoraSpecs(), 4);
  Save(3, 3, /*save_frozen=*/false, saved, dir_);
  const auto after = Load(2, 3, other, dir_);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(after[r][0], other[0]);  // frozen: as they were
    EXPECT_EQ(after[r][1], other[1]);
    EXPECT_EQ(after[r][2], saved[2]);  // trainable: loaded
    EXPECT_EQ(after[r][3], saved[3]);
  }
  StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_);
  ASSERT_THAT(reader.status(), IsOk());
  EXPECT_EQ((*reader)->format(), 4);
  EXPECT_FALSE((*reader)->params()[0].saved);
  std::vector<float> out(37 * 13);
  EXPECT_THAT((*reader)->ReadParam(0, out.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("checkpoint.save_frozen")));
}

TEST_F(CheckpointFrozen, TheReaderAndReshardingGiveThemBack) {
  const std::vector<std::vector<char>> saved = RandomValues(LoraSpecs(), 5);
  Save(3, 3, /*save_frozen=*/true, saved, dir_);
  StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir_);
  ASSERT_THAT(reader.status(), IsOk());
  ASSERT_THAT((*reader)->Verify(), IsOk());
  EXPECT_EQ((*reader)->format(), 5) << "readers of formats up to 4 must refuse weights-only records";
  const CheckpointReader::Param& bias = (*reader)->params()[1];
  EXPECT_TRUE(bias.saved);
  EXPECT_FALSE(bias.requires_grad);
  std::vector<float> values(37, -7.0f);
  ASSERT_THAT((*reader)->ReadParam(1, values.data()), IsOk());
  for (int i = 0; i < 37; ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, saved[1].data() + i * 2, 2);
    EXPECT_EQ(values[i], Bf16ToFloat(bits)) << i;
  }
  const std::string resharded = dir_ + "-resharded";
  ASSERT_THAT(ReshardCheckpoint(dir_, 2, resharded), IsOk());
  const auto after = Load(2, 2, RandomValues(LoraSpecs(), 6), resharded);
  EXPECT_EQ(after[0], saved);
  EXPECT_EQ(after[1], saved);
}

TEST_F(CheckpointFrozen, ASavedFrozenParamOfAnotherShapeIsAnErrorAndOneNotRegisteredIsSkipped) {
  Save(2, 2, /*save_frozen=*/true, RandomValues(LoraSpecs(), 7), dir_);
  std::vector<Spec> wider = LoraSpecs();
  wider[0].shape = {37, 14};
  std::vector<Status> statuses = RunOnRanks(2, [&](int, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, LoraEngine(LoraConfig(2, false), comm, wider));
    return engine->LoadCheckpoint(dir_);
  });
  EXPECT_THAT(statuses, Each(StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("frozen param 0 \"base.weight\" with shape [37, 13]"))));
  std::vector<Spec> adapters_only = LoraSpecs();
  adapters_only.erase(adapters_only.begin(), adapters_only.begin() + 2);
  statuses = RunOnRanks(2, [&](int, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, LoraEngine(LoraConfig(2, false), comm, adapters_only));
    return engine->LoadCheckpoint(dir_);
  });
  EXPECT_THAT(statuses, Each(IsOk()));
}

}  // namespace
}  // namespace zero
