/* zero_accumulate_grads as a C trainer (or zerort.torch's hooks) calls it, on one in-process
 * rank: several gradients in one call move each param exactly as one call per gradient would
 * (SGD with lr 1 moves each param by exactly minus its gradient), lent ones too; a failure
 * stops at the gradient that failed and says how many were handed over before it; bad
 * arguments are refused. Exits 0 when every check holds, 1 naming the first that does not. */
#include <stdio.h>
#include <string.h>

#include "zero/zero.h"

#define CHECK_PROGRAM "batched_grads_test"
#include "tests/capi/check.h"

enum { kParams = 3 };
static const int64_t kNumel[kParams] = {5, 29, 7}; /* odd sizes: no shard falls on a boundary */
static const char* const kNames[kParams] = {"a", "b", "c"};

static zero_engine* Create(zero_comm* comm, float values[kParams][29], int64_t ids[kParams]) {
  zero_engine* engine = NULL;
  CHECK_OK(zero_engine_create(
      "{\"stage\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 1.0, \"weight_decay\": 0.0}}", comm, &engine));
  for (int p = 0; p < kParams; ++p) {
    CHECK_OK(zero_register_param(engine, kNames[p], &kNumel[p], 1, ZERO_FP32, 1, 0, -1, &ids[p]));
  }
  CHECK_OK(zero_finalize(engine));
  for (int p = 0; p < kParams; ++p) {
    for (int i = 0; i < kNumel[p]; ++i) values[p][i] = 0.25f * (float)(i + 3 * p) - 1.5f;
    CHECK_OK(zero_set_param(engine, ids[p], values[p]));
  }
  return engine;
}

/* One step with every gradient handed in one call (`flags`); each param must end at exactly
 * its value minus its gradient. */
static void OneCall(zero_comm* comm, int flags) {
  float values[kParams][29], grads[kParams][29], after[29];
  int64_t ids[kParams];
  zero_engine* engine = Create(comm, values, ids);
  const void* addresses[kParams];
  for (int p = 0; p < kParams; ++p) {
    for (int i = 0; i < kNumel[p]; ++i) grads[p][i] = 0.5f - 0.03f * (float)(i + 7 * p);
    addresses[p] = grads[p];
  }
  int kept[kParams] = {-1, -1, -1};
  int64_t handed = -1;
  CHECK_OK(zero_begin_iteration(engine));
  CHECK_OK(zero_accumulate_grads(engine, kParams, ids, addresses, flags, kept, &handed));
  CHECK(handed == kParams, "handed %lld of %d", (long long)handed, kParams);
  const int lend = (flags & ZERO_GRADS_LEND) != 0;
  for (int p = 0; p < kParams; ++p) {
    CHECK(kept[p] == (lend ? 1 : -1), "param %d: kept %d (a rank alone keeps a lent first gradient; "
          "without lending kept is left alone)", p, kept[p]);
  }
  CHECK_OK(zero_end_backward(engine));
  zero_step_info info;
  CHECK_OK(zero_step(engine, &info));
  for (int p = 0; p < kParams; ++p) {
    CHECK_OK(zero_get_param(engine, ids[p], after));
    for (int i = 0; i < kNumel[p]; ++i) {
      CHECK(after[i] == values[p][i] - grads[p][i], "param %d element %d: %g, not %g", p, i, after[i],
            values[p][i] - grads[p][i]);
    }
  }
  zero_engine_counters_t counters;
  CHECK_OK(zero_engine_counters_sized(engine, &counters, sizeof counters));
  const long long expected = lend ? 0 : 4 * (5 + 29 + 7);
  CHECK(counters.grad_bytes_copied == expected, "%lld bytes copied, not %lld",
        (long long)counters.grad_bytes_copied, expected);
  zero_engine_destroy(engine);
}

/* A call stops at its first failure: the status and message are that gradient's, *handed
 * counts the ones before it, and the ones after it were not looked at. */
static void StopsAtTheFailure(zero_comm* comm) {
  float values[kParams][29], grad[29];
  int64_t ids[kParams];
  for (int i = 0; i < 29; ++i) grad[i] = 0.125f * (float)i;
  int64_t handed = -1;

  zero_engine* engine = Create(comm, values, ids);
  const int64_t in_order[3] = {ids[0], ids[1], ids[2]};
  const void* third_null[3] = {grad, grad, NULL};
  CHECK_OK(zero_begin_iteration(engine));
  CHECK(zero_accumulate_grads(engine, 3, in_order, third_null, 0, NULL, &handed) == ZERO_INVALID_ARGUMENT,
        "a null gradient is refused: %s", zero_last_error());
  CHECK(handed == 2, "handed %lld before the null gradient", (long long)handed);
  zero_engine_destroy(engine);

  /* guard.on_duplicate "error": b twice; c, after it, is still to come. */
  engine = Create(comm, values, ids);
  const int64_t b_twice[4] = {ids[0], ids[1], ids[1], ids[2]};
  const void* four[4] = {grad, grad, grad, grad};
  CHECK_OK(zero_begin_iteration(engine));
  CHECK(zero_accumulate_grads(engine, 4, b_twice, four, 0, NULL, &handed) == ZERO_DUPLICATE_GRADIENT,
        "a duplicate fails: %s", zero_last_error());
  CHECK(handed == 2, "handed %lld before the duplicate", (long long)handed);
  CHECK(strstr(zero_last_error(), "\"b\"") != NULL, "the message names the param: %s", zero_last_error());
  CHECK_OK(zero_accumulate_grads(engine, 1, &ids[2], four, 0, NULL, &handed));
  zero_engine_destroy(engine);
}

static void RefusesBadArguments(zero_comm* comm) {
  float values[kParams][29];
  int64_t ids[kParams], handed = -1;
  zero_engine* engine = Create(comm, values, ids);
  const void* addresses[1] = {values[0]};
  CHECK_OK(zero_begin_iteration(engine));
  CHECK(zero_accumulate_grads(engine, -1, ids, addresses, 0, NULL, &handed) == ZERO_INVALID_ARGUMENT,
        "a negative count");
  CHECK(zero_accumulate_grads(engine, 1, ids, addresses, 4, NULL, &handed) == ZERO_INVALID_ARGUMENT,
        "an unknown flag");
  CHECK(strstr(zero_last_error(), "unknown flags 4") != NULL, "%s", zero_last_error());
  CHECK(zero_accumulate_grads(engine, 1, ids, addresses, ZERO_GRADS_LEND, NULL, &handed) ==
            ZERO_INVALID_ARGUMENT,
        "lending without `kept`");
  CHECK(zero_accumulate_grads(engine, 1, ids, addresses, 0, NULL, NULL) == ZERO_INVALID_ARGUMENT, "no `handed`");
  CHECK_OK(zero_accumulate_grads(engine, 0, NULL, NULL, 0, NULL, &handed));
  CHECK(handed == 0, "an empty call hands %lld", (long long)handed);
  zero_engine_destroy(engine);
}

int main(void) {
  zero_comm* comm = NULL;
  CHECK_OK(zero_comm_local_group(1, &comm));
  OneCall(comm, 0);
  OneCall(comm, ZERO_GRADS_LEND);
  StopsAtTheFailure(comm);
  RefusesBadArguments(comm);
  zero_comm_destroy(comm);
  if (failures == 0) printf("batched_grads_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
