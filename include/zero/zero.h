/* ZeroRT's C ABI: the engine from C, and from Python through ctypes with no compiled glue.
 *
 * Every call returns a zero_status (0 = ZERO_OK); zero_last_error() gives the calling
 * thread's message for its last failed call. Objects are opaque handles created and
 * destroyed here. The calls mirror the C++ API (zero/engine.h) one to one (zero_accumulate_grads:
 * several AccumulateGrad calls in one, for callers whose per-call cost matters); the config is the
 * JSON described in zero/config.h (NULL for the defaults; "" is refused as an empty config,
 * which is more often a file that failed to load than a choice: pass "{}").
 *
 *   zero_comm* comms[2];  zero_comm_local_group(2, comms);        // or zero_comm_mpi(NULL, &c)
 *   zero_engine* e;       zero_engine_create("{\"stage\": 2}", comms[rank], &e);
 *   int64_t shape[2] = {out, in}, id;
 *   zero_register_param(e, "fc.weight", shape, 2, ZERO_FP32, 1, 0, -1, &id);
 *   zero_finalize(e);  zero_set_param(e, id, values);
 *   loop: zero_begin_iteration(e); ... zero_accumulate_grad(e, id, grad); ...
 *         zero_end_backward(e); zero_step(e, &info);
 */
#ifndef ZERO_ZERO_H_
#define ZERO_ZERO_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ZERO_API __attribute__((visibility("default")))
#else
#define ZERO_API
#endif

typedef enum { ZERO_FP32 = 0, ZERO_BF16 = 1, ZERO_FP16 = 2 } zero_dtype;

typedef enum {
  ZERO_OK = 0,
  ZERO_CANCELLED = 1, /* a collective abandoned by a rank; the communicator group is broken */
  ZERO_UNKNOWN = 2,
  ZERO_INVALID_ARGUMENT = 3,
  ZERO_DEADLINE_EXCEEDED = 4,
  ZERO_NOT_FOUND = 5,
  ZERO_ALREADY_EXISTS = 6,
  ZERO_RESOURCE_EXHAUSTED = 8,
  ZERO_FAILED_PRECONDITION = 9,
  ZERO_ABORTED = 10, /* another rank failed a collective operation (its error says why), or
                        the run cannot go on (an overflow at the minimum loss scale) */
  ZERO_UNIMPLEMENTED = 12,
  ZERO_INTERNAL = 13,
  ZERO_UNAVAILABLE = 14,
  ZERO_DATA_LOSS = 15, /* a damaged checkpoint, or replicas that differ (replica_check_every) */
  ZERO_DUPLICATE_GRADIENT = 100,
  ZERO_UNUSED_PARAMETERS = 101
} zero_status;

/** One Step()'s outcome. */
typedef struct {
  int64_t step;      /* optimizer steps taken so far */
  int skipped;       /* 1: an Inf/NaN gradient was found, nothing changed (only with a loss
                        scale: loss_scale.mode "static" or "dynamic") */
  float grad_norm;   /* global L2 norm of the averaged, unscaled gradient; NaN when the step
                        left it on the device ("sync_grad_norm": false): zero_last_grad_norm */
  float loss_scale;  /* multiply the next loss by this */
} zero_step_info;

enum {
  ZERO_MEM_PARAMS,
  ZERO_MEM_GRADS,
  ZERO_MEM_OPTIMIZER,
  ZERO_MEM_COMM,
  ZERO_MEM_GATHERED,
  ZERO_MEM_WORKSPACE,
  ZERO_MEM_CATEGORIES
};

/** Bytes held now and at peak, per ZERO_MEM_* category. The struct and the function that
 * fills it share the name `zero_memory_stats`; C allows that only for a struct tag, so the
 * type is spelled `struct zero_memory_stats` (no typedef). */
struct zero_memory_stats {
  int64_t current[ZERO_MEM_CATEGORIES];
  int64_t peak[ZERO_MEM_CATEGORIES];
};

typedef struct zero_comm zero_comm;
typedef struct zero_engine zero_engine;

