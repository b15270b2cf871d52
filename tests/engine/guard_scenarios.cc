// The guard scenarios. The model: four params registered in this order, each its own bucket:
//   embed.weight [16, 4], block.weight [8, 8], branch.weight [4, 16], head.bias [5].
// Rank r's gradient element i of param p is a fixed value g(r, p, i); SGD with lr 0.1 makes the
// expected result after one step w0 − 0.1 · mean over ranks of what each rank contributed.
#include "tests/engine/guard_scenarios.h"

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "zero/engine.h"

namespace zero::testing {
namespace {

enum Param { kEmbed = 0, kBlock = 1, kBranch = 2, kHead = 3 };
const char* const kNames[] = {"embed.weight", "block.weight", "branch.weight", "head.bias"};
const std::vector<int64_t> kShapes[] = {{16, 4}, {8, 8}, {4, 16}, {5}};
constexpr float kLr = 0.1f;

int64_t Numel(int p) {
  int64_t n = 1;
  for (int64_t d : kShapes[p]) n *= d;
  return n;
}
float Initial(int p, int64_t i) { return 0.5f + 0.01f * static_cast<float>(i) - 0.1f * p; }
float Grad(int rank, int p, int64_t i) { return 0.01f * static_cast<float>((rank + 1) * (i % 7 + 1) + p); }
std::vector<float> Scaled(int rank, int p, float factor) {
  std::vector<float> g(Numel(p));
  for (int64_t i = 0; i < Numel(p); ++i) g[i] = factor * Grad(rank, p, i);
  return g;
}

// The config every scenario starts from, at `stage` (2 or 3).
Config BaseConfig(int stage) {
  Config c;
  c.stage = stage;
  c.optimizer.type = OptimizerType::kSgd;
  c.optimizer.lr = kLr;
  c.optimizer.weight_decay = 0.0f;
  c.buckets.first_bucket_elems = 80;
  c.buckets.reduce_bucket_elems = 100;
  c.guard.timeout_s = 3.0;  // waits that must succeed stay far from it on a loaded machine
  return c;
}

Status Expect(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

Status ExpectError(const Status& s, absl::StatusCode code, const std::vector<std::string>& fragments,
                   const std::string& where) {
  if (s.code() != code) {
    return absl::InternalError(absl::StrCat(where, ": expected ", absl::StatusCodeToString(code), ", got ", s.ToString()));
  }
  for (const std::string& f : fragments) {
    if (s.message().find(f) == std::string::npos) {
      return absl::InternalError(absl::StrCat(where, ": message lacks \"", f, "\": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// A rank's engine with the model registered (in swapped order if asked) and initialised.
StatusOr<std::unique_ptr<Engine>> MakeEngine(comm::Communicator& comm, const Config& config,
                                             bool swapped = false) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
  const int order[2][4] = {{0, 1, 2, 3}, {0, 2, 1, 3}};
  for (int p : order[swapped ? 1 : 0]) ZERO_RETURN_IF_ERROR(engine->RegisterParam({kNames[p], kShapes[p]}).status());
  ZERO_RETURN_IF_ERROR(engine->Finalize());
  for (int p = 0; p < 4; ++p) {
    std::vector<float> init(Numel(p));
    for (int64_t i = 0; i < Numel(p); ++i) init[i] = Initial(p, i);
    ZERO_RETURN_IF_ERROR(engine->SetParam(p, init.data()));
  }
  return engine;
}

// One micro-batch in backward order; `contributions[p]` lists the factors of each arrival of
// param p (empty: the param gets no gradient on this rank).
Status Backward(Engine& e, int rank, const std::vector<std::vector<float>>& contributions) {
  ZERO_RETURN_IF_ERROR(e.BeginIteration());
  for (int p = 3; p >= 0; --p) {
    for (float factor : contributions[p]) ZERO_RETURN_IF_ERROR(e.AccumulateGrad(p, Scaled(rank, p, factor).data()));
  }
  return e.EndBackward();
}

// Checks param p against w0 − lr · (1/world) Σ_r contribution(r)·g(r, p, ·).
Status ExpectSgdResult(Engine& e, int p, const std::function<double(int rank)>& contribution) {
  std::vector<float> got(Numel(p));
  ZERO_RETURN_IF_ERROR(e.GetParam(p, got.data()));
  for (int64_t i = 0; i < Numel(p); ++i) {
    double mean = 0;
    for (int r = 0; r < e.world_size(); ++r) mean += contribution(r) * Grad(r, p, i);
    mean /= e.world_size();
    const double want = Initial(p, i) - kLr * mean;
    if (std::fabs(got[i] - want) > 1e-6) {
      return absl::InternalError(absl::StrCat(kNames[p], "[", i, "] = ", got[i], ", expected ", want));
    }
  }
  return absl::OkStatus();
}

const std::vector<float> kOnce = {1.0f};
const std::vector<float> kSplit = {0.3f, 0.7f};  // one gradient arriving in two parts

Status ReentrantCheckpointing(comm::Communicator& comm, int stage) {
  const int rank = comm.rank();
  {  // Default policy: the second arrival is refused with the param, the cause and the fix.
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(comm, BaseConfig(stage)));
    ZERO_RETURN_IF_ERROR(e->BeginIteration());
    ZERO_RETURN_IF_ERROR(e->AccumulateGrad(kHead, Scaled(rank, kHead, 1).data()));
    ZERO_RETURN_IF_ERROR(e->AccumulateGrad(kBranch, Scaled(rank, kBranch, 1).data()));
    ZERO_RETURN_IF_ERROR(e->AccumulateGrad(kBlock, Scaled(rank, kBlock, 0.3f).data()));
    const Status second = e->AccumulateGrad(kBlock, Scaled(rank, kBlock, 0.7f).data());
    if (!IsDuplicateGradient(second)) return absl::InternalError(absl::StrCat("expected DuplicateGradient, got ", second.ToString()));
    ZERO_RETURN_IF_ERROR(ExpectError(second, absl::StatusCode::kAlreadyExists,
                                     {"\"block.weight\" (index 1)", "reentrant", "on_duplicate"}, "duplicate"));
    // Nothing was corrupted: finish the iteration; block.weight took the first part only.
    ZERO_RETURN_IF_ERROR(e->AccumulateGrad(kEmbed, Scaled(rank, kEmbed, 1).data()));
    ZERO_RETURN_IF_ERROR(e->EndBackward());
    ZERO_RETURN_IF_ERROR(e->Step().status());
    ZERO_RETURN_IF_ERROR(ExpectSgdResult(*e, kBlock, [](int) { return 0.3; }));
  }
  // on_duplicate = "count": both parts are summed before the reduction, every iteration.
  Config config = BaseConfig(stage);
  config.guard.on_duplicate = DuplicatePolicy::kCount;
  ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(comm, config));
  for (int iteration = 0; iteration < 2; ++iteration) {
    ZERO_RETURN_IF_ERROR(Backward(*e, rank, {kOnce, kSplit, kOnce, kOnce}));
    ZERO_RETURN_IF_ERROR(e->Step().status());
  }
  ZERO_RETURN_IF_ERROR(ExpectSgdResult(*e, kBlock, [](int) { return 2.0; }));  // two steps of 0.3 + 0.7
  // A later iteration with a different number of arrivals is "the graph changed".
  const Status changed = Backward(*e, rank, {kOnce, kOnce, kOnce, kOnce});
  return ExpectError(changed, absl::StatusCode::kFailedPrecondition, {"graph changed", "block.weight"}, "count");
}

Status TiedEmbedding(comm::Communicator& comm, int stage) {
  const int rank = comm.rank();
  // The embedding matrix is used by the input lookup and, tied, by the output projection:
  // its gradient arrives twice.
  {
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(comm, BaseConfig(stage)));
    const Status twice = Backward(*e, rank, {{0.5f, 0.5f}, kOnce, kOnce, kOnce});
    ZERO_RETURN_IF_ERROR(ExpectError(twice, absl::StatusCode::kAlreadyExists, {"\"embed.weight\"", "used twice"}, "tied"));
    if (!IsDuplicateGradient(twice)) return absl::InternalError("not a DuplicateGradient");
    ZERO_RETURN_IF_ERROR(e->EndBackward());  // the engine is still usable
  }
  Config config = BaseConfig(stage);
  config.guard.on_duplicate = DuplicatePolicy::kCount;
  ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(comm, config));
  ZERO_RETURN_IF_ERROR(Backward(*e, rank, {{0.25f, 0.75f}, kOnce, kOnce, kOnce}));
  ZERO_RETURN_IF_ERROR(e->Step().status());
  return ExpectSgdResult(*e, kEmbed, [](int) { return 1.0; });
}

Status BranchUnusedOnOneRank(comm::Communicator& comm, int stage) {
  const int rank = comm.rank(), last = comm.size() - 1;
  const std::vector<float> branch = rank == last ? std::vector<float>{} : kOnce;
  // on_unused = "zero": ranks that skipped a param contribute zeros; nobody hangs — also when
  // different ranks skip different params (the last skips the branch, rank 0 the block).
  Config config = BaseConfig(stage);
  config.guard.on_unused = UnusedPolicy::kZero;
  {
    ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(comm, config));
    const std::vector<float> block = rank == 0 ? std::vector<float>{} : kOnce;
    ZERO_RETURN_IF_ERROR(Backward(*e, rank, {kOnce, block, branch, kOnce}));
    ZERO_RETURN_IF_ERROR(e->Step().status());
    ZERO_RETURN_IF_ERROR(ExpectSgdResult(*e, kBranch, [last](int r) { return r == last ? 0.0 : 1.0; }));
    ZERO_RETURN_IF_ERROR(ExpectSgdResult(*e, kBlock, [](int r) { return r == 0 ? 0.0 : 1.0; }));
    ZERO_RETURN_IF_ERROR(ExpectSgdResult(*e, kHead, [](int) { return 1.0; }));
  }
  // The default: the rank that skipped it is told which param and how to fix it; the others
  // are not left hanging: their wait ends with DeadlineExceeded naming the bucket's param.
  ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(comm, BaseConfig(stage)));
  const Status status = Backward(*e, rank, {kOnce, kOnce, branch, kOnce});
  if (rank == last) {
    if (!IsUnusedParameters(status)) return absl::InternalError(absl::StrCat("expected UnusedParameters, got ", status.ToString()));
    return ExpectError(status, absl::StatusCode::kFailedPrecondition,
                       {"\"branch.weight\" (index 2)", "on_unused = \"zero\""}, "unused");
  }
  return ExpectError(status, absl::StatusCode::kDeadlineExceeded, {"branch.weight"}, "peer of unused");
}

Status ParamNoRankUsed(comm::Communicator& comm, int stage) {
  Config config = BaseConfig(stage);
  config.optimizer.type = OptimizerType::kAdamW;
  config.optimizer.weight_decay = 0.1f;
  config.guard.on_unused = UnusedPolicy::kZero;
  ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(comm, config));
  ZERO_RETURN_IF_ERROR(Backward(*e, comm.rank(), {kOnce, kOnce, {}, kOnce}));
  ZERO_RETURN_IF_ERROR(e->Step().status());
  std::vector<float> branch(Numel(kBranch)), block(Numel(kBlock));
  ZERO_RETURN_IF_ERROR(e->GetParam(kBranch, branch.data()));
  ZERO_RETURN_IF_ERROR(e->GetParam(kBlock, block.data()));
  for (int64_t i = 0; i < Numel(kBranch); ++i) {
    ZERO_RETURN_IF_ERROR(Expect(branch[i] == Initial(kBranch, i), "a param no rank used was changed (decay or moments)"));
  }
  ZERO_RETURN_IF_ERROR(Expect(block[0] != Initial(kBlock, 0), "a used param was not stepped"));
  // Its optimizer state must be untouched too: with SGD momentum (no dampening) a step that
  // skips the param and then one that uses it must equal that one step alone.
  // One bucket, so that the state next to the param's belongs to other params, not padding.
  Config sgd = BaseConfig(stage);
  sgd.optimizer.momentum = 0.9f;
  sgd.guard.on_unused = UnusedPolicy::kZero;
  sgd.buckets.first_bucket_elems = sgd.buckets.reduce_bucket_elems = 1000;
  ZERO_ASSIGN_OR_RETURN(auto m, MakeEngine(comm, sgd));
  ZERO_RETURN_IF_ERROR(Backward(*m, comm.rank(), {kOnce, kOnce, {}, kOnce}));
  ZERO_RETURN_IF_ERROR(m->Step().status());
  ZERO_RETURN_IF_ERROR(Backward(*m, comm.rank(), {kOnce, kOnce, kOnce, kOnce}));
  ZERO_RETURN_IF_ERROR(m->Step().status());
  return ExpectSgdResult(*m, kBranch, [](int) { return 1.0; });
}

