// The C ABI: thin wrappers that turn each Status into a zero_status and a thread-local message.
#include "zero/zero.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/c_api_comm.h"
#include "runtime/c_api_status.h"
#include "runtime/checkpoint_format.h"
#include "zero/communicator.h"
#include "zero/engine.h"
#include "zero/preemption.h"
#include "zero/version.h"

struct zero_engine {
  std::shared_ptr<zero::comm::Communicator> comm;  // declared first: outlives the engine
  std::unique_ptr<zero::Engine> engine;
};

using zero::c_api::Report;

static_assert(ZERO_STATE_WEIGHTS == static_cast<int>(zero::ParamState::kWeights) &&
                  ZERO_STATE_FIRST_MOMENT == static_cast<int>(zero::ParamState::kFirstMoment) &&
                  ZERO_STATE_SECOND_MOMENT == static_cast<int>(zero::ParamState::kSecondMoment) &&
                  ZERO_STATE_GRAD == static_cast<int>(zero::ParamState::kGrad),
              "zero_param_state is ParamState (the engine checks the range)");

extern "C" {

const char* zero_version(void) { return zero::BuildSummary(); }

zero_status zero_comm_local_group(int world, zero_comm** comms) try {
  ZERO_C_REQUIRE(comms, "zero_comm_local_group");
  auto group = zero::comm::CreateLocalGroup(world);
  if (!group.ok()) return Report(group.status());
  for (int r = 0; r < world; ++r) comms[r] = new zero_comm{std::move((*group)[r])};
  return ZERO_OK;
} ZERO_C_CATCH("zero_comm_local_group")

zero_status zero_comm_mpi(const void* mpi_comm, zero_comm** out) try {
  ZERO_C_REQUIRE(out, "zero_comm_mpi");
  auto comm = zero::comm::CreateMpiCommunicator(mpi_comm);
  if (!comm.ok()) return Report(comm.status());
  *out = new zero_comm{std::move(*comm)};
  return ZERO_OK;
} ZERO_C_CATCH("zero_comm_mpi")

zero_status zero_comm_nccl(zero_comm* bootstrap, int device, void* cuda_stream, zero_comm** out) try {
  ZERO_C_REQUIRE(bootstrap, "zero_comm_nccl");
  ZERO_C_REQUIRE(out, "zero_comm_nccl");
  auto comm = zero::comm::CreateNcclCommunicator(*bootstrap->comm, {cuda_stream, device});
  if (!comm.ok()) return Report(comm.status());
  *out = new zero_comm{std::move(*comm)};
  return ZERO_OK;
} ZERO_C_CATCH("zero_comm_nccl")

int zero_comm_rank(const zero_comm* comm) { return comm ? comm->comm->rank() : -1; }
int zero_comm_size(const zero_comm* comm) { return comm ? comm->comm->size() : -1; }
void zero_comm_destroy(zero_comm* comm) { delete comm; }

zero_status zero_comm_broadcast_bytes(zero_comm* comm, void* data, int64_t bytes, int root, double timeout_s) try {
  ZERO_C_REQUIRE(comm, "zero_comm_broadcast_bytes");
  if (bytes < 0) return Report(absl::InvalidArgumentError("zero_comm_broadcast_bytes: bytes is negative"));
  if (!(timeout_s >= 0)) {  // NaN too; a negative one waited forever
    return Report(absl::InvalidArgumentError("zero_comm_broadcast_bytes: timeout_s must be ≥ 0 (0: no limit)"));
  }
  if (root < 0 || root >= comm->comm->size()) {  // refused here: the communicator stays usable
    return Report(absl::InvalidArgumentError(absl::StrCat("zero_comm_broadcast_bytes: root ", root,
                                                          " is not a rank of this communicator (0 to ",
                                                          comm->comm->size() - 1, ")")));
  }
  if (bytes == 0) return ZERO_OK;
  ZERO_C_REQUIRE(data, "zero_comm_broadcast_bytes");
  if (comm->comm->size() == 1) return ZERO_OK;  // the root's bytes are every rank's already
  // In pieces of at most 1 GiB: MPI counts are ints.
  constexpr int64_t kPiece = int64_t{1} << 30;
  for (int64_t first = 0; first < bytes; first += kPiece) {
    const zero::Status status = comm->comm->Broadcast(static_cast<char*>(data) + first, std::min(kPiece, bytes - first),
                                                      zero::DType::kUInt8, root, zero::comm::kTrainerValuesTag)
                                     ->Wait(timeout_s);
    if (!status.ok()) return Report(status);
  }
  return ZERO_OK;
} ZERO_C_CATCH("zero_comm_broadcast_bytes")

zero_status zero_engine_create(const char* config_json, zero_comm* comm, zero_engine** out) try {
  ZERO_C_REQUIRE(comm, "zero_engine_create");
  ZERO_C_REQUIRE(out, "zero_engine_create");
  zero::Config config;
  if (config_json != nullptr) {
    auto parsed = zero::Config::FromJson(config_json);
    if (!parsed.ok()) return Report(parsed.status());
    config = *parsed;
  }
  auto engine = zero::Engine::Create(config, *comm->comm);
  if (!engine.ok()) return Report(engine.status());
  *out = new zero_engine{comm->comm, std::move(*engine)};
  return ZERO_OK;
} ZERO_C_CATCH("zero_engine_create")

void zero_engine_destroy(zero_engine* engine) { delete engine; }

zero_status zero_register_param(zero_engine* engine, const char* name, const int64_t* shape, int ndim,
                                 zero_dtype dtype, int requires_grad, int group, int unit, int64_t* id) try {
  ZERO_C_REQUIRE(engine, "zero_register_param");
  ZERO_C_REQUIRE(name, "zero_register_param");
  ZERO_C_REQUIRE(id, "zero_register_param");
  if (ndim < 1 || shape == nullptr) {
    return Report(absl::InvalidArgumentError(absl::StrCat("zero_register_param(\"", name,
                                                          "\"): need ndim ≥ 1 and a shape")));
  }
  if (dtype < ZERO_FP32 || dtype > ZERO_FP16) {
    return Report(absl::InvalidArgumentError(absl::StrCat("zero_register_param(\"", name,
                                                          "\"): unknown dtype ", static_cast<int>(dtype))));
  }
  zero::ParamSpec spec{name, std::vector<int64_t>(shape, shape + ndim), static_cast<zero::DType>(dtype),
                       requires_grad != 0, group, unit};
  auto registered = engine->engine->RegisterParam(spec);
  if (!registered.ok()) return Report(registered.status());
  *id = *registered;
  return ZERO_OK;
} ZERO_C_CATCH("zero_register_param")

zero_status zero_add_param_alias(zero_engine* engine, int64_t id, const char* alias) try {
  ZERO_C_REQUIRE(engine, "zero_add_param_alias");
  ZERO_C_REQUIRE(alias, "zero_add_param_alias");
  return Report(engine->engine->AddParamAlias(id, alias));
} ZERO_C_CATCH("zero_add_param_alias")

zero_status zero_finalize(zero_engine* engine) try {
  ZERO_C_REQUIRE(engine, "zero_finalize");
  return Report(engine->engine->Finalize());
} ZERO_C_CATCH("zero_finalize")

zero_status zero_set_param(zero_engine* engine, int64_t id, const void* host_src) try {
  ZERO_C_REQUIRE(engine, "zero_set_param");
  return Report(engine->engine->SetParam(id, host_src));
} ZERO_C_CATCH("zero_set_param")

zero_status zero_get_param(zero_engine* engine, int64_t id, void* host_dst) try {
  ZERO_C_REQUIRE(engine, "zero_get_param");
  return Report(engine->engine->GetParam(id, host_dst));
} ZERO_C_CATCH("zero_get_param")

zero_status zero_param_data(zero_engine* engine, int64_t id, void** view) try {
  ZERO_C_REQUIRE(engine, "zero_param_data");
  ZERO_C_REQUIRE(view, "zero_param_data");
  auto data = engine->engine->ParamData(id);
  if (!data.ok()) return Report(data.status());
  *view = *data;
  return ZERO_OK;
} ZERO_C_CATCH("zero_param_data")

zero_status zero_grad_buffer(zero_engine* engine, int64_t id, void** view) try {
  ZERO_C_REQUIRE(engine, "zero_grad_buffer");
  ZERO_C_REQUIRE(view, "zero_grad_buffer");
  auto data = engine->engine->GradBuffer(id);
  if (!data.ok()) return Report(data.status());
  *view = *data;
  return ZERO_OK;
} ZERO_C_CATCH("zero_grad_buffer")

zero_status zero_grad_ready(zero_engine* engine, int64_t id) try {
  ZERO_C_REQUIRE(engine, "zero_grad_ready");
  return Report(engine->engine->GradReady(id));
} ZERO_C_CATCH("zero_grad_ready")

zero_status zero_grad_absent(zero_engine* engine, int64_t id) try {
  ZERO_C_REQUIRE(engine, "zero_grad_absent");
  return Report(engine->engine->GradAbsent(id));
} ZERO_C_CATCH("zero_grad_absent")

zero_status zero_accumulate_grad(zero_engine* engine, int64_t id, const void* grad) try {
  ZERO_C_REQUIRE(engine, "zero_accumulate_grad");
  return Report(engine->engine->AccumulateGrad(id, grad));
} ZERO_C_CATCH("zero_accumulate_grad")

zero_status zero_accumulate_device_grad(zero_engine* engine, int64_t id, const void* grad) try {
  ZERO_C_REQUIRE(engine, "zero_accumulate_device_grad");
  return Report(engine->engine->AccumulateGrad(id, grad, zero::Placement::kDevice));
} ZERO_C_CATCH("zero_accumulate_device_grad")

zero_status zero_lend_grad(zero_engine* engine, int64_t id, const void* grad, int on_device, int* kept) try {
  ZERO_C_REQUIRE(engine, "zero_lend_grad");
  ZERO_C_REQUIRE(kept, "zero_lend_grad");
  auto lent = engine->engine->LendGrad(id, grad, on_device ? zero::Placement::kDevice : zero::Placement::kHost);
  if (!lent.ok()) return Report(lent.status());
  *kept = *lent ? 1 : 0;
  return ZERO_OK;
} ZERO_C_CATCH("zero_lend_grad")

zero_status zero_accumulate_grads(zero_engine* engine, int64_t count, const int64_t* ids, const void* const* grads,
                                  int flags, int* kept, int64_t* handed) try {
  if (handed != nullptr) *handed = 0;
  ZERO_C_REQUIRE(engine, "zero_accumulate_grads");
  ZERO_C_REQUIRE(handed, "zero_accumulate_grads");
  if (count < 0) {
    return Report(absl::InvalidArgumentError(
        absl::StrCat("zero_accumulate_grads: count is ", count, "; it must be >= 0")));
  }
  if ((flags & ~(ZERO_GRADS_ON_DEVICE | ZERO_GRADS_LEND)) != 0) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
        "zero_accumulate_grads: unknown flags ", flags, " (ZERO_GRADS_ON_DEVICE | ZERO_GRADS_LEND is ",
        ZERO_GRADS_ON_DEVICE | ZERO_GRADS_LEND, ")")));
  }
  if (count == 0) return ZERO_OK;
  ZERO_C_REQUIRE(ids, "zero_accumulate_grads");
  ZERO_C_REQUIRE(grads, "zero_accumulate_grads");
  const bool lend = (flags & ZERO_GRADS_LEND) != 0;
  if (lend) ZERO_C_REQUIRE(kept, "zero_accumulate_grads");
  const bool on_device = (flags & ZERO_GRADS_ON_DEVICE) != 0;
  zero::Engine& e = *engine->engine;
  for (int64_t i = 0; i < count; ++i) {
    if (lend) {
      auto lent = e.LendGrad(ids[i], grads[i], on_device ? zero::Placement::kDevice : zero::Placement::kHost);
      if (!lent.ok()) return Report(lent.status());
      kept[i] = *lent ? 1 : 0;
    } else {
      const zero::Status status =
          on_device ? e.AccumulateGrad(ids[i], grads[i], zero::Placement::kDevice) : e.AccumulateGrad(ids[i], grads[i]);
      if (!status.ok()) return Report(status);
    }
    *handed = i + 1;
  }
  return ZERO_OK;
} ZERO_C_CATCH("zero_accumulate_grads")