/** The calling thread's message for its last failed call ("" if none). */
ZERO_API const char* zero_last_error(void);
/** "ZeroRT 0.1.0 (cuda: …, mpi: …, cpu isa: …)". */
ZERO_API const char* zero_version(void);

/** Creates `world` (1 to 4096) in-process ranks; comms[r] is rank r (use each from one thread). */
ZERO_API zero_status zero_comm_local_group(int world, zero_comm** comms);
/** An MPI communicator over `*(MPI_Comm*)mpi_comm`, or MPI_COMM_WORLD when NULL. */
ZERO_API zero_status zero_comm_mpi(const void* mpi_comm, zero_comm** out);
/** An NCCL communicator (device buffers, one rank per GPU) over the ranks of `bootstrap`, which
 *  carries the ncclUniqueId from its rank 0 (collective over `bootstrap`; it may be destroyed
 *  afterwards). `device`: this rank's CUDA device (-1: the calling thread's current one);
 *  `cuda_stream`: the cudaStream_t the trainer computes on (NULL: the legacy default stream),
 *  after whose queued work each collective starts. ZERO_UNIMPLEMENTED in builds without NCCL,
 *  ZERO_UNAVAILABLE without a GPU. */
ZERO_API zero_status zero_comm_nccl(zero_comm* bootstrap, int device, void* cuda_stream, zero_comm** out);
/** Collective kinds of a zero_collective. */
enum {
  ZERO_COLL_REDUCE_SCATTER = 0,
  ZERO_COLL_ALL_GATHER = 1,
  ZERO_COLL_ALL_REDUCE = 2,
  ZERO_COLL_BROADCAST = 3,
  ZERO_COLL_BARRIER = 4
};
/** Element types of a zero_collective besides zero_dtype's (ZERO_FP32, ZERO_BF16, ZERO_FP16). */
enum { ZERO_COLL_INT64 = 3, ZERO_COLL_UINT8 = 4 };

/** One collective a zero_collectives table runs; `count` is elements per rank. Buffers are host
 *  memory. REDUCE_SCATTER: send size·count, recv count (rank r gets the reduction of chunk r);
 *  ALL_GATHER: send count, recv size·count (chunk r is rank r's send); ALL_REDUCE: count each;
 *  BROADCAST: recv (== send) holds `count` elements, the root's everywhere; BARRIER: none.
 *  Sends may overlap receives (in place). `op`: 0 sum, 1 max; sums of BF16/FP16 must
 *  accumulate in fp32. `channel` 0 carries gradients and params, 1 values and checks: two
 *  ordered streams of collectives, the same on every rank, to run on separate groups. */
typedef struct zero_collective {
  int kind;
  const void* send;
  void* recv;
  int64_t count;
  int dtype;
  int op;
  int root;
  int channel;
} zero_collective;

/** A trainer's own collectives, for zero_comm_external. Each returns a zero_status and, on
 *  failure, may write a NUL-terminated message into message[0..capacity). Calls come from the
 *  thread that issues or waits, one at a time per communicator. */
typedef struct zero_collectives {
  void* context;
  /** Starts `collective`; stores a handle of the table's choosing in *handle. */
  zero_status (*start)(void* context, const zero_collective* collective, int64_t* handle, char* message,
                       size_t capacity);
  /** Waits for it: ZERO_OK, ZERO_DEADLINE_EXCEEDED after timeout_s seconds (0: no limit), or
   *  its error. */
  zero_status (*wait)(void* context, int64_t handle, double timeout_s, char* message, size_t capacity);
  /** 1 once it completed (either way), else 0; never blocks. */
  int (*test)(void* context, int64_t handle);
  /** The handle is no longer used (waited for, or abandoned: the group is then broken). */
  void (*release)(void* context, int64_t handle);
  /** Called once when the communicator and its collectives are gone; may be NULL. */
  void (*destroy)(void* context);
} zero_collectives;

/** This rank's communicator of a group of `size` whose collectives `collectives` (copied; its
 *  context must live until destroy) runs: zerort.torch's over torch.distributed, for torchrun
 *  launches. `ranks_on_this_host`: ranks sharing this machine's cores (1 ≤ it ≤ size).
 *  Tagged collectives (values, checks) are first compared across ranks on channel 1, waiting
 *  at most `check_timeout_s` (0: no limit); ranks that diverge get ZERO_INVALID_ARGUMENT naming
 *  both. On error no function of the table has been called. */
