/* The C ABI's optimizer groups, learning rates, schedule position, config normalisation,
 * metric all-reduce, counters, the last step's norm, the norm before a step (zero_clip_grad_norm) and a param's
 * full state, as a C trainer calls them, and an engine outliving its zero_comm handle. One in-process
 * rank; plain SGD, so that each step moves a param by exactly -lr * gradient and shows the lr its group stepped with.
 * Exits 0 when every check holds, 1 naming the first that does not. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zero/zero.h"

#define CHECK_PROGRAM "groups_test"
#include "tests/capi/check.h"

#if defined(__SANITIZE_ADDRESS__)
#define ZERO_UNDER_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#define ZERO_UNDER_ADDRESS_SANITIZER __has_feature(address_sanitizer)
#else
#define ZERO_UNDER_ADDRESS_SANITIZER 0
#endif

enum { kNumel = 37 };

/* One SGD step with gradient 1 everywhere; returns how far each param moved (its lr). */
static void StepAndMeasure(zero_engine* engine, float moved[2]) {
  float before[2][kNumel], after[2][kNumel], grad[kNumel];
  for (int i = 0; i < kNumel; ++i) grad[i] = 1.0f;
  for (int p = 0; p < 2; ++p) CHECK_OK(zero_get_param(engine, p, before[p]));
  CHECK_OK(zero_begin_iteration(engine));
  for (int p = 1; p >= 0; --p) CHECK_OK(zero_accumulate_grad(engine, p, grad));
  CHECK_OK(zero_end_backward(engine));
  float full[kNumel];
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < kNumel; ++i) full[i] = NAN;
    CHECK_OK(zero_get_full_state(engine, p, ZERO_STATE_GRAD, full));
    for (int i = 0; i < kNumel; ++i) CHECK(full[i] == 1.0f, "full gradient %d[%d] is %g", p, i, full[i]);
  }
  CHECK(zero_get_full_state(engine, 0, ZERO_STATE_SECOND_MOMENT, full) == ZERO_NOT_FOUND, "SGD has no second moment");
  CHECK(zero_get_full_state(engine, 0, (zero_param_state)7, full) == ZERO_INVALID_ARGUMENT, "state 7 accepted");
  /* FSDP's clip_grad_norm_ with max_norm 0: the norm now, and the step not clipped. */
  float before_step = -1.0f;
  CHECK_OK(zero_clip_grad_norm(engine, 0.0f, &before_step));
  CHECK(fabsf(before_step - sqrtf(2.0f * kNumel)) < 1e-5f, "zero_clip_grad_norm gave %g", before_step);
  CHECK(zero_clip_grad_norm(engine, 0.0f, NULL) == ZERO_INVALID_ARGUMENT, "a NULL norm accepted");
  zero_step_info info;
  CHECK_OK(zero_step(engine, &info));
  CHECK(zero_get_full_state(engine, 0, ZERO_STATE_GRAD, full) == ZERO_FAILED_PRECONDITION, "a gradient after the step");
  CHECK(zero_clip_grad_norm(engine, 0.0f, &before_step) == ZERO_FAILED_PRECONDITION, "a norm after the step");
  /* Each gradient is 1 everywhere on one rank: the norm is sqrt(2 * kNumel). */
  float norm = -1.0f;
  CHECK_OK(zero_last_grad_norm(engine, &norm));
  CHECK(norm == info.grad_norm && fabsf(norm - sqrtf(2.0f * kNumel)) < 1e-5f,
        "zero_last_grad_norm gave %g, the step's info %g", norm, info.grad_norm);
  for (int p = 0; p < 2; ++p) {
    CHECK_OK(zero_get_param(engine, p, after[p]));
    CHECK_OK(zero_get_full_state(engine, p, ZERO_STATE_WEIGHTS, full));
    CHECK(memcmp(full, after[p], sizeof full) == 0, "the fp32 master of %d is not the param", p);
    moved[p] = before[p][kNumel - 1] - after[p][kNumel - 1];
  }
}

