/* The C ABI's lending calls as a C trainer makes them, on one in-process rank:
 * zero_lend_grad (the step reads the gradient where it is; SGD with lr 1 moves each param by
 * exactly minus its gradient), and at stage 3 zero_gathered_place with
 * zero_lend_gathered_memory (a gather writes into the trainer's memory, given back at release,
 * or at zero_release_cached_units for a unit kept for a backward).
 * Exits 0 when every check holds, 1 naming the first that does not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero/zero.h"

#define CHECK_PROGRAM "lending_test"
#include "tests/capi/check.h"

enum { kNumel = 29 };

/* The trainer's lender: one malloc'd block per unit, counted. */
typedef struct {
  void* memory[4];
  int lends, give_backs, fail;
} Lender;

static zero_status Lend(void* user, int unit, int64_t bytes, void** memory) {
  Lender* lender = (Lender*)user;
  if (lender->fail) return ZERO_RESOURCE_EXHAUSTED;
  CHECK(unit >= 0 && unit < 4 && lender->memory[unit] == NULL, "unit %d lent twice", unit);
  lender->memory[unit] = malloc((size_t)bytes);
  memset(lender->memory[unit], 0xFF, (size_t)bytes); /* NaN until the gather fills it */
  ++lender->lends;
  *memory = lender->memory[unit];
  return ZERO_OK;
}

static void GiveBack(void* user, int unit) {
  Lender* lender = (Lender*)user;
  CHECK(lender->memory[unit] != NULL, "unit %d given back unlent", unit);
  free(lender->memory[unit]);
  lender->memory[unit] = NULL;
  ++lender->give_backs;
}

static zero_engine* Create(zero_comm* comm, const char* config, float* initial) {
  zero_engine* engine = NULL;
  CHECK_OK(zero_engine_create(config, comm, &engine));
  const int64_t shape[1] = {kNumel};
  int64_t id = -1;
  CHECK_OK(zero_register_param(engine, "w", shape, 1, ZERO_FP32, 1, 0, 0, &id));
  CHECK_OK(zero_finalize(engine));
  for (int i = 0; i < kNumel; ++i) initial[i] = 0.125f * (float)i - 1.0f;
  CHECK_OK(zero_set_param(engine, id, initial));
  return engine;
}

static void LentGradient(zero_comm* comm) {
  float w[kNumel], grad[kNumel], after[kNumel];
  zero_engine* engine = Create(
      comm, "{\"stage\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 1.0, \"weight_decay\": 0.0}}", w);
  for (int i = 0; i < kNumel; ++i) grad[i] = 0.5f - 0.03f * (float)i;
  CHECK_OK(zero_begin_iteration(engine));
  int kept = -1;
  CHECK_OK(zero_lend_grad(engine, 0, grad, 0, &kept));
  CHECK(kept == 1, "a rank alone keeps its first gradient, got %d", kept);
  CHECK(zero_lend_grad(engine, 0, NULL, 0, &kept) == ZERO_INVALID_ARGUMENT, "a null gradient");
  CHECK_OK(zero_end_backward(engine));
  zero_step_info info;
  CHECK_OK(zero_step(engine, &info));
  CHECK_OK(zero_get_param(engine, 0, after));
  for (int i = 0; i < kNumel; ++i) CHECK(after[i] == w[i] - grad[i], "element %d: %g", i, after[i]);
  zero_engine_counters_t counters;
  CHECK_OK(zero_engine_counters_sized(engine, &counters, sizeof counters));
  CHECK(counters.grad_bytes_copied == 0, "%lld bytes copied", (long long)counters.grad_bytes_copied);
  zero_engine_destroy(engine);
}