ZERO_API zero_status zero_comm_external(int rank, int size, int ranks_on_this_host, double check_timeout_s,
                                        const zero_collectives* collectives, zero_comm** out);
ZERO_API int zero_comm_rank(const zero_comm* comm);
ZERO_API int zero_comm_size(const zero_comm* comm);
ZERO_API void zero_comm_destroy(zero_comm* comm);
/** Copies `bytes` bytes at `data` (host memory) from rank `root` to every rank, bit for bit
 *  (any element type: frozen weights, buffers, RNG states). Collective; waits at most
 *  timeout_s seconds (0: forever). Ranks that pass different sizes (in-process and MPI
 *  communicators) get ZERO_INVALID_ARGUMENT naming both, and the communicator is broken from
 *  then on (its later collectives, and its engines', fail: the ranks went different ways; make
 *  a new one); a root that is no rank of `comm` is ZERO_INVALID_ARGUMENT before any collective
 *  (the communicator stays usable). */
ZERO_API zero_status zero_comm_broadcast_bytes(zero_comm* comm, void* data, int64_t bytes, int root,
                                               double timeout_s);
/** Ends every process of the MPI job with `exit_code` (MPI_Abort on MPI_COMM_WORLD), for a
 *  rank that fails outside any collective (an uncaught exception), so its peers end at once
 *  instead of waiting for it in a collective or in MPI_Finalize. Never called by the library.
 *  ZERO_FAILED_PRECONDITION when MPI is not initialised or already finalised,
 *  ZERO_UNIMPLEMENTED in builds without MPI. */
ZERO_API zero_status zero_abort_mpi_job(int exit_code);

/** An engine for this rank on `comm`'s communicator, which the engine keeps alive:
 *  zero_comm_destroy(comm) may come before zero_engine_destroy (the communicator goes with the
 *  last of the two). */
ZERO_API zero_status zero_engine_create(const char* config_json, zero_comm* comm, zero_engine** out);
ZERO_API void zero_engine_destroy(zero_engine* engine);

ZERO_API zero_status zero_register_param(zero_engine* engine, const char* name, const int64_t* shape,
                                         int ndim, zero_dtype dtype, int requires_grad, int group,
                                         int unit, int64_t* id);
/** Another name of param `id` (a tied weight's), before zero_finalize: checkpoints record it,
 *  and zero-ckpt consolidate writes the values under every name. See Engine::AddParamAlias. */
ZERO_API zero_status zero_add_param_alias(zero_engine* engine, int64_t id, const char* alias);
ZERO_API zero_status zero_finalize(zero_engine* engine);
/** Device "cuda": the cudaStream_t the trainer computes on (NULL: the legacy default stream). */
ZERO_API zero_status zero_set_stream(zero_engine* engine, void* cuda_stream);
/** Copies a full value (host memory, the param's dtype) into the param. */
ZERO_API zero_status zero_set_param(zero_engine* engine, int64_t id, const void* host_src);
/** Copies the param's full value out (collective at stage 3). */
ZERO_API zero_status zero_get_param(zero_engine* engine, int64_t id, void* host_dst);
/** A view of the param's full value (stages 0-2). */
ZERO_API zero_status zero_param_data(zero_engine* engine, int64_t id, void** view);
/** A view into which this micro-batch's gradient is added; then zero_grad_ready. It holds the
 *  gradient dtype: fp32 for bf16/fp16 params under the default precision.grad "fp32". */
ZERO_API zero_status zero_grad_buffer(zero_engine* engine, int64_t id, void** view);
ZERO_API zero_status zero_grad_ready(zero_engine* engine, int64_t id);
/** guard.on_unused = "zero": the param gets no gradient in this micro-batch (an idle expert);
 *  it completes now with zeros without counting as used (see Engine::GradAbsent). */
ZERO_API zero_status zero_grad_absent(zero_engine* engine, int64_t id);
/** Adds a full gradient (host, the param's dtype; widened into an fp32 gradient) and marks the
 *  param ready. */
