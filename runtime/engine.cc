// Engine creation, registration, Finalize and parameter access.
#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "runtime/engine_impl.h"

namespace zero {

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Config& config,
                                                 comm::Communicator& communicator) {
  ZERO_RETURN_IF_ERROR(config.Validate());
  if (!config.precision.master_weights) {
    return absl::UnimplementedError("precision.master_weights = false is not implemented");
  }
  if (config.precision.reduce != config.precision.grad) {
    return absl::UnimplementedError(absl::StrCat(
        "precision.reduce (", DTypeName(config.precision.reduce), ") must equal precision.grad (",
        DTypeName(config.precision.grad), "): reducing in another dtype is not implemented"));
  }
  ZERO_ASSIGN_OR_RETURN(base::EnvTunables env, base::ReadEnvTunables());
  base::Logger logger(env.log_level, communicator.rank());
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
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<runtime::DeviceOps> ops,
                        runtime::DeviceOps::Create(config.device, exec, allocator));
  return std::unique_ptr<Engine>(new runtime::EngineImpl(config, communicator, logger, allocator, std::move(ops)));
}

namespace runtime {

EngineImpl::EngineImpl(const Config& config, comm::Communicator& comm, base::Logger logger,
                       base::Allocator allocator, std::unique_ptr<DeviceOps> ops)
    : config_(config), comm_(comm), logger_(logger), allocator_(allocator), ops_(std::move(ops)),
      host_(comm, *ops_, allocator, config.guard.timeout_s), loss_scaler_(config.loss_scale) {}

EngineImpl::~EngineImpl() {
  if (comm_.Health().ok() && scheduler_ != nullptr && scheduler_->in_flight() > 0) {
    const Status drained = scheduler_->WaitAll(config_.guard.timeout_s);
    if (!drained.ok()) {
      ZERO_LOG(logger_, kWarn) << "destroying the engine: " << drained.message();
    }
  }
  for (size_t b = 0; b < units_.size() && comm_.Health().ok(); ++b) {  // stage 3 all-gathers
    const Status drained = FinishGather(static_cast<int>(b));
    if (!drained.ok()) {
      ZERO_LOG(logger_, kWarn) << "destroying the engine: " << drained.message();
    }
  }
  // Whatever is still in flight is abandoned now, before any buffer is freed.
  scheduler_.reset();
  for (Unit& unit : units_) unit.pending.reset();
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

Status EngineImpl::SetStream(void* cuda_stream) {
  if (phase_ == Phase::kBackward) return RequirePhase(Phase::kIdle, "SetStream");
  return ops_->SetStream(cuda_stream);
}

bool EngineImpl::CollectivesWaitForStream() const {
  return ops_->placement() == Placement::kDevice && !comm_.ordered_after_stream();
}

Status EngineImpl::BeforeCollective() {
  return CollectivesWaitForStream() ? ops_->Synchronize() : absl::OkStatus();
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

int64_t EngineImpl::ParamBytes(int param) const {
  return plan_->placement(param).numel * static_cast<int64_t>(DTypeSize(specs_[param].dtype));
}

char* EngineImpl::ParamAddress(int param) const {
  const auto& place = plan_->placement(param);
  const auto& bucket = plan_->buckets()[place.bucket];
  return params_.as<char>() + bucket.byte_offset + plan_->ParamByteOffset(param);
}

StatusOr<ParamId> EngineImpl::RegisterParam(const ParamSpec& spec) {
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kRegistering, "RegisterParam"));
  if (spec.shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": shape is empty"));
  }
  for (int64_t d : spec.shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": dimension ", d,
                                                     " is not ≥ 1"));
    }
  }
  if (spec.group < 0) {
    return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": group ", spec.group, " < 0"));
  }
  if (!IsFloatingPoint(spec.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("param \"", spec.name, "\": dtype ", DTypeName(spec.dtype),
                                                   " is not a param dtype (fp32, bf16 or fp16)"));
  }
  if (spec.requires_grad && spec.dtype != config_.precision.grad) {
    return absl::UnimplementedError(absl::StrCat(
        "param \"", spec.name, "\" is ", DTypeName(spec.dtype), " but precision.grad is ",
        DTypeName(config_.precision.grad), ": gradients in a dtype other than the param's are not "
        "implemented yet; set precision.grad and precision.reduce to ", DTypeName(spec.dtype)));
  }
  for (const ParamSpec& other : specs_) {
    if (other.name == spec.name) {
      return absl::InvalidArgumentError(absl::StrCat("param name \"", spec.name, "\" is already registered"));
    }
  }
  specs_.push_back(spec);
  return static_cast<ParamId>(specs_.size() - 1);
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
  plan_config.reduce_bucket_elems = config_.buckets.reduce_bucket_elems;
  plan_config.first_bucket_elems = config_.buckets.first_bucket_elems;
  ZERO_ASSIGN_OR_RETURN(partition::PartitionPlan plan, partition::PartitionPlan::Build(infos, plan_config));
  plan_.emplace(std::move(plan));
  std::vector<std::string> names;
  std::vector<int> bucket_of;
  for (size_t p = 0; p < specs_.size(); ++p) {
    names.push_back(specs_[p].name);
    bucket_of.push_back(specs_[p].requires_grad ? plan_->placement(static_cast<int>(p)).bucket : -1);
  }
  guard_ = std::make_unique<GradGuard>(config_.guard, std::move(names), std::move(bucket_of));
  ZERO_RETURN_IF_ERROR(CheckRegistryAgrees());

  if (config_.stage == 3) {
    ZERO_RETURN_IF_ERROR(SetupUnits());  // params live as this rank's shards
  } else {
    ZERO_ASSIGN_OR_RETURN(params_, allocator_.Allocate(plan_->flat_bytes(), MemoryCategory::kParams, ops_->placement()));
    ZERO_RETURN_IF_ERROR(ops_->Zero(params_.data(), params_.bytes()));
  }
  const int num_buckets = static_cast<int>(plan_->buckets().size());
  scheduler_ = std::make_unique<BucketScheduler>(
      num_buckets,
      [this](int bucket) {
        ++counters_.reductions_launched;
        if (phase_ == Phase::kBackward) ++counters_.reductions_before_end_backward;
        if (iteration_ <= kDetailedIterations) {
          ZERO_LOG(logger_, kDetail) << "iteration " << iteration_ << ": launching " << DescribeBucket(bucket);
        }
      },
      [this](int bucket) { return DescribeBucket(bucket); });
  // Without overlap, and while guard.on_duplicate = "count" learns the graph, every bucket is
  // held until EndBackward, so stage 2 then needs one buffer per bucket.
  const bool hold_all = !config_.buckets.overlap || config_.guard.on_duplicate == DuplicatePolicy::kCount;
  const int pool = hold_all ? num_buckets : config_.buckets.pool_buffers;
  auto wait_for_buffer = [this] {
    Status waited = scheduler_->WaitOldest(config_.guard.timeout_s);
    if (waited.ok()) ++counters_.pool_waits;
    return waited;
  };
  ZERO_ASSIGN_OR_RETURN(grads_, GradStore::Create(config_.stage, *plan_, pool, comm_, allocator_, *ops_, wait_for_buffer));
  auto owned_params = [this](int bucket) {
    if (config_.stage == 3) return ShardOf(bucket);
    const partition::Bucket& b = plan_->buckets()[bucket];
    return params_.as<char>() + b.byte_offset + (config_.stage == 0 ? 0 : b.shard_byte_offset(comm_.rank()));
  };
  OptimizerState::SumOverRanks sum_over_ranks;
  if (config_.stage != 0) {  // LAMB's per-param norms: each rank holds only part of a param
    sum_over_ranks = [this](std::vector<float>& values) {
      return host_.AllReduce(values.data(), static_cast<int64_t>(values.size()), comm::ReduceOp::kSum);
    };
  }
  ZERO_ASSIGN_OR_RETURN(optimizer_, OptimizerState::Create(config_, *plan_, comm_.rank(), owned_params, *grads_,
                                                           allocator_, *ops_, std::move(sum_over_ranks)));
  pending_.assign(num_buckets, 0);
  handed_.assign(num_buckets, 0);
  set_hash_.assign(specs_.size(), 0);
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
  if (config_.stage == 3) {
    ZERO_ASSIGN_OR_RETURN(set_hash_[param], HashValues(values, ParamBytes(param)));
  }
  if (config_.stage == 3) {  // this rank's fragment into its shard, and any gathered copy
    const int64_t element = static_cast<int64_t>(DTypeSize(specs_[param].dtype));
    for (const partition::Fragment& f : plan_->FragmentsOfParam(param)) {
      if (f.rank != comm_.rank()) continue;
      ZERO_RETURN_IF_ERROR(ops_->Copy(ShardOf(f.bucket) + f.shard_begin * element,
                                      static_cast<const char*>(values) + f.param_begin * element, f.numel * element));
    }
    const int bucket = plan_->placement(param).bucket;
    ZERO_RETURN_IF_ERROR(FinishGather(bucket));
    if (units_[bucket].buffer.data() != nullptr) {
      ZERO_RETURN_IF_ERROR(ops_->Copy(units_[bucket].buffer.as<char>() + plan_->placement(param).offset * element,
                                      values, ParamBytes(param)));
    }
  } else {
    ZERO_RETURN_IF_ERROR(ops_->Copy(ParamAddress(param), values, ParamBytes(param)));
  }
  return optimizer_->RefreshMaster(param);
}