int main(void) {
  zero_comm* comm = NULL;
  CHECK_OK(zero_comm_local_group(1, &comm));
  /* Group 1 overrides the lr; WarmupLR warms both groups linearly from 0 to their own lr over
   * 2 steps (warmup_max_lr not given: each group's lr, as DeepSpeed). */
  const char* config =
      "{\"stage\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.5, \"weight_decay\": 0.0,"
      " \"param_groups\": [{}, {\"lr\": 0.25}]},"
      " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 2,"
      " \"warmup_type\": \"linear\"}}}";
  zero_engine* engine = NULL;
  CHECK_OK(zero_engine_create(config, comm, &engine));
  const int64_t shape[1] = {kNumel};
  int64_t id = 0;
  CHECK_OK(zero_register_param(engine, "w", shape, 1, ZERO_FP32, 1, 0, -1, &id));
  CHECK_OK(zero_register_param(engine, "b", shape, 1, ZERO_FP32, 1, 1, -1, &id));
  CHECK_OK(zero_finalize(engine));
  float no_norm = 0.0f;
  CHECK(zero_last_grad_norm(engine, &no_norm) == ZERO_FAILED_PRECONDITION, "a norm before the first step");
  float values[kNumel];
  for (int i = 0; i < kNumel; ++i) values[i] = 1.0f + 0.01f * (float)i;
  CHECK_OK(zero_set_param(engine, 0, values));
  CHECK_OK(zero_set_param(engine, 1, values));

  int groups = 0;
  CHECK_OK(zero_num_groups(engine, &groups));
  CHECK(groups == 2, "zero_num_groups gave %d", groups);
  int64_t iteration = 0;
  CHECK_OK(zero_lr_schedule_iteration(engine, &iteration));
  CHECK(iteration == -1, "schedule iteration %lld before the first step", (long long)iteration);

  /* DeepSpeed's WarmupLR: step 1 at it = -1 (min lr 0), step 2 at it = 0 (0), step 3 at it = 1
   * (half way), step 4 on: the group's lr. */
  const float expected[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.25f, 0.125f}, {0.5f, 0.25f}};
  for (int step = 0; step < 4; ++step) {
    float lr = -1.0f, moved[2];
    CHECK_OK(zero_get_lr(engine, 1, &lr));
    CHECK(fabsf(lr - expected[step][1]) < 1e-6f, "step %d: zero_get_lr(1) = %g", step + 1, lr);
    StepAndMeasure(engine, moved);
    for (int g = 0; g < 2; ++g) {
      CHECK(fabsf(moved[g] - expected[step][g]) < 1e-5f, "step %d group %d moved %g, expected %g", step + 1, g,
            moved[g], expected[step][g]);
    }
  }
  CHECK_OK(zero_lr_schedule_iteration(engine, &iteration));
  CHECK(iteration == 3, "schedule iteration %lld after 4 steps", (long long)iteration);

  /* zero_set_lr between steps: the next step uses it (the schedule sets it again after). */
  CHECK_OK(zero_set_lr(engine, 0, 0.125f));
  float moved[2];
  StepAndMeasure(engine, moved);
  CHECK(fabsf(moved[0] - 0.125f) < 1e-5f, "after zero_set_lr group 0 moved %g", moved[0]);

  /* The whole group's hyperparameters, and refusals that name what is wrong. */
  zero_group_hyper hyper;
  CHECK_OK(zero_get_group_hyper(engine, 1, &hyper));
  CHECK(hyper.weight_decay == 0.0f && hyper.nesterov == 0, "group 1: weight_decay %g", hyper.weight_decay);
  hyper.momentum = 2.0f;
  CHECK(zero_set_group_hyper(engine, 1, &hyper) == ZERO_INVALID_ARGUMENT, "momentum 2 accepted");
  CHECK(strstr(zero_last_error(), "momentum") != NULL, "message: %s", zero_last_error());
  CHECK(zero_set_lr(engine, 5, 0.1f) == ZERO_INVALID_ARGUMENT, "group 5 accepted");
  CHECK(strstr(zero_last_error(), "group 5") != NULL, "message: %s", zero_last_error());

  /* Metrics: an all-reduce over the engine's communicator (one rank: sum and max are the value). */
  float metrics[3] = {1.5f, -2.0f, 4.0f};
  CHECK_OK(zero_comm_all_reduce_f32(comm, metrics, 3, 0, 10.0));
  CHECK(metrics[0] == 1.5f && metrics[1] == -2.0f && metrics[2] == 4.0f, "sum over one rank changed values");
  CHECK(zero_comm_all_reduce_f32(comm, metrics, 3, 7, 10.0) == ZERO_INVALID_ARGUMENT, "op 7 accepted");
  CHECK(zero_comm_all_reduce_f32(comm, metrics, 3, 0, -1.0) == ZERO_INVALID_ARGUMENT, "timeout -1 accepted");
#if !ZERO_UNDER_ADDRESS_SANITIZER /* its operator new stops the process instead of throwing */
  /* A count whose scratch copy no machine can allocate is a status, not an exception that ends
   * the process (the library never reads that far into `metrics`). */
  CHECK(zero_comm_all_reduce_f32(comm, metrics, INT64_MAX / 8, 0, 10.0) == ZERO_RESOURCE_EXHAUSTED,
        "an impossible scratch allocation: %s", zero_last_error());
  CHECK(strstr(zero_last_error(), "zero_comm_all_reduce_f32: out of host memory") != NULL, "message: %s",
        zero_last_error());