ZERO_API zero_status zero_accumulate_grad(zero_engine* engine, int64_t id, const void* grad);
/** zero_accumulate_grad for a gradient in the device memory of a "cuda" engine (a CUDA tensor's
 *  data), without asking the driver where `grad` points (one call less per gradient). */
ZERO_API zero_status zero_accumulate_device_grad(zero_engine* engine, int64_t id, const void* grad);
/** zero_accumulate_grad for a gradient left unchanged where it is until a step returns
 *  successfully: where a copy is all the engine would do (the param's first gradient in the
 *  step's last micro-batch, no widening; one rank, or a param that fills its bucket alone,
 *  whose reduction then reads it), it reads it there instead; *kept says whether it did (0:
 *  it was copied). `on_device`: the gradient is the engine's device memory. See
 *  Engine::LendGrad. */
ZERO_API zero_status zero_lend_grad(zero_engine* engine, int64_t id, const void* grad, int on_device,
                                    int* kept);
/** Flags of zero_accumulate_grads. */
enum {
  ZERO_GRADS_ON_DEVICE = 1, /* every gradient is the engine's device memory (as for
                               zero_accumulate_device_grad) */
  ZERO_GRADS_LEND = 2       /* lend each one, as zero_lend_grad */
};
/** `count` gradients in one call: gradient i of param ids[i] at grads[i], handed over in order
 *  exactly as zero_accumulate_grad (zero_accumulate_device_grad with ZERO_GRADS_ON_DEVICE,
 *  zero_lend_grad with ZERO_GRADS_LEND) would one at a time; for a trainer whose per-call cost
 *  matters (Python, many small params). *handed: how many were handed over (count on success;
 *  0 when the call's own arguments are refused); on a failure the status and zero_last_error()
 *  are those of gradient *handed, and the ones after it were not looked at. `kept`: with
 *  ZERO_GRADS_LEND, kept[i] as zero_lend_grad sets it, for each handed gradient; ignored (may
 *  be NULL) without. */
ZERO_API zero_status zero_accumulate_grads(zero_engine* engine, int64_t count, const int64_t* ids,
                                           const void* const* grads, int flags, int* kept,
                                           int64_t* handed);
/** Collective, between steps: the params' replicas made equal to rank 0's (or checked equal)
 *  now, as the first zero_begin_iteration does; see Engine::SyncReplicas. */
ZERO_API zero_status zero_sync_replicas(zero_engine* engine);
ZERO_API zero_status zero_begin_iteration(zero_engine* engine);
ZERO_API zero_status zero_end_backward(zero_engine* engine);
ZERO_API zero_status zero_step(zero_engine* engine, zero_step_info* info);
/** Drops the gradients of the micro-batches ended since the last step (the trainer skips
 *  it); collective. See Engine::DropGradients. */
ZERO_API zero_status zero_drop_gradients(zero_engine* engine);
/** A micro-batch whose backward did not finish (the trainer skips the batch): ends it, the
 *  missing gradients counting as zeros, then zero_drop_gradients; collective. See
 *  Engine::AbandonMicroBatch. */
ZERO_API zero_status zero_abandon_micro_batch(zero_engine* engine);
/** The last step's global gradient norm, read from the device when the step left it there
 *  ("sync_grad_norm": false; one wait for the device). ZERO_FAILED_PRECONDITION before a step. */
ZERO_API zero_status zero_last_grad_norm(zero_engine* engine, float* norm);
/** FSDP's clip_grad_norm_ (Engine::ClipGradNorm): after the step's last zero_end_backward and
 *  before zero_step, the global norm of the gradient that step applies into `*norm`, and that
 *  step clips to `max_norm` (0 or +inf: none) instead of the config's clip_grad_norm. Collective; every
 *  rank passes the same max_norm. */