zero_status zero_sync_replicas(zero_engine* engine) try {
  ZERO_C_REQUIRE(engine, "zero_sync_replicas");
  return Report(engine->engine->SyncReplicas());
} ZERO_C_CATCH("zero_sync_replicas")

zero_status zero_begin_iteration(zero_engine* engine) try {
  ZERO_C_REQUIRE(engine, "zero_begin_iteration");
  return Report(engine->engine->BeginIteration());
} ZERO_C_CATCH("zero_begin_iteration")

zero_status zero_end_backward(zero_engine* engine) try {
  ZERO_C_REQUIRE(engine, "zero_end_backward");
  return Report(engine->engine->EndBackward());
} ZERO_C_CATCH("zero_end_backward")

zero_status zero_drop_gradients(zero_engine* engine) try {
  ZERO_C_REQUIRE(engine, "zero_drop_gradients");
  return Report(engine->engine->DropGradients());
} ZERO_C_CATCH("zero_drop_gradients")

zero_status zero_abandon_micro_batch(zero_engine* engine) try {
  ZERO_C_REQUIRE(engine, "zero_abandon_micro_batch");
  return Report(engine->engine->AbandonMicroBatch());
} ZERO_C_CATCH("zero_abandon_micro_batch")

zero_status zero_step(zero_engine* engine, zero_step_info* info) try {
  ZERO_C_REQUIRE(engine, "zero_step");
  auto step = engine->engine->Step();
  if (!step.ok()) return Report(step.status());
  if (info != nullptr) *info = {step->step, step->skipped ? 1 : 0, step->grad_norm, step->loss_scale};
  return ZERO_OK;
} ZERO_C_CATCH("zero_step")

