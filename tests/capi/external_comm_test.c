/* The C ABI's external communicator (zero_comm_external), as a C trainer with its own
 * communication layer uses it: a table of C functions for one rank (every collective of a
 * group of one copies its input), an engine trained on it with SGD (each step moves the
 * param by exactly -lr * gradient), the table's handles all released and destroy called once;
 * a start that fails reaches zero_last_error with the table's message; bad tables and ranks are
 * refused without calling the table. Exits 0 when every check holds. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zero/zero.h"

#define CHECK_PROGRAM "external_comm_test"
#include "tests/capi/check.h"

enum { kNumel = 41 };

/* What the table of one rank records. */
typedef struct {
  int started, held, destroyed;
  int fail_at; /* the start (from 1) that fails; 0: none */
} Table;

static size_t ElementBytes(int dtype) {
  switch (dtype) {
    case ZERO_FP32: return 4;
    case ZERO_BF16:
    case ZERO_FP16: return 2;
    case ZERO_COLL_INT64: return 8;
    default: return 1;
  }
}

/* A group of one: reduce-scatter, all-gather and all-reduce copy send into recv; broadcast and
 * barrier leave everything as it is. */
static zero_status Start(void* context, const zero_collective* c, int64_t* handle, char* message, size_t capacity) {
  Table* table = (Table*)context;
  if (++table->started == table->fail_at) {
    snprintf(message, capacity, "the interconnect is down (start %d)", table->started);
    return ZERO_UNAVAILABLE;
  }
  if (c->kind != ZERO_COLL_BROADCAST && c->kind != ZERO_COLL_BARRIER && c->send != c->recv) {
    memmove(c->recv, c->send, (size_t)c->count * ElementBytes(c->dtype));
  }
  ++table->held;
  *handle = 1000 + table->started;
  return ZERO_OK;
}

static zero_status Wait(void* context, int64_t handle, double timeout_s, char* message, size_t capacity) {
  (void)context, (void)handle, (void)timeout_s, (void)message, (void)capacity;
  return ZERO_OK;
}

static int Test(void* context, int64_t handle) {
  (void)context, (void)handle;
  return 1;
}

static void Release(void* context, int64_t handle) {
  (void)handle;
  --((Table*)context)->held;
}

static void Destroy(void* context) { ++((Table*)context)->destroyed; }

int main(void) {
  Table state = {0, 0, 0, 0};
  zero_collectives table = {&state, Start, Wait, Test, Release, Destroy};
  zero_comm* comm = NULL;
  CHECK_OK(zero_comm_external(0, 1, 1, 60.0, &table, &comm));
  CHECK(zero_comm_rank(comm) == 0 && zero_comm_size(comm) == 1, "rank %d of %d", zero_comm_rank(comm),
        zero_comm_size(comm));

  zero_engine* engine = NULL;
  CHECK_OK(zero_engine_create("{\"stage\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.5, \"weight_decay\": 0.0}}",
                              comm, &engine));
  const int64_t shape[1] = {kNumel};
  int64_t id = -1;
  CHECK_OK(zero_register_param(engine, "w", shape, 1, ZERO_FP32, 1, 0, -1, &id));
  CHECK_OK(zero_finalize(engine));
  float w[kNumel], grad[kNumel], after[kNumel];
  for (int i = 0; i < kNumel; ++i) w[i] = sinf(0.3f * (float)i) + 0.1f;
  CHECK_OK(zero_set_param(engine, id, w));
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < kNumel; ++i) grad[i] = cosf(0.7f * (float)(i + step)) - 0.2f;
    CHECK_OK(zero_begin_iteration(engine));
    CHECK_OK(zero_accumulate_grad(engine, id, grad));
    CHECK_OK(zero_end_backward(engine));
    zero_step_info info;
    CHECK_OK(zero_step(engine, &info));
    for (int i = 0; i < kNumel; ++i) w[i] = (float)((double)w[i] - 0.5 * (double)grad[i]);
  }
  CHECK_OK(zero_get_param(engine, id, after));
  for (int i = 0; i < kNumel; ++i) CHECK(fabsf(after[i] - w[i]) <= 1e-6f, "w[%d] is %g, want %g", i, after[i], w[i]);
  float values[3] = {1.5f, -2.0f, 4.0f};
  CHECK_OK(zero_comm_all_reduce_f32(comm, values, 3, 0, 60.0));
  CHECK(values[0] == 1.5f && values[1] == -2.0f && values[2] == 4.0f, "a group of one changed its values");
  CHECK(state.started >= 2, "%d collectives started (the all-reduce's check and itself at least)", state.started);
  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  CHECK(state.held == 0, "%d handles never released", state.held);
  CHECK(state.destroyed == 1, "destroy called %d times", state.destroyed);

  /* A start that fails: its message reaches zero_last_error, and the group is broken. */
  Table failing = {0, 0, 0, 0};
  zero_collectives failing_table = {&failing, Start, Wait, Test, Release, NULL};
  CHECK_OK(zero_comm_external(0, 1, 1, 0.0, &failing_table, &comm));
  CHECK_OK(zero_comm_all_reduce_f32(comm, values, 3, 0, 60.0)); /* check + collective: starts 1, 2 */
  CHECK(failing.started == 2, "%d starts", failing.started);
  failing.fail_at = 3;
  CHECK(zero_comm_all_reduce_f32(comm, values, 3, 0, 60.0) == ZERO_UNAVAILABLE, "a failed start succeeded");
  CHECK(strstr(zero_last_error(), "the interconnect is down (start 3)") != NULL, "message: %s", zero_last_error());
  CHECK(zero_comm_all_reduce_f32(comm, values, 3, 0, 60.0) == ZERO_UNAVAILABLE, "a broken group worked");
  CHECK(strstr(zero_last_error(), "broken") != NULL, "message: %s", zero_last_error());
  zero_comm_destroy(comm);
  CHECK(failing.held == 0, "%d handles never released", failing.held);

  /* Refused before the table is called. */
  Table untouched = {0, 0, 0, 0};
  zero_collectives no_test = {&untouched, Start, Wait, NULL, Release, Destroy};
  comm = NULL;
  CHECK(zero_comm_external(0, 1, 1, 60.0, &no_test, &comm) == ZERO_INVALID_ARGUMENT && comm == NULL,
        "a table without test accepted");
  CHECK(strstr(zero_last_error(), "start, wait, test and release") != NULL, "message: %s", zero_last_error());
  zero_collectives whole = {&untouched, Start, Wait, Test, Release, Destroy};
  CHECK(zero_comm_external(1, 1, 1, 60.0, &whole, &comm) == ZERO_INVALID_ARGUMENT, "rank 1 of 1 accepted");
  CHECK(zero_comm_external(0, 2, 3, 60.0, &whole, &comm) == ZERO_INVALID_ARGUMENT, "3 ranks on a host of 2");
  CHECK(zero_comm_external(0, 1, 1, -1.0, &whole, &comm) == ZERO_INVALID_ARGUMENT, "a negative timeout");
  CHECK(zero_comm_external(0, 1, 1, 60.0, NULL, &comm) == ZERO_INVALID_ARGUMENT, "a NULL table");
  CHECK(zero_comm_external(0, 1, 1, 60.0, &whole, NULL) == ZERO_INVALID_ARGUMENT, "a NULL out");
  CHECK(untouched.started == 0 && untouched.destroyed == 0, "a refused table was called");

  if (failures == 0) printf("external_comm_test: ok\n");
  return failures == 0 ? 0 : 1;
}