ZERO_API zero_status zero_clip_grad_norm(zero_engine* engine, float max_norm, float* norm);
/** Which full fp32 value of a trainable param zero_get_full_state copies out. */
typedef enum {
  ZERO_STATE_WEIGHTS = 0,        /* the fp32 master weights */
  ZERO_STATE_FIRST_MOMENT = 1,   /* exp_avg (AdamW, Adam, LAMB, Lion), SGD's momentum */
  ZERO_STATE_SECOND_MOMENT = 2,  /* exp_avg_sq (AdamW, Adam, LAMB) */
  ZERO_STATE_GRAD = 3            /* the gradient the next step applies (averaged, unscaled) */
} zero_param_state;
/** Copies trainable param `id`'s full `state` as numel fp32 values into host_dst on every
 *  rank; collective at stages 1-3. ZERO_STATE_GRAD exists between the step's last
 *  zero_end_backward and zero_step. See Engine::GetFullState. */
ZERO_API zero_status zero_get_full_state(zero_engine* engine, int64_t id, zero_param_state state,
                                         float* host_dst);
/** Sets trainable param `id`'s full `state` (ZERO_STATE_WEIGHTS, which also sets the param
 *  rounded to its dtype, or a moment) from numel fp32 values at host_src. Collective: every rank
 *  calls it with the same values and keeps its part. Between micro-batches. See Engine::SetFullState. */
ZERO_API zero_status zero_set_full_state(zero_engine* engine, int64_t id, zero_param_state state,
                                         const float* host_src);
/** Stage 3: gather a unit's params for compute / release them (no-ops at stages 0-2). */
ZERO_API zero_status zero_gather(zero_engine* engine, int unit);
ZERO_API zero_status zero_release(zero_engine* engine, int unit);
/** Stage 3: zero_release at the end of a unit's forward whose backward follows: a unit the
 *  recorded gather order gathers again before stage3.max_reuse_elems elements of other units
 *  stays gathered for that backward (Engine::ReleaseUntilBackward); write nothing into its
 *  views until the next zero_gather of it. zero_release always frees. */
ZERO_API zero_status zero_release_until_backward(zero_engine* engine, int unit);
/** Stage 3: frees every gathered unit the trainer does not hold (prefetched, kept for
 *  backward, buffers kept for reuse), as DeepSpeed's empty_partition_cache; every rank calls it
 *  at the same point (Engine::ReleaseCachedUnits). ZERO_OK at stages 0-2. */
ZERO_API zero_status zero_release_cached_units(zero_engine* engine);
/** Stage 3: where param `id`'s values sit in its unit's gathered memory: the unit, the byte
 *  offset, the unit's gathered bytes, and whether the unit is persistent (held by the engine,
 *  never lent). ZERO_FAILED_PRECONDITION below stage 3. */
ZERO_API zero_status zero_gathered_place(const zero_engine* engine, int64_t id, int* unit,
                                         int64_t* offset_bytes, int64_t* unit_bytes, int* persistent);
/** Lends the engine `bytes` bytes for stage-3 unit `unit`'s gathered values: sets *memory and
 *  returns ZERO_OK, or returns an error code (the gather that needed it fails). */
typedef zero_status (*zero_lend_fn)(void* user, int unit, int64_t bytes, void** memory);
/** The engine is done with the memory lent for `unit` (see GatheredMemoryLender). */
typedef void (*zero_give_back_fn)(void* user, int unit);
/** Stage 3: gathered units live in memory `lend` lends from now on, given back through
 *  `give_back` (both called on the thread calling into the engine, with `user`); both null
 *  stops lending: prefetched units are given back first, nothing after, and an error says the
 *  group broke (keep lent memory then). See Engine::LendGatheredMemory. */
ZERO_API zero_status zero_lend_gathered_memory(zero_engine* engine, zero_lend_fn lend,
                                               zero_give_back_fn give_back, void* user);
/** Checkpoints: collective; load works at any world size and stage (see zero/engine.h). */
ZERO_API zero_status zero_save_checkpoint(zero_engine* engine, const char* dir);
/** Writes checkpoint root/tag, then points root/latest at it and keeps the newest
 *  checkpoint.keep_last; zero_load_checkpoint(root) loads the latest. */
ZERO_API zero_status zero_save_checkpoint_tagged(zero_engine* engine, const char* root, const char* tag);
ZERO_API zero_status zero_load_checkpoint(zero_engine* engine, const char* dir);
/** Preemption (zero/preemption.h): SIGTERM and SIGUSR1 only record a request; every rank
 *  polls zero_preemption_requested between steps (collective; the same answer everywhere),
 *  saves a checkpoint and exits. */