zero_status zero_last_grad_norm(zero_engine* engine, float* norm) try {
  ZERO_C_REQUIRE(engine, "zero_last_grad_norm");
  ZERO_C_REQUIRE(norm, "zero_last_grad_norm");
  auto value = engine->engine->LastGradNorm();
  if (!value.ok()) return Report(value.status());
  *norm = *value;
  return ZERO_OK;
} ZERO_C_CATCH("zero_last_grad_norm")

zero_status zero_clip_grad_norm(zero_engine* engine, float max_norm, float* norm) try {
  ZERO_C_REQUIRE(engine, "zero_clip_grad_norm");
  ZERO_C_REQUIRE(norm, "zero_clip_grad_norm");
  auto value = engine->engine->ClipGradNorm(max_norm);
  if (!value.ok()) return Report(value.status());
  *norm = *value;
  return ZERO_OK;
} ZERO_C_CATCH("zero_clip_grad_norm")

zero_status zero_get_full_state(zero_engine* engine, int64_t id, zero_param_state state, float* host_dst) try {
  ZERO_C_REQUIRE(engine, "zero_get_full_state");
  return Report(engine->engine->GetFullState(id, static_cast<zero::ParamState>(state), host_dst));
} ZERO_C_CATCH("zero_get_full_state")

zero_status zero_set_full_state(zero_engine* engine, int64_t id, zero_param_state state, const float* host_src) try {
  ZERO_C_REQUIRE(engine, "zero_set_full_state");
  return Report(engine->engine->SetFullState(id, static_cast<zero::ParamState>(state), host_src));
} ZERO_C_CATCH("zero_set_full_state")

