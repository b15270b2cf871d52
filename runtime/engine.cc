// Engine creation, registration, Finalize and parameter access.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/env.h"
#include "runtime/engine_impl.h"

namespace zero {
namespace {

// "batch": train_batch_size = micro_batch_size_per_rank × gradient_accumulation_steps × world
// (as DeepSpeed asserts); without the micro-batch size, train_batch_size must divide evenly.
// Computed in double: the factors' product can exceed int64 (every factor is at most 1e15).
Status CheckBatchSizes(const Config& config, int world) {
  const BatchConfig& batch = config.batch;
  if (batch.train_batch_size == 0) return absl::OkStatus();
  const double per_micro_batch = static_cast<double>(config.gradient_accumulation_steps) * world;
  const std::string factors = absl::StrCat("gradient_accumulation_steps ", config.gradient_accumulation_steps,
                                           " × world size ", world);
  if (batch.micro_batch_size_per_rank > 0) {
    const double product = batch.micro_batch_size_per_rank * per_micro_batch;
    if (product != static_cast<double>(batch.train_batch_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: train_batch_size ", batch.train_batch_size, " is not micro_batch_size_per_rank ",
          batch.micro_batch_size_per_rank, " × ", factors, " = ", product,
          "; fix one of them (or leave train_batch_size out: it is derived)"));
    }
  } else if (std::fmod(static_cast<double>(batch.train_batch_size), per_micro_batch) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config: train_batch_size ", batch.train_batch_size,
                                                   " is not a multiple of ", factors,
                                                   ": no whole micro-batch per rank gives it"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Config& config,
                                                 comm::Communicator& communicator) {
  return runtime::CreateEngine(config, communicator, runtime::DeviceOps::Create);
}

namespace runtime {

StatusOr<std::unique_ptr<Engine>> CreateEngine(const Config& config, comm::Communicator& communicator,
                                               const OpsFactory& make_ops) {
  ZERO_RETURN_IF_ERROR(config.Validate());
  if (!config.precision.master_weights) {
    return absl::UnimplementedError("precision.master_weights = false is not implemented");
  }
  if (config.precision.reduce != config.precision.grad) {
    return absl::UnimplementedError(absl::StrCat(
        "precision.reduce (", DTypeName(config.precision.reduce), ") must equal precision.grad (",
        DTypeName(config.precision.grad), "): reducing in another dtype is not implemented"));
  }
  ZERO_RETURN_IF_ERROR(CheckBatchSizes(config, communicator.size()));
  ZERO_ASSIGN_OR_RETURN(base::EnvTunables env, base::ReadEnvTunables());
  base::Logger logger(env.log_level, communicator.rank());
  for (const std::string& note : config.notes) ZERO_LOG(logger, kInfo) << "config: " << note;
  base::Allocator allocator;
  // Once an MPI collective was abandoned it may still write into the engine's buffers: from
  // then on they are kept, not freed (during the engine's life and when it is destroyed).
  allocator.KeepAllocationsWhen([&communicator] { return communicator.AbandonedWorkMayTouchBuffers(); });
  const kernels::CpuExec exec = kernels::CpuExecFromEnv(env, communicator.ranks_on_this_host());
  if (config.device == Device::kCpu) {
    ZERO_LOG(logger, kInfo) << "CPU kernels: " << base::CpuIsaName(exec.isa) << ", " << exec.threads
                            << " thread(s) per rank, " << communicator.ranks_on_this_host()
                            << " rank(s) on this host (ZERO_CPU_THREADS sets the count)";
  }
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<DeviceOps> ops, make_ops(config.device, exec, allocator));
  return std::unique_ptr<Engine>(new EngineImpl(config, communicator, logger, allocator, std::move(ops)));
}

EngineImpl::EngineImpl(const Config& config, comm::Communicator& comm, base::Logger logger,
                       base::Allocator allocator, std::unique_ptr<DeviceOps> ops)
    : config_(config), comm_(comm), logger_(logger), allocator_(allocator), ops_(std::move(ops)),
      path_(comm, *ops_, config.guard.timeout_s), host_(path_, *ops_, allocator), loss_scaler_(config.loss_scale) {}

EngineImpl::~EngineImpl() {
  if (comm_.Health().ok() && scheduler_ != nullptr && scheduler_->in_flight() > 0) {
    const Status drained = scheduler_->WaitAll(config_.guard.timeout_s);
    if (!drained.ok()) {
      ZERO_LOG(logger_, kWarn) << "destroying the engine: " << drained.message();
    }
  }
  if (comm_.Health().ok() && params_ != nullptr) {  // stage 3 all-gathers
    const Status drained = params_->WaitForCollectives();
    if (!drained.ok()) {
      ZERO_LOG(logger_, kWarn) << "destroying the engine: " << drained.message();
    }
  }
  if (comm_.Health().ok() && path_.kept() > 0) {  // collectives only the stream waited for
    const Status drained = path_.Drain();
    if (!drained.ok()) {
      ZERO_LOG(logger_, kWarn) << "destroying the engine: " << drained.message();
    }
  }
  // Memory a trainer lent stays its own: nothing is given back from here (no call into the
  // trainer while the engine is being destroyed).
  if (params_ != nullptr) params_->ForgetLender();
  // Whatever is still in flight is abandoned now, before any buffer is freed.
  scheduler_.reset();
  params_.reset();
  if (comm_.AbandonedWorkMayTouchBuffers()) {  // the allocator keeps them (see Create)
    ZERO_LOG(logger_, kWarn) << "destroying the engine after its " << comm_.backend()
                             << " communicator broke: its " << allocator_.Stats().total_current
                             << " bytes stay allocated, because collectives that cannot be cancelled "
                                "may still use them";
  }
}

Status EngineImpl::RequireHealthyGroup(const char* call) const {
  const Status health = comm_.Health();
  if (health.ok()) return absl::OkStatus();
  return Status(health.code(), absl::StrCat(
      call, ": the communicator group is broken (", health.message(), "). This engine may now "
      "differ from its peers, so it refuses to go on: restart the job and resume from the last "
      "checkpoint"));
}

Status EngineImpl::RequireFinishableIteration(const char* call) const {
  if (lost_iteration_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      call, ": iteration ", iteration_, " failed where it could no longer finish (", lost_iteration_.message(),
      "), so no iteration can follow on this engine: destroy it and resume from the last checkpoint in a new "
      "one, after changing what that message names"));
}

Status EngineImpl::LoseIteration(Status cause) {
  if (lost_iteration_.ok()) lost_iteration_ = cause;
  return cause;
}

Status EngineImpl::SetStream(void* cuda_stream) {
  if (phase_ == Phase::kBackward) return RequirePhase(Phase::kIdle, "SetStream");
  return ops_->SetStream(cuda_stream);
}

Status EngineImpl::RequirePhase(Phase wanted, const char* call) const {
  if (phase_ == wanted) return absl::OkStatus();
  auto name = [](Phase p) {
    switch (p) {
      case Phase::kRegistering: return "before Finalize()";
      case Phase::kIdle: return "between iterations";
      case Phase::kBackward: return "inside an iteration (after BeginIteration, before EndBackward)";
    }
    return "?";
  };
  return absl::FailedPreconditionError(absl::StrCat(call, " must be called ", name(wanted),
                                                    "; the engine is ", name(phase_)));
}

Status EngineImpl::CheckParamId(ParamId id, const char* call) const {
  if (id >= 0 && id < num_params()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(call, ": param id ", id, " does not exist (",
                                                 num_params(), " params registered)"));
}

StatusOr<ParamId> EngineImpl::RegisterParam(const ParamSpec& spec) {
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kRegistering, "RegisterParam"));
  if (spec.name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("RegisterParam: param ", specs_.size(),
                                                   " has an empty name; every param needs a unique name"));
  }
  ZERO_RETURN_IF_ERROR(CheckMetaText(spec.name, absl::StrCat("RegisterParam: the name of param ", specs_.size())));
  if (spec.shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": shape is empty"));
  }
  // At most 2^40 elements (a checkpoint's bound on a size), so that no product wraps around.
  constexpr int64_t kMaxParamElems = int64_t{1} << 40;
  int64_t numel = 1;
  for (int64_t d : spec.shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": dimension ", d,
                                                     " is not ≥ 1"));
    }
    if (d > kMaxParamElems / numel) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": shape [",
                                                     absl::StrJoin(spec.shape, ", "),
                                                     "] has more than 2^40 elements, the most a param may have"));
    }
    numel *= d;
  }
  if (spec.group < 0 || spec.group >= kMaxOptimizerGroups) {
    return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": group ", spec.group,
                                                   " is not in [0, ", kMaxOptimizerGroups, ")"));
  }
  if (spec.unit < -1) {
    return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": unit ", spec.unit,
                                                   " is not a unit (-1 for none, or a number >= 0)"));
  }
  if (!IsFloatingPoint(spec.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": dtype ", DTypeName(spec.dtype),
                                                   " is not a param dtype (fp32, bf16 or fp16)"));
  }
  if (spec.requires_grad) {  // the gradient dtype the plan will give it (config.h, precision.grad)
    if (Status s = partition::GradientDType(spec.dtype, config_.precision.grad).status(); !s.ok()) {
      return Status(s.code(), absl::StrCat("param \"", spec.name, "\" (", DTypeName(spec.dtype), "): ", s.message()));
    }
  }
  if (!registered_names_.insert(spec.name).second) {
    return absl::InvalidArgumentError(absl::StrCat("param name \"", spec.name, "\" is already registered"));
  }
  specs_.push_back(spec);
  aliases_.emplace_back();
  return static_cast<ParamId>(specs_.size() - 1);
}