ZERO_API zero_status zero_install_preemption_handler(void);
ZERO_API zero_status zero_preemption_requested(zero_engine* engine, int* requested);
/** The trainer's own state (UTF-8 text, e.g. JSON; other bytes are ZERO_INVALID_ARGUMENT)
 *  saved inside the next checkpoints (rank 0's). */
ZERO_API zero_status zero_set_checkpoint_user_data(zero_engine* engine, const char* data);
/** The trainer state of the checkpoint last loaded ("" if none): owned by the engine, valid
 *  until the next zero_load_checkpoint or zero_engine_destroy. */
ZERO_API zero_status zero_checkpoint_user_data(const zero_engine* engine, const char** data);
ZERO_API zero_status zero_memory_stats(const zero_engine* engine, struct zero_memory_stats* out);
/** What the engine has done so far (zero/engine.h, EngineCounters). Fields are only ever added
 *  at the end. */
typedef struct {
  int64_t reductions_launched, reductions_before_end_backward, pool_waits;
  int64_t gathers_prefetched, gathers_on_demand, trace_invalidations, checkpoint_bytes_read;
  int64_t grad_bytes_copied, host_waits, gather_allocations, releases_kept;
  int64_t pool_buffers_added;
} zero_engine_counters_t;
/** Fills the first `size` bytes of `*out` (whole fields): pass sizeof(zero_engine_counters_t),
 *  so that a program built against an older header, whose struct is shorter, gets the fields
 *  it knows and nothing is written past them. kInvalidArgument when `size` is not a whole
 *  number of fields. */
ZERO_API zero_status zero_engine_counters_sized(const zero_engine* engine, zero_engine_counters_t* out,
                                                size_t size);
/** The first seven fields only (the struct of programs built before grad_bytes_copied was
 *  added); the others are left as they were: use zero_engine_counters_sized. */
ZERO_API zero_status zero_engine_counters(const zero_engine* engine, zero_engine_counters_t* out);
/** One optimizer group's hyperparameters (zero/config.h, OptimizerHyper). */
typedef struct {
  float lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  int nesterov;
} zero_group_hyper;
/** Number of optimizer groups (one more than the largest group registered, or the length of
 *  optimizer.param_groups). */
ZERO_API zero_status zero_num_groups(const zero_engine* engine, int* groups);
/** A group's hyperparameters for the next step (with a scheduler, the schedule's lr). */
ZERO_API zero_status zero_get_group_hyper(const zero_engine* engine, int group, zero_group_hyper* out);
/** Sets a group's hyperparameters for the following steps (between steps; the same on every
 *  rank; the config's ranges apply). */
ZERO_API zero_status zero_set_group_hyper(zero_engine* engine, int group, const zero_group_hyper* hyper);
/** Shorthands for the learning rate alone. */
ZERO_API zero_status zero_set_lr(zero_engine* engine, int group, float lr);
ZERO_API zero_status zero_get_lr(const zero_engine* engine, int group, float* lr);
/** The loss scale to multiply the next loss by (1 without loss scaling; after
 *  zero_load_checkpoint, the checkpoint's when the engine scales dynamically). */
ZERO_API zero_status zero_loss_scale(const zero_engine* engine, float* scale);
/** The scheduler's position (DeepSpeed's last_batch_iteration; -1 before the first applied
 *  step, and without a scheduler). */
ZERO_API zero_status zero_lr_schedule_iteration(const zero_engine* engine, int64_t* iteration);
/** Reduces `count` fp32 values at `data` (host memory) over every rank of `comm`, in place:
 *  op 0 sum, 1 max (a trainer's metrics: loss, token counts). Collective; waits at most
 *  timeout_s seconds (0: forever); `data` is never written after the call returns. Ranks
 *  that pass different counts or ops (in-process and MPI communicators) get
 *  ZERO_INVALID_ARGUMENT naming both, and the communicator is broken from then on, as above
 *  (zero_comm_broadcast_bytes). ZERO_UNIMPLEMENTED for an NCCL communicator (device memory
 *  only). */
