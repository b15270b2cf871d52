/* The C ABI from C: two in-process ranks (pthreads) fit y = 2x + 1 with SGD at stage 1, and
 * a mistake is answered by a status and a message, not a crash. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <zero/zero.h>

#define RANKS 2
#define STEPS 300

static zero_comm* comms[RANKS];
static float final_error[RANKS];

static void* rank_main(void* arg) {
  const int rank = (int)(long)arg;
  zero_engine* engine = NULL;
  const char* config = "{\"stage\": 1, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.5,"
                       " \"weight_decay\": 0.0}}";
  if (zero_engine_create(config, comms[rank], &engine) != ZERO_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, zero_last_error());
    return NULL;
  }
  const int64_t shape[1] = {1};
  int64_t w = -1, b = -1;
  zero_register_param(engine, "w", shape, 1, ZERO_FP32, 1, 0, -1, &w);
  zero_register_param(engine, "b", shape, 1, ZERO_FP32, 1, 0, -1, &b);
  zero_finalize(engine);
  for (int step = 0; step < STEPS; ++step) {
    float wv, bv;
    zero_get_param(engine, w, &wv);
    zero_get_param(engine, b, &bv);
    const float x = (float)(step % 4) + 0.5f * (float)rank, err = wv * x + bv - (2 * x + 1);
    const float gb = err, gw = err * x;
    zero_begin_iteration(engine);
    zero_accumulate_grad(engine, b, &gb);
    zero_accumulate_grad(engine, w, &gw);
    zero_end_backward(engine);
    zero_step_info info;
    if (zero_step(engine, &info) != ZERO_OK) {
      fprintf(stderr, "rank %d: %s\n", rank, zero_last_error());
      break;
    }
    final_error[rank] = fabsf(err);
  }
  /* Out of order on purpose: a gradient outside an iteration. */
  if (rank == 0) {
    const float g = 1.0f;
    const zero_status s = zero_accumulate_grad(engine, w, &g);
    printf("expected error: status %d: %s\n", (int)s, zero_last_error());
  }
  struct zero_memory_stats memory;
  zero_memory_stats(engine, &memory);
  printf("rank %d: |error| %.5f, optimizer bytes %lld\n", rank, final_error[rank],
         (long long)memory.current[ZERO_MEM_OPTIMIZER]);
  zero_engine_destroy(engine);
  return NULL;
}

int main(void) {
  printf("%s\n", zero_version());
  if (zero_comm_local_group(RANKS, comms) != ZERO_OK) {
    fprintf(stderr, "%s\n", zero_last_error());
    return 1;
  }
  pthread_t threads[RANKS];
  for (long r = 0; r < RANKS; ++r) pthread_create(&threads[r], NULL, rank_main, (void*)r);
  for (int r = 0; r < RANKS; ++r) pthread_join(threads[r], NULL);
  int ok = 1;
  for (int r = 0; r < RANKS; ++r) {
    ok = ok && final_error[r] < 1e-2f;
    zero_comm_destroy(comms[r]);
  }
  printf(ok ? "OK\n" : "FAILED\n");
  return ok ? 0 : 1;
}