Status EngineImpl::GetParam(ParamId id, void* out) const {
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "GetParam");
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "GetParam"));
  if (out == nullptr) return absl::InvalidArgumentError("GetParam: out is null");
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("GetParam"));
  if (config_.stage == 3) return const_cast<EngineImpl*>(this)->GetParamStage3(static_cast<int>(id), out);
  return ops_->Copy(out, ParamAddress(static_cast<int>(id)), ParamBytes(static_cast<int>(id)));
}

StatusOr<void*> EngineImpl::ParamData(ParamId id) {
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "ParamData");
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "ParamData"));
  if (config_.stage != 3) return static_cast<void*>(ParamAddress(static_cast<int>(id)));
  char* gathered = GatheredParam(static_cast<int>(id));
  if (gathered == nullptr) {
    const int unit = plan_->buckets()[plan_->placement(static_cast<int>(id)).bucket].unit;
    return absl::FailedPreconditionError(absl::StrCat(
        "ParamData: param ", ParamLabel(static_cast<int>(id)), " belongs to unit ", unit,
        ", which is not gathered at stage 3; call Gather(", unit, ") first and use the view until Release(", unit, ")"));
  }
  return static_cast<void*>(gathered);
}

Status EngineImpl::GetParamStage3(int param, void* out) {
  const int bucket = plan_->placement(param).bucket;
  const bool held = units_[bucket].buffer.data() != nullptr;
  if (!held) ZERO_RETURN_IF_ERROR(StartGather(bucket));  // a collective: every rank calls GetParam
  ZERO_RETURN_IF_ERROR(FinishGather(bucket));
  const int64_t element = static_cast<int64_t>(DTypeSize(specs_[param].dtype));
  const Status copied =
      ops_->Copy(out, units_[bucket].buffer.as<char>() + plan_->placement(param).offset * element, ParamBytes(param));
  if (!held) FreeUnit(bucket);
  return copied;
}

}  // namespace runtime
}  // namespace zero