#endif
  /* A broadcast's timeout too (a negative one waited forever), checked before any byte moves. */
  unsigned char bytes[4] = {1, 2, 3, 4};
  CHECK(zero_comm_broadcast_bytes(comm, bytes, 4, 0, -1.0) == ZERO_INVALID_ARGUMENT, "timeout -1 accepted");
  CHECK(strstr(zero_last_error(), "timeout_s") != NULL, "message: %s", zero_last_error());
  /* A root that is no rank is refused before any collective: the communicator stays usable. */
  CHECK(zero_comm_broadcast_bytes(comm, bytes, 4, 1, 10.0) == ZERO_INVALID_ARGUMENT, "root 1 of 1 accepted");
  CHECK(strstr(zero_last_error(), "root 1") != NULL, "message: %s", zero_last_error());
  CHECK_OK(zero_comm_broadcast_bytes(comm, bytes, 4, 0, 10.0));
  CHECK(bytes[0] == 1 && bytes[3] == 4, "a broadcast from the one rank changed its bytes");
  /* An empty checkpoint directory is named as such, on a load as on a save. */
  CHECK(zero_load_checkpoint(engine, "") == ZERO_INVALID_ARGUMENT, "a load from \"\" accepted");
  CHECK(strstr(zero_last_error(), "name one") != NULL, "message: %s", zero_last_error());
  /* User data a checkpoint's meta.json cannot hold is refused where it is given. */
  CHECK(zero_set_checkpoint_user_data(engine, "epoch \xff") == ZERO_INVALID_ARGUMENT, "binary user data accepted");
  CHECK(strstr(zero_last_error(), "UTF-8") != NULL, "message: %s", zero_last_error());

  /* Told apart as the engine tells them apart. */
  CHECK(zero_config_is_deepspeed("{\"zero_optimization\": {\"stage\": 3}}") == 1, "a DeepSpeed config");
  CHECK(zero_config_is_deepspeed("{\"checkpoint\": {\"tag_validation\": \"Warn\"}}") == 1, "DeepSpeed's checkpoint keys");
  CHECK(zero_config_is_deepspeed("{\"stage\": 3, \"checkpoint\": {\"keep_last\": 2}}") == 0, "ZeroRT's config");
  CHECK(zero_config_is_deepspeed("not json") == 0 && zero_config_is_deepspeed(NULL) == 0, "text that is no config");
  /* A DeepSpeed config comes back as ZeroRT's JSON; one with unsupported keys names them all. */
  const char* normalized = NULL;
  CHECK_OK(zero_config_normalize(
      "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2,"
      " \"zero_optimization\": {\"stage\": 3}, \"gradient_clipping\": 1.0}",
      &normalized));
  CHECK(normalized != NULL && strstr(normalized, "\"stage\":3") != NULL, "normalized: %s",
        normalized ? normalized : "(null)");
  CHECK(normalized != NULL && strstr(normalized, "\"clip_grad_norm\":1.0") != NULL, "normalized: %s",
        normalized ? normalized : "(null)");
  CHECK(zero_config_normalize("{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}},"
                              " \"amp\": {\"enabled\": true}}",
                              &normalized) == ZERO_INVALID_ARGUMENT,
        "unsupported DeepSpeed keys accepted");
  CHECK(strstr(zero_last_error(), "offload_optimizer") != NULL && strstr(zero_last_error(), "amp") != NULL,
        "message: %s", zero_last_error());

  /* Counters: the sized call fills what the caller's struct holds and nothing past it; the
   * original call, as programs built against the seven-field struct use it, the first seven. */
  zero_engine_counters_t counters;
  memset(&counters, 0x7f, sizeof counters);
  CHECK_OK(zero_engine_counters_sized(engine, &counters, sizeof counters));
  CHECK(counters.grad_bytes_copied == 5 * 2 * kNumel * 4, "grad_bytes_copied %lld after 5 steps",
        (long long)counters.grad_bytes_copied);
  CHECK(counters.host_waits == 0 && counters.gather_allocations == 0, "a rank alone at stage 2 waited");
  memset(&counters, 0x7f, sizeof counters);
  CHECK_OK(zero_engine_counters(engine, &counters));
  CHECK(counters.checkpoint_bytes_read == 0, "seventh field %lld", (long long)counters.checkpoint_bytes_read);
  CHECK(counters.grad_bytes_copied == 0x7f7f7f7f7f7f7f7fLL, "zero_engine_counters wrote past the seventh field");
  CHECK(zero_engine_counters_sized(engine, &counters, 5) == ZERO_INVALID_ARGUMENT, "a size of 5 bytes accepted");

  /* The engine keeps its communicator: the handle destroyed first, the engine still steps. */
  zero_comm_destroy(comm);
  StepAndMeasure(engine, moved);
  CHECK(moved[0] > 0.0f && moved[1] > 0.0f, "a step after zero_comm_destroy moved %g, %g", moved[0], moved[1]);
  zero_engine_destroy(engine);
  if (failures == 0) printf("groups_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