Status RankSkipsEndBackward(comm::Communicator& comm, int stage) {
  const int rank = comm.rank(), last = comm.size() - 1;
  ZERO_ASSIGN_OR_RETURN(auto e, MakeEngine(comm, BaseConfig(stage)));
  if (rank == last) {  // begins an iteration, skips its backward, begins the next
    ZERO_RETURN_IF_ERROR(e->BeginIteration());
    return ExpectError(e->BeginIteration(), absl::StatusCode::kFailedPrecondition,
                       {"EndBackward() was not called", "\"head.bias\""}, "skipped EndBackward");
  }
  const Status status = Backward(*e, rank, {kOnce, kOnce, kOnce, kOnce});
  return ExpectError(status, absl::StatusCode::kDeadlineExceeded, {"bucket 0", "head.bias"}, "peer of skipper");
}

Status DifferentRegistrationOrder(comm::Communicator& comm, int stage) {
  if (comm.size() == 1) return absl::OkStatus();  // nothing to disagree with
  const bool swapped = comm.rank() == comm.size() - 1;
  const Status status = MakeEngine(comm, BaseConfig(stage), swapped).status();
  return ExpectError(status, absl::StatusCode::kInvalidArgument,
                     {"registered different params", "param index 1", swapped ? "\"branch.weight\"" : "\"block.weight\""},
                     "registration order");
}