Status EngineImpl::AddParamAlias(ParamId id, const std::string& alias) {
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kRegistering, "AddParamAlias"));
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "AddParamAlias"));
  const std::string& name = specs_[id].name;
  if (alias.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("AddParamAlias: an empty alias for \"", name, "\""));
  }
  ZERO_RETURN_IF_ERROR(CheckMetaText(alias, absl::StrCat("AddParamAlias: an alias of \"", name, "\"")));
  if (!registered_names_.insert(alias).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("AddParamAlias: \"", alias, "\" (an alias of \"", name, "\") is already a registered name"));
  }
  aliases_[id].push_back(alias);
  return absl::OkStatus();
}

Status EngineImpl::Finalize() {
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kRegistering, "Finalize"));
  if (specs_.empty()) return absl::FailedPreconditionError("Finalize: no params registered");
  std::vector<partition::ParamInfo> infos;
  for (const ParamSpec& s : specs_) {
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    infos.push_back({s.name, numel, s.dtype, s.requires_grad, s.group, s.unit});
  }
  partition::PlanConfig plan_config;
  plan_config.world_size = comm_.size();
  plan_config.stage = config_.stage;
  plan_config.grad = config_.precision.grad;
  plan_config.reduce_bucket_elems = config_.buckets.reduce_bucket_elems;
  plan_config.first_bucket_elems = config_.buckets.first_bucket_elems;
  plan_config.last_bucket_elems = config_.buckets.last_bucket_elems;
  ZERO_ASSIGN_OR_RETURN(partition::PartitionPlan plan, partition::PartitionPlan::Build(infos, plan_config));
  plan_.emplace(std::move(plan));
  int64_t without_unit = 0, total = 0;  // stage 3: params without a unit stay gathered everywhere
  for (const partition::ParamInfo& info : infos) {
    total += info.numel;
    if (info.unit < 0) without_unit += info.numel;
  }
  if (config_.stage == 3 && 2 * without_unit > total && comm_.rank() == 0) {
    ZERO_LOG(logger_, kWarn) << "stage 3: " << without_unit << " of " << total
                             << " param elements are registered without a unit (ParamSpec::unit -1), so they stay "
                                "gathered on every rank, as at stage 2; give each layer's params a unit of their own "
                                "to shard them";
  }
  std::vector<std::string> names;
  std::vector<int> bucket_of;
  for (size_t p = 0; p < specs_.size(); ++p) {
    names.push_back(specs_[p].name);
    bucket_of.push_back(specs_[p].requires_grad ? plan_->placement(static_cast<int>(p)).bucket : -1);
  }
  guard_ = std::make_unique<GradGuard>(config_.guard, std::move(names), std::move(bucket_of));
  ZERO_RETURN_IF_ERROR(CheckRegistryAgrees());

  ZERO_ASSIGN_OR_RETURN(params_, ParamStore::Create({config_, *plan_, path_, allocator_, *ops_, logger_, counters_}));
  const int num_buckets = static_cast<int>(plan_->buckets().size());
  BucketScheduler::Hooks hooks;
  hooks.on_launch = [this](int bucket) {
    ++counters_.reductions_launched;
    if (phase_ == Phase::kBackward) ++counters_.reductions_before_end_backward;
    if (iteration_ <= kDetailedIterations) {
      ZERO_LOG(logger_, kDetail) << "iteration " << iteration_ << ": launching " << DescribeBucket(bucket);
    }
  };
  hooks.describe = [this](int bucket) { return DescribeBucket(bucket); };
  if (config_.guard.consistency_check) hooks.before_launch = [this](int bucket) { return CheckRanksAgree(bucket); };
  scheduler_ = std::make_unique<BucketScheduler>(num_buckets, &path_, std::move(hooks));
  // Without overlap, and while guard.on_duplicate = "count" learns the graph, every bucket is
  // held until EndBackward, so stage 2 then needs one buffer per bucket.
  const bool hold_all = !config_.buckets.overlap || config_.guard.on_duplicate == DuplicatePolicy::kCount;
  const int pool = hold_all ? num_buckets : config_.buckets.pool_buffers;
  ZERO_ASSIGN_OR_RETURN(grads_, GradStore::Create(config_.stage, *plan_, pool, comm_, allocator_, *ops_));
  auto owned_params = [this](int bucket) { return params_->Owned(bucket); };
  OptimizerState::SumOverRanks sum_over_ranks;
  if (plan_->ranks_own_shards()) {  // LAMB's per-param norms: each rank holds only part of a param
    sum_over_ranks = [this](std::vector<float>& values) {
      return host_.AllReduce(values.data(), static_cast<int64_t>(values.size()), comm::ReduceOp::kSum);
    };
  }
  ZERO_ASSIGN_OR_RETURN(optimizer_, OptimizerState::Create(config_, *plan_, comm_.rank(), owned_params, *grads_,
                                                           allocator_, *ops_, std::move(sum_over_ranks)));
  ZERO_ASSIGN_OR_RETURN(step_scalars_, allocator_.Allocate(kStepScalars * sizeof(float), MemoryCategory::kWorkspace,
                                                           ops_->placement()));
  pending_.assign(num_buckets, 0);
  handed_.assign(num_buckets, 0);
  param_steps_.assign(specs_.size(), 0);
  InitGroups();
  phase_ = Phase::kIdle;
  ZERO_LOG(logger_, kInfo) << "finalized: " << specs_.size() << " params, " << num_buckets
                           << " buckets, stage " << config_.stage << ", world " << comm_.size();
  return absl::OkStatus();
}