zero_status zero_set_stream(zero_engine* engine, void* cuda_stream) try {
  ZERO_C_REQUIRE(engine, "zero_set_stream");
  return Report(engine->engine->SetStream(cuda_stream));
} ZERO_C_CATCH("zero_set_stream")

zero_status zero_gather(zero_engine* engine, int unit) try {
  ZERO_C_REQUIRE(engine, "zero_gather");
  return Report(engine->engine->Gather(unit));
} ZERO_C_CATCH("zero_gather")

zero_status zero_release(zero_engine* engine, int unit) try {
  ZERO_C_REQUIRE(engine, "zero_release");
  return Report(engine->engine->Release(unit));
} ZERO_C_CATCH("zero_release")

zero_status zero_release_until_backward(zero_engine* engine, int unit) try {
  ZERO_C_REQUIRE(engine, "zero_release_until_backward");
  return Report(engine->engine->ReleaseUntilBackward(unit));
} ZERO_C_CATCH("zero_release_until_backward")

zero_status zero_release_cached_units(zero_engine* engine) try {
  ZERO_C_REQUIRE(engine, "zero_release_cached_units");
  return Report(engine->engine->ReleaseCachedUnits());
} ZERO_C_CATCH("zero_release_cached_units")

zero_status zero_gathered_place(const zero_engine* engine, int64_t id, int* unit, int64_t* offset_bytes,
                                int64_t* unit_bytes, int* persistent) try {
  ZERO_C_REQUIRE(engine, "zero_gathered_place");
  ZERO_C_REQUIRE(unit, "zero_gathered_place");
  ZERO_C_REQUIRE(offset_bytes, "zero_gathered_place");
  ZERO_C_REQUIRE(unit_bytes, "zero_gathered_place");
  ZERO_C_REQUIRE(persistent, "zero_gathered_place");
  auto place = engine->engine->GatheredPlaceOf(id);
  if (!place.ok()) return Report(place.status());
  *unit = place->unit;
  *offset_bytes = place->offset_bytes;
  *unit_bytes = place->unit_bytes;
  *persistent = place->persistent ? 1 : 0;
  return ZERO_OK;
} ZERO_C_CATCH("zero_gathered_place")