// A rank configured with other bucket sizes would reduce unrelated data (or, where the sizes
// happen to match, other params): Finalize compares the config values that shape the
// collectives and names the key and both sides, before any bucket's collective. At stage 3 a
// bucket is a unit, whatever the caps: the ranks agree, and train.
Status DivergedBucketLayout(comm::Communicator& comm, int stage) {
  Config config = BaseConfig(stage);
  const bool odd = comm.rank() == comm.size() - 1 && comm.size() > 1;
  if (odd) config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = 1000;
  StatusOr<std::unique_ptr<Engine>> e = MakeEngine(comm, config);
  if (comm.size() == 1 || stage == 3) {  // nothing to disagree with: training proceeds
    ZERO_RETURN_IF_ERROR(e.status());
    return Backward(**e, comm.rank(), {kOnce, kOnce, kOnce, kOnce});
  }
  return ExpectError(e.status(), absl::StatusCode::kInvalidArgument,
                     {"config key buckets.reduce_bucket_elems", odd ? "this is rank" : "has 1000"}, "divergence");
}

}  // namespace

std::vector<GuardScenario> GuardScenarios() {
  const std::vector<std::pair<std::string, Status (*)(comm::Communicator&, int)>> scenarios = {
      {"ReentrantCheckpointing", ReentrantCheckpointing},
      {"TiedEmbedding", TiedEmbedding},
      {"BranchUnusedOnOneRank", BranchUnusedOnOneRank},
      {"ParamNoRankUsed", ParamNoRankUsed},
      {"RankSkipsEndBackward", RankSkipsEndBackward},
      {"DifferentRegistrationOrder", DifferentRegistrationOrder},
      {"DivergedBucketLayout", DivergedBucketLayout}};
  std::vector<GuardScenario> out;
  for (const auto& [name, run] : scenarios) out.push_back({name, run});
  return out;
}

}  // namespace zero::testing