Status EngineImpl::SetParam(ParamId id, const void* values) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("SetParam"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "SetParam"));
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "SetParam"));
  if (values == nullptr) return absl::InvalidArgumentError("SetParam: values is null");
  const int param = static_cast<int>(id);
  replicas_synced_ = false;  // the next iteration compares (and repairs) the replicas again
  ZERO_RETURN_IF_ERROR(params_->Set(param, values));
  return optimizer_->RefreshMaster(param);
}

Status EngineImpl::GetParam(ParamId id, void* out) const {
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "GetParam");
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "GetParam"));
  if (out == nullptr) return absl::InvalidArgumentError("GetParam: out is null");
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("GetParam"));
  return params_->Get(static_cast<int>(id), out);
}

StatusOr<void*> EngineImpl::ParamData(ParamId id) {
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "ParamData");
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "ParamData"));
  void* view = params_->View(static_cast<int>(id));
  if (view == nullptr) {
    const int unit = plan_->buckets()[plan_->placement(static_cast<int>(id)).bucket].unit;
    return absl::FailedPreconditionError(absl::StrCat(
        "ParamData: param ", ParamLabel(static_cast<int>(id)), " belongs to unit ", unit,
        ", which is not gathered at stage 3; call Gather(", unit, ") first and use the view until Release(", unit, ")"));
  }
  return view;
}