zero_status zero_lend_gathered_memory(zero_engine* engine, zero_lend_fn lend, zero_give_back_fn give_back,
                                      void* user) try {
  ZERO_C_REQUIRE(engine, "zero_lend_gathered_memory");
  zero::GatheredMemoryLender lender;
  if (lend != nullptr) {
    lender.lend = [lend, user](int unit, int64_t bytes) -> zero::StatusOr<void*> {
      void* memory = nullptr;
      const zero_status status = lend(user, unit, bytes, &memory);
      if (status != ZERO_OK) {
        const int code = static_cast<int>(status);
        const bool known = code > 0 && code <= 16;
        return zero::Status(known ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
                            absl::StrCat("the lend callback returned status ", code));
      }
      return memory;
    };
  }
  if (give_back != nullptr) lender.give_back = [give_back, user](int unit) { give_back(user, unit); };
  return Report(engine->engine->LendGatheredMemory(std::move(lender)));
} ZERO_C_CATCH("zero_lend_gathered_memory")

zero_status zero_save_checkpoint(zero_engine* engine, const char* dir) try {
  ZERO_C_REQUIRE(engine, "zero_save_checkpoint");
  ZERO_C_REQUIRE(dir, "zero_save_checkpoint");
  return Report(engine->engine->SaveCheckpoint(dir));
} ZERO_C_CATCH("zero_save_checkpoint")