ZERO_API zero_status zero_comm_all_reduce_f32(zero_comm* comm, float* data, int64_t count, int op,
                                              double timeout_s);
/** Translates `config_json` (ZeroRT or DeepSpeed JSON text; a DeepSpeed config is recognised
 *  by its top-level keys) into ZeroRT JSON and checks it as zero_engine_create would; `*out`
 *  is owned by the calling thread, valid until its next call. */
ZERO_API zero_status zero_config_normalize(const char* config_json, const char** out);
/** 1 when `config_json` is a DeepSpeed config (as zero_config_normalize tells them apart:
 *  DeepSpeed's own top-level keys, an optimizer with "params", DeepSpeed's checkpoint keys),
 *  0 otherwise (also for NULL or text that is not a JSON object). */
ZERO_API int zero_config_is_deepspeed(const char* config_json);

/** Reading a checkpoint without an engine or ranks (zero/checkpoint.h): what zero-ckpt
 *  inspects and consolidates, for a trainer that wants the full fp32 params in one process
 *  (DeepSpeed's zero_to_fp32).
 *
 *    zero_ckpt_reader* r;  zero_ckpt_open("ckpt", &r);   // or a series root with `latest`
 *    const char* json;     zero_ckpt_describe(r, &json);  // names, shapes, aliases, step, ...
 *    zero_ckpt_verify(r);  zero_ckpt_read_param(r, 0, values);  zero_ckpt_close(r);
 */
typedef struct zero_ckpt_reader zero_ckpt_reader;
/** Opens checkpoint `dir` (or the one `dir`/latest names): reads meta.json and every rank
 *  file's index. Fails when meta.json is missing or damaged, naming the field. */
ZERO_API zero_status zero_ckpt_open(const char* dir, zero_ckpt_reader** out);
/** What the checkpoint holds, as a JSON object owned by the reader (valid until its next
 *  zero_ckpt_describe or zero_ckpt_close): "dir" (the checkpoint itself, after `latest`),
 *  "format", "world", "stage", "step", "optimizer", "loss_scale", "user_data" (the text
 *  zero_set_checkpoint_user_data saved) and "params": one object per param in registration
 *  order with "name", "shape", "dtype" (trained in; the records are fp32), "numel",
 *  "requires_grad", "saved" (false: a frozen param saved without checkpoint.save_frozen,
 *  which zero_ckpt_read_param refuses) and "aliases" (its other names: a tied weight's). */
ZERO_API zero_status zero_ckpt_describe(zero_ckpt_reader* reader, const char** json);
/** Reads every record and checks its checksum, and that the records cover every element of
 *  every saved param exactly once: ZERO_DATA_LOSS (or ZERO_INVALID_ARGUMENT) naming the file
 *  otherwise. */
ZERO_API zero_status zero_ckpt_verify(zero_ckpt_reader* reader);
/** The full fp32 value of param `index` (its "numel" floats into `out`), assembled from every
 *  rank file. ZERO_FAILED_PRECONDITION for a param not saved; ZERO_DATA_LOSS for a damaged
 *  record. */
ZERO_API zero_status zero_ckpt_read_param(zero_ckpt_reader* reader, int64_t index, float* out);
/** Frees the reader (NULL is a no-op). */
ZERO_API void zero_ckpt_close(zero_ckpt_reader* reader);
/** The checkpoint directory a load of `dir` reads (the tag `dir`/latest names; `dir` itself
 *  when it holds meta.json; the newest checkpoint in it when a series' first save stopped
 *  before writing `latest`; else `dir`), without reading it: `*out` is owned by the calling
 *  thread, valid until its next call. ZERO_INVALID_ARGUMENT for a damaged `latest`. */
ZERO_API zero_status zero_ckpt_resolve(const char* dir, const char** out);

/** Rank and world size of the engine's group. */
ZERO_API int zero_engine_rank(const zero_engine* engine);
ZERO_API int zero_engine_world_size(const zero_engine* engine);

#ifdef __cplusplus
}
#endif

#endif /* ZERO_ZERO_H_ */