Status EngineImpl::Gather(int unit) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("Gather"));
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "Gather");
  // Where Gather is a collective (no replicas: stage 3), the first comes before the first
  // BeginIteration, so the values given to SetParam are compared before it.
  if (!params_->holds_replicas()) ZERO_RETURN_IF_ERROR(SyncReplicasOnce());
  return params_->Gather(unit);
}

Status EngineImpl::Release(int unit) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("Release"));
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "Release");
  // The trainer may have written into the unit (a look at the params that changes them):
  // freed, so the next gather reads the shards.
  return params_->Release(unit, /*may_keep=*/false);
}

Status EngineImpl::ReleaseUntilBackward(int unit) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("ReleaseUntilBackward"));
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "ReleaseUntilBackward");
  // The trainer writes into none of the unit's views before its backward gathers it again.
  return params_->Release(unit, /*may_keep=*/true);
}

Status EngineImpl::ReleaseCachedUnits() {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("ReleaseCachedUnits"));
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "ReleaseCachedUnits");
  return params_->ReleaseUnheld();
}

StatusOr<GatheredPlace> EngineImpl::GatheredPlaceOf(ParamId id) const {
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "GatheredPlaceOf");
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "GatheredPlaceOf"));
  return params_->Place(static_cast<int>(id));
}

Status EngineImpl::LendGatheredMemory(GatheredMemoryLender lender) {
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "LendGatheredMemory");
  const bool stop = lender.lend == nullptr && lender.give_back == nullptr;
  if (!stop) ZERO_RETURN_IF_ERROR(RequireHealthyGroup("LendGatheredMemory"));
  const Status lent = params_->Lend(std::move(lender));
  // Stopped either way; a broken group is reported, as a collective may still write into
  // memory lent until now.
  if (stop) ZERO_RETURN_IF_ERROR(RequireHealthyGroup("LendGatheredMemory"));
  return lent;
}

}  // namespace runtime
}  // namespace zero