zero_status zero_save_checkpoint_tagged(zero_engine* engine, const char* root, const char* tag) try {
  ZERO_C_REQUIRE(engine, "zero_save_checkpoint_tagged");
  ZERO_C_REQUIRE(root, "zero_save_checkpoint_tagged");
  ZERO_C_REQUIRE(tag, "zero_save_checkpoint_tagged");
  return Report(engine->engine->SaveCheckpoint(root, tag));
} ZERO_C_CATCH("zero_save_checkpoint_tagged")

zero_status zero_load_checkpoint(zero_engine* engine, const char* dir) try {
  ZERO_C_REQUIRE(engine, "zero_load_checkpoint");
  ZERO_C_REQUIRE(dir, "zero_load_checkpoint");
  return Report(engine->engine->LoadCheckpoint(dir));
} ZERO_C_CATCH("zero_load_checkpoint")

zero_status zero_abort_mpi_job(int exit_code) try {
  return Report(zero::comm::AbortMpiJob(exit_code));
} ZERO_C_CATCH("zero_abort_mpi_job")

zero_status zero_install_preemption_handler(void) try {
  return Report(zero::InstallPreemptionHandler());
} ZERO_C_CATCH("zero_install_preemption_handler")

zero_status zero_preemption_requested(zero_engine* engine, int* requested) try {
  ZERO_C_REQUIRE(engine, "zero_preemption_requested");
  ZERO_C_REQUIRE(requested, "zero_preemption_requested");
  zero::StatusOr<bool> answer = engine->engine->PreemptionRequested();
  if (answer.ok()) *requested = *answer ? 1 : 0;
  return Report(answer.status());
} ZERO_C_CATCH("zero_preemption_requested")

zero_status zero_set_checkpoint_user_data(zero_engine* engine, const char* data) try {
  ZERO_C_REQUIRE(engine, "zero_set_checkpoint_user_data");
  ZERO_C_REQUIRE(data, "zero_set_checkpoint_user_data");
  const zero::Status text = zero::runtime::CheckMetaText(data, "zero_set_checkpoint_user_data: the data");
  if (!text.ok()) return Report(text);
  engine->engine->set_checkpoint_user_data(data);
  return ZERO_OK;
} ZERO_C_CATCH("zero_set_checkpoint_user_data")

zero_status zero_checkpoint_user_data(const zero_engine* engine, const char** data) try {
  ZERO_C_REQUIRE(engine, "zero_checkpoint_user_data");
  ZERO_C_REQUIRE(data, "zero_checkpoint_user_data");
  *data = engine->engine->checkpoint_user_data().c_str();
  return ZERO_OK;
} ZERO_C_CATCH("zero_checkpoint_user_data")

zero_status zero_memory_stats(const zero_engine* engine, struct zero_memory_stats* out) try {
  ZERO_C_REQUIRE(engine, "zero_memory_stats");
  ZERO_C_REQUIRE(out, "zero_memory_stats");
  const zero::MemoryStats stats = engine->engine->GetMemoryStats();
  static_assert(ZERO_MEM_CATEGORIES == zero::kMemoryCategoryCount, "categories match");
  for (int c = 0; c < ZERO_MEM_CATEGORIES; ++c) {
    out->current[c] = stats.current[c];
    out->peak[c] = stats.peak[c];
  }
  return ZERO_OK;
} ZERO_C_CATCH("zero_memory_stats")

int zero_engine_rank(const zero_engine* engine) { return engine ? engine->engine->rank() : -1; }
int zero_engine_world_size(const zero_engine* engine) { return engine ? engine->engine->world_size() : -1; }