static void LentGatheredMemory(zero_comm* comm) {
  float w[kNumel];
  zero_engine* engine = Create(
      comm, "{\"stage\": 3, \"stage3\": {\"persistence_threshold\": 0}, \"optimizer\": {\"type\": \"sgd\"}}", w);
  int unit = -1, persistent = -1;
  int64_t offset = -1, unit_bytes = -1;
  CHECK_OK(zero_gathered_place(engine, 0, &unit, &offset, &unit_bytes, &persistent));
  CHECK(unit == 0 && persistent == 0 && offset >= 0 && unit_bytes >= offset + kNumel * 4,
        "unit %d, offset %lld, %lld bytes, persistent %d", unit, (long long)offset, (long long)unit_bytes,
        persistent);
  Lender lender = {{NULL}, 0, 0, 0};
  CHECK(zero_lend_gathered_memory(engine, Lend, NULL, &lender) == ZERO_INVALID_ARGUMENT, "lend without give_back");
  CHECK_OK(zero_lend_gathered_memory(engine, Lend, GiveBack, &lender));
  lender.fail = 1;
  CHECK(zero_gather(engine, 0) == ZERO_RESOURCE_EXHAUSTED, "a failed lend fails the gather: %s", zero_last_error());
  CHECK(strstr(zero_last_error(), "lender gave no memory for unit 0") != NULL, "%s", zero_last_error());
  lender.fail = 0;
  CHECK_OK(zero_gather(engine, 0));
  void* view = NULL;
  CHECK_OK(zero_param_data(engine, 0, &view));
  CHECK(view == (char*)lender.memory[0] + offset, "the view is not in the lent memory");
  CHECK(view != NULL && memcmp(view, w, sizeof w) == 0, "the lent memory does not hold the values");
  CHECK_OK(zero_release(engine, 0));
  CHECK(lender.lends == 1 && lender.give_backs == 1, "%d lends, %d give-backs", lender.lends, lender.give_backs);
  /* Before any step no gather order is recorded: a release until backward frees too. One step
   * (forward, backward) records it; from then on the forward's release until backward keeps
   * the unit for the backward's gather, and a plain release frees it. */
  float grad[kNumel];
  for (int i = 0; i < kNumel; ++i) grad[i] = 0.25f - 0.01f * (float)i;
  zero_step_info info;
  zero_engine_counters_t counters;
  for (int step = 0; step < 2; ++step) {
    CHECK_OK(zero_gather(engine, 0));
    CHECK_OK(zero_release_until_backward(engine, 0));
    CHECK_OK(zero_engine_counters_sized(engine, &counters, sizeof counters));
    CHECK(counters.releases_kept == step, "step %d: %lld releases kept", step, (long long)counters.releases_kept);
    CHECK(lender.give_backs == 2 + step, "step %d: %d give-backs", step, lender.give_backs);
    CHECK_OK(zero_begin_iteration(engine));
    CHECK_OK(zero_gather(engine, 0));
    CHECK_OK(zero_accumulate_grad(engine, 0, grad));
    CHECK_OK(zero_release(engine, 0));
    CHECK(lender.give_backs == 3 + step, "step %d: %d give-backs", step, lender.give_backs);
    CHECK_OK(zero_end_backward(engine));
    CHECK_OK(zero_step(engine, &info));
  }
  /* A unit kept for a backward that never comes (an eval forward) goes back at
   * zero_release_cached_units, as DeepSpeed's empty_partition_cache frees it. */
  CHECK_OK(zero_gather(engine, 0));
  CHECK_OK(zero_release_until_backward(engine, 0));
  CHECK(lender.give_backs == 4, "kept for backward: %d give-backs", lender.give_backs);
  CHECK_OK(zero_release_cached_units(engine));
  CHECK(lender.give_backs == 5, "released cached units: %d give-backs", lender.give_backs);
  CHECK(zero_release_until_backward(engine, 0) == ZERO_FAILED_PRECONDITION, "a unit not gathered: %s",
        zero_last_error());
  /* Destroying the engine while a unit is gathered gives nothing back: the memory is ours. */
  CHECK_OK(zero_gather(engine, 0));
  zero_engine_destroy(engine);
  CHECK(lender.give_backs == 5 && lender.memory[0] != NULL, "given back at destruction");
  free(lender.memory[0]);
}

int main(void) {
  zero_comm* comm = NULL;
  CHECK_OK(zero_comm_local_group(1, &comm));
  LentGradient(comm);
  LentGatheredMemory(comm);
  zero_comm_destroy(comm);
  if (failures == 0) printf("lending_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
