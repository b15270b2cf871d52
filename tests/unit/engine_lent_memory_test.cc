// Stage 3 with gathered units in memory the trainer lends (Engine::LendGatheredMemory): the
// same training, bit for bit, as in the engine's own buffers at 1 and 3 ranks with
// prefetching; every lend given back once, never while in use; views into the lent memory;
// and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::RunOnRanks;
using testing::StatusIs;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::TrainOnLocalRanks;

constexpr unsigned char kPoison = 0xFF;  // every float made of these bytes is a NaN

// A trainer's lender: fresh host memory per lend, poisoned when lent and again when given
// back (a read of memory the engine no longer holds, or a gather that did not fill it, shows
// up as NaN in the losses). Fails the test on a unit lent twice or given back unlent.
class TestLender {
 public:
  GatheredMemoryLender Lender() {
    GatheredMemoryLender lender;
    lender.lend = [this](int unit, int64_t bytes) -> StatusOr<void*> {
      std::lock_guard<std::mutex> lock(mutex_);
      if (fail_next_) {
        fail_next_ = false;
        return absl::ResourceExhaustedError("the test's allocator is out of memory");
      }
      EXPECT_EQ(lent_.count(unit), 0u) << "unit " << unit << " lent twice";
      std::vector<unsigned char>& memory = lent_[unit];
      memory.assign(static_cast<size_t>(bytes), kPoison);
      ++lends_;
      return static_cast<void*>(memory.data());
    };
    lender.give_back = [this](int unit) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = lent_.find(unit);
      ASSERT_NE(it, lent_.end()) << "unit " << unit << " given back but not lent";
      std::memset(it->second.data(), kPoison, it->second.size());
      lent_.erase(it);
      ++give_backs_;
    };
    return lender;
  }

  void FailNextLend() { fail_next_ = true; }
  int lends() const { return lends_; }
  int give_backs() const { return give_backs_; }
  // The lent memory of `unit`, or null.
  const unsigned char* Memory(int unit) const {
    auto it = lent_.find(unit);
    return it == lent_.end() ? nullptr : it->second.data();
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<unsigned char>> lent_;  // per unit (one engine per lender)
  int lends_ = 0, give_backs_ = 0;
  bool fail_next_ = false;
};

TEST(EngineLentMemory, StageThreeTrainsBitForBitAsInTheEnginesOwnBuffers) {
  for (int world : {1, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    ToyOptions options;
    options.steps = 8;
    options.skip_unit0_on_odd_steps = false;
    const Config config = ToyConfig(3);
    const std::vector<testing::RankRun> own = TrainOnLocalRanks(world, config, options);

    std::vector<std::unique_ptr<TestLender>> lenders;
    for (int r = 0; r < world; ++r) lenders.push_back(std::make_unique<TestLender>());
    options.after_setup = [&lenders](Engine& engine) {
      return engine.LendGatheredMemory(lenders[engine.rank()]->Lender());
    };
    const std::vector<testing::RankRun> lent = TrainOnLocalRanks(world, config, options);
    ASSERT_EQ(lent.size(), own.size());
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(lent[r].result.losses, own[r].result.losses) << "rank " << r;
      EXPECT_EQ(lent[r].result.final_params, own[r].result.final_params) << "rank " << r;
      for (double loss : lent[r].result.losses) ASSERT_TRUE(std::isfinite(loss));
      // Each gather took lent memory, none of the engine's own, and all of it came back.
      EXPECT_EQ(lent[r].counters.gather_allocations, 0) << "rank " << r;
      EXPECT_GE(lenders[r]->lends(), 2 * options.steps) << "rank " << r;
      EXPECT_EQ(lenders[r]->give_backs(), lenders[r]->lends()) << "rank " << r;
      EXPECT_GT(lent[r].counters.gathers_prefetched, 0) << "prefetching lends too";
      EXPECT_EQ(lent[r].counters.gathers_prefetched, own[r].counters.gathers_prefetched);
    }
  }
}

// One rank, two units of two params each; values set, no training.
struct SmallModel {
  std::unique_ptr<Engine> engine;
  std::vector<ParamId> ids;
  std::vector<std::vector<float>> values;
};

StatusOr<SmallModel> MakeSmallModel(comm::Communicator& comm, int stage) {
  SmallModel m;
  Config config = ToyConfig(stage);
  ZERO_ASSIGN_OR_RETURN(m.engine, Engine::Create(config, comm));
  const std::vector<std::vector<int64_t>> shapes = {{7, 5}, {7}, {3, 7}, {3}};
  for (int p = 0; p < 4; ++p) {
    ZERO_ASSIGN_OR_RETURN(ParamId id, m.engine->RegisterParam({"p" + std::to_string(p), shapes[p], DType::kFP32,
                                                               true, 0, p / 2}));
    m.ids.push_back(id);
  }
  ZERO_RETURN_IF_ERROR(m.engine->Finalize());
  for (int p = 0; p < 4; ++p) {
    int64_t numel = 1;
    for (int64_t d : shapes[p]) numel *= d;
    std::vector<float> v(numel);
    for (int64_t i = 0; i < numel; ++i) v[i] = 0.25f * p + 0.01f * static_cast<float>(i) - 0.3f;
    ZERO_RETURN_IF_ERROR(m.engine->SetParam(m.ids[p], v.data()));
    m.values.push_back(std::move(v));
  }
  return m;
}