zero_status zero_engine_counters_sized(const zero_engine* engine, zero_engine_counters_t* out, size_t size) try {
  ZERO_C_REQUIRE(engine, "zero_engine_counters_sized");
  ZERO_C_REQUIRE(out, "zero_engine_counters_sized");
  if (size % sizeof(int64_t) != 0) {
    return Report(absl::InvalidArgumentError(absl::StrCat(
        "zero_engine_counters_sized: size ", size, " is not a whole number of int64_t fields")));
  }
  const zero::EngineCounters c = engine->engine->counters();
  const zero_engine_counters_t all = {c.reductions_launched, c.reductions_before_end_backward, c.pool_waits,
                                      c.gathers_prefetched,  c.gathers_on_demand,              c.trace_invalidations,
                                      c.checkpoint_bytes_read, c.grad_bytes_copied,            c.host_waits,
                                      c.gather_allocations,    c.releases_kept,                c.pool_buffers_added};
  std::memcpy(out, &all, std::min(size, sizeof all));
  return ZERO_OK;
} ZERO_C_CATCH("zero_engine_counters_sized")

zero_status zero_engine_counters(const zero_engine* engine, zero_engine_counters_t* out) try {
  constexpr size_t kFirstSevenFields = 7 * sizeof(int64_t);
  return zero_engine_counters_sized(engine, out, kFirstSevenFields);
} ZERO_C_CATCH("zero_engine_counters")

zero_status zero_num_groups(const zero_engine* engine, int* groups) try {
  ZERO_C_REQUIRE(engine, "zero_num_groups");
  ZERO_C_REQUIRE(groups, "zero_num_groups");
  *groups = engine->engine->num_groups();
  return ZERO_OK;
} ZERO_C_CATCH("zero_num_groups")

zero_status zero_get_group_hyper(const zero_engine* engine, int group, zero_group_hyper* out) try {
  ZERO_C_REQUIRE(engine, "zero_get_group_hyper");
  ZERO_C_REQUIRE(out, "zero_get_group_hyper");
  auto hyper = engine->engine->GroupHyper(group);
  if (!hyper.ok()) return Report(hyper.status());
  *out = {hyper->lr, hyper->beta1, hyper->beta2, hyper->eps, hyper->weight_decay, hyper->momentum,
          hyper->dampening, hyper->nesterov ? 1 : 0};
  return ZERO_OK;
} ZERO_C_CATCH("zero_get_group_hyper")

zero_status zero_set_group_hyper(zero_engine* engine, int group, const zero_group_hyper* hyper) try {
  ZERO_C_REQUIRE(engine, "zero_set_group_hyper");
  ZERO_C_REQUIRE(hyper, "zero_set_group_hyper");
  zero::OptimizerHyper h;
  h.lr = hyper->lr;
  h.beta1 = hyper->beta1;
  h.beta2 = hyper->beta2;
  h.eps = hyper->eps;
  h.weight_decay = hyper->weight_decay;
  h.momentum = hyper->momentum;
  h.dampening = hyper->dampening;
  h.nesterov = hyper->nesterov != 0;
  return Report(engine->engine->SetGroupHyper(group, h));
} ZERO_C_CATCH("zero_set_group_hyper")

zero_status zero_set_lr(zero_engine* engine, int group, float lr) try {
  ZERO_C_REQUIRE(engine, "zero_set_lr");
  auto hyper = engine->engine->GroupHyper(group);
  if (!hyper.ok()) return Report(hyper.status());
  hyper->lr = lr;
  return Report(engine->engine->SetGroupHyper(group, *hyper));
} ZERO_C_CATCH("zero_set_lr")

zero_status zero_get_lr(const zero_engine* engine, int group, float* lr) try {
  ZERO_C_REQUIRE(engine, "zero_get_lr");
  ZERO_C_REQUIRE(lr, "zero_get_lr");
  auto hyper = engine->engine->GroupHyper(group);
  if (!hyper.ok()) return Report(hyper.status());
  *lr = hyper->lr;
  return ZERO_OK;
} ZERO_C_CATCH("zero_get_lr")

zero_status zero_loss_scale(const zero_engine* engine, float* scale) try {
  ZERO_C_REQUIRE(engine, "zero_loss_scale");
  ZERO_C_REQUIRE(scale, "zero_loss_scale");
  *scale = engine->engine->loss_scale();
  return ZERO_OK;
} ZERO_C_CATCH("zero_loss_scale")

zero_status zero_lr_schedule_iteration(const zero_engine* engine, int64_t* iteration) try {
  ZERO_C_REQUIRE(engine, "zero_lr_schedule_iteration");
  ZERO_C_REQUIRE(iteration, "zero_lr_schedule_iteration");
  *iteration = engine->engine->lr_schedule_iteration();
  return ZERO_OK;
} ZERO_C_CATCH("zero_lr_schedule_iteration")

zero_status zero_comm_all_reduce_f32(zero_comm* comm, float* data, int64_t count, int op, double timeout_s) try {
  ZERO_C_REQUIRE(comm, "zero_comm_all_reduce_f32");
  if (count < 0) return Report(absl::InvalidArgumentError("zero_comm_all_reduce_f32: count is negative"));
  if (op != 0 && op != 1) {
    return Report(absl::InvalidArgumentError(absl::StrCat("zero_comm_all_reduce_f32: op ", op,
                                                          " is neither 0 (sum) nor 1 (max)")));
  }
  if (!(timeout_s >= 0)) {  // NaN too
    return Report(absl::InvalidArgumentError("zero_comm_all_reduce_f32: timeout_s must be ≥ 0"));
  }
  if (comm->comm->device_buffers_only()) {  // NCCL: handing it host memory would break the group
    return Report(absl::UnimplementedError(
        "zero_comm_all_reduce_f32: this communicator (NCCL) reduces device memory only; host values "
        "are not implemented for it yet: reduce metrics through an MPI communicator of the same ranks"));
  }
  if (count == 0) return ZERO_OK;
  ZERO_C_REQUIRE(data, "zero_comm_all_reduce_f32");
  const auto reduce = op == 0 ? zero::comm::ReduceOp::kSum : zero::comm::ReduceOp::kMax;
  // Through scratch that outlives the call if a collective is abandoned (MPI cannot cancel
  // one): the caller's buffer is never written after the call returns.
  auto scratch = std::make_unique<float[]>(static_cast<size_t>(count));
  std::copy_n(data, count, scratch.get());
  // In pieces of at most 2^28 values: MPI counts are ints.
  constexpr int64_t kPiece = int64_t{1} << 28;
  for (int64_t first = 0; first < count; first += kPiece) {
    float* piece = scratch.get() + first;
    const zero::Status status =
        comm->comm->AllReduce(piece, piece, std::min(kPiece, count - first), zero::DType::kFP32, reduce,
                              zero::comm::kTrainerValuesTag)
            ->Wait(timeout_s);
    if (!status.ok()) {
      if (comm->comm->AbandonedWorkMayTouchBuffers()) scratch.release();  // a deliberate leak
      return Report(status);
    }
  }
  std::copy_n(scratch.get(), count, data);
  return ZERO_OK;
} ZERO_C_CATCH("zero_comm_all_reduce_f32")

zero_status zero_config_normalize(const char* config_json, const char** out) try {
  ZERO_C_REQUIRE(config_json, "zero_config_normalize");
  ZERO_C_REQUIRE(out, "zero_config_normalize");
  thread_local std::string normalized;
  auto result = zero::NormalizeConfigJson(config_json);
  if (!result.ok()) return Report(result.status());
  normalized = std::move(*result);
  *out = normalized.c_str();
  return ZERO_OK;
} ZERO_C_CATCH("zero_config_normalize")

int zero_config_is_deepspeed(const char* config_json) try {
  return config_json != nullptr && zero::IsDeepSpeedConfigJson(config_json) ? 1 : 0;
} catch (...) {
  return 0;  // only a failed allocation while parsing: not told apart, as for text that is no JSON
}

}  // extern "C"