TEST(EngineLentMemory, ParamDataViewsTheLentMemoryUntilReleaseGivesItBack) {
  const std::vector<Status> results = RunOnRanks(1, [](int, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(SmallModel m, MakeSmallModel(comm, 3));
    TestLender lender;
    ZERO_RETURN_IF_ERROR(m.engine->LendGatheredMemory(lender.Lender()));
    ZERO_RETURN_IF_ERROR(m.engine->Gather(1));
    EXPECT_EQ(lender.lends(), 1);
    EXPECT_NE(lender.Memory(1), nullptr);
    for (int p = 2; p < 4; ++p) {
      ZERO_ASSIGN_OR_RETURN(GatheredPlace place, m.engine->GatheredPlaceOf(m.ids[p]));
      EXPECT_EQ(place.unit, 1);
      EXPECT_FALSE(place.persistent);
      EXPECT_GE(place.unit_bytes, static_cast<int64_t>((21 + 3) * sizeof(float)));
      ZERO_ASSIGN_OR_RETURN(void* view, m.engine->ParamData(m.ids[p]));
      EXPECT_EQ(view, lender.Memory(1) + place.offset_bytes) << "param " << p;
      EXPECT_EQ(std::memcmp(view, m.values[p].data(), m.values[p].size() * sizeof(float)), 0) << "param " << p;
    }
    ZERO_RETURN_IF_ERROR(m.engine->Release(1));
    EXPECT_EQ(lender.give_backs(), 1);
    EXPECT_EQ(lender.Memory(1), nullptr);
    EXPECT_THAT(m.engine->ParamData(m.ids[2]).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
    // GetParam of a released unit gathers into lent memory for the call and gives it back.
    std::vector<float> out(m.values[0].size());
    ZERO_RETURN_IF_ERROR(m.engine->GetParam(m.ids[0], out.data()));
    EXPECT_EQ(out, m.values[0]);
    EXPECT_EQ(lender.lends(), 2);
    EXPECT_EQ(lender.give_backs(), 2);
    // Stopping the lending: memory lent until then is no longer given back; the engine's
    // own buffers serve the next gathers.
    ZERO_RETURN_IF_ERROR(m.engine->Gather(0));
    ZERO_RETURN_IF_ERROR(m.engine->LendGatheredMemory(GatheredMemoryLender()));
    ZERO_RETURN_IF_ERROR(m.engine->Release(0));
    EXPECT_EQ(lender.give_backs(), 2);
    ZERO_RETURN_IF_ERROR(m.engine->Gather(1));
    ZERO_ASSIGN_OR_RETURN(void* view, m.engine->ParamData(m.ids[2]));
    EXPECT_EQ(std::memcmp(view, m.values[2].data(), m.values[2].size() * sizeof(float)), 0);
    EXPECT_EQ(lender.lends(), 3);
    return m.engine->Release(1);
  });
  EXPECT_THAT(results, ::testing::Each(IsOk()));
}

TEST(EngineLentMemory, ALendThatFailsFailsItsGatherByNameAndTheNextGatherWorks) {
  const std::vector<Status> results = RunOnRanks(1, [](int, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(SmallModel m, MakeSmallModel(comm, 3));
    TestLender lender;
    ZERO_RETURN_IF_ERROR(m.engine->LendGatheredMemory(lender.Lender()));
    lender.FailNextLend();
    const Status failed = m.engine->Gather(0);
    EXPECT_THAT(failed, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("lender gave no memory for unit 0")));
    EXPECT_THAT(failed, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("out of memory")));
    EXPECT_THAT(m.engine->ParamData(m.ids[0]).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
    ZERO_RETURN_IF_ERROR(m.engine->Gather(0));
    ZERO_ASSIGN_OR_RETURN(void* view, m.engine->ParamData(m.ids[1]));
    EXPECT_EQ(std::memcmp(view, m.values[1].data(), m.values[1].size() * sizeof(float)), 0);
    return m.engine->Release(0);
  });
  EXPECT_THAT(results, ::testing::Each(IsOk()));
}

TEST(EngineLentMemory, LendingIsRefusedWhereItCannotApply) {
  const std::vector<Status> results = RunOnRanks(1, [](int, comm::Communicator& comm) -> Status {
    TestLender lender;
    ZERO_ASSIGN_OR_RETURN(SmallModel replicated, MakeSmallModel(comm, 2));
    EXPECT_THAT(replicated.engine->LendGatheredMemory(lender.Lender()),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stage 3")));
    EXPECT_THAT(replicated.engine->GatheredPlaceOf(0).status(), StatusIs(absl::StatusCode::kFailedPrecondition));

    ZERO_ASSIGN_OR_RETURN(SmallModel m, MakeSmallModel(comm, 3));
    GatheredMemoryLender half = lender.Lender();
    half.give_back = nullptr;
    EXPECT_THAT(m.engine->LendGatheredMemory(half), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("both")));
    ZERO_RETURN_IF_ERROR(m.engine->Gather(0));
    EXPECT_THAT(m.engine->LendGatheredMemory(lender.Lender()),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("unit 0 is gathered")));
    EXPECT_THAT(m.engine->GatheredPlaceOf(99).status(), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(lender.lends(), 0);
    return m.engine->Release(0);
  });
  EXPECT_THAT(results, ::testing::Each(IsOk()));
}

}  // namespace
}  // namespace zero
