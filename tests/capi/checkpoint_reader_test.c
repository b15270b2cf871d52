/* The C ABI's checkpoint reader (zero_ckpt_*), as a C program that wants a trained model's
 * full params without an engine: a one-rank stage-2 job saves after two AdamW steps; the
 * reader describes the checkpoint (names, shapes, the tied name, the frozen param, the step,
 * the user data), reads every saved param as the engine holds it, and refuses what it cannot
 * give: a frozen param that was not saved, an index out of range, a damaged file, NULLs.
 * The checkpoint goes to argv[1] (CTest passes a directory of the build tree). Exits 0 when
 * every check holds, 1 otherwise. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero/zero.h"

#define CHECK_PROGRAM "checkpoint_reader_test"
#include "tests/capi/check.h"

enum { kRows = 3, kCols = 5, kBias = 7 };

/* Fills `values` with distinct, non-zero numbers that depend on `seed`. */
static void Fill(float* values, int count, int seed) {
  for (int i = 0; i < count; ++i) values[i] = 0.25f + 0.01f * (float)((i * 7 + seed * 13) % 97);
}

/* Trains two steps and saves into `dir`; returns the engine for the comparisons. */
static zero_engine* TrainAndSave(const char* dir, zero_comm* comm) {
  zero_engine* engine = NULL;
  CHECK_OK(zero_engine_create("{\"stage\": 2, \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}}", comm,
                              &engine));
  const int64_t matrix[2] = {kRows, kCols}, vector[1] = {kBias};
  int64_t id = 0;
  CHECK_OK(zero_register_param(engine, "embed.weight", matrix, 2, ZERO_FP32, 1, 0, -1, &id));
  CHECK_OK(zero_add_param_alias(engine, id, "lm_head.weight"));
  CHECK_OK(zero_register_param(engine, "base.weight", vector, 1, ZERO_FP32, 0, 0, -1, &id));
  CHECK_OK(zero_register_param(engine, "head.bias", vector, 1, ZERO_FP32, 1, 0, -1, &id));
  CHECK_OK(zero_finalize(engine));
  float weight[kRows * kCols], bias[kBias];
  Fill(weight, kRows * kCols, 1);
  Fill(bias, kBias, 2);
  CHECK_OK(zero_set_param(engine, 0, weight));
  CHECK_OK(zero_set_param(engine, 1, bias));
  CHECK_OK(zero_set_param(engine, 2, bias));
  for (int step = 0; step < 2; ++step) {
    float grad_weight[kRows * kCols], grad_bias[kBias];
    Fill(grad_weight, kRows * kCols, 3 + step);
    Fill(grad_bias, kBias, 5 + step);
    CHECK_OK(zero_begin_iteration(engine));
    CHECK_OK(zero_accumulate_grad(engine, 2, grad_bias));
    CHECK_OK(zero_accumulate_grad(engine, 0, grad_weight));
    CHECK_OK(zero_end_backward(engine));
    zero_step_info info;
    CHECK_OK(zero_step(engine, &info));
  }
  CHECK_OK(zero_set_checkpoint_user_data(engine, "{\"epoch\": 3}"));
  CHECK_OK(zero_save_checkpoint(engine, dir));
  return engine;
}

/* Flips one byte in the middle of `path`. */
static void Damage(const char* path) {
  FILE* file = fopen(path, "r+b");
  CHECK(file != NULL, "cannot open %s", path);
  if (file == NULL) return;
  fseek(file, 0, SEEK_END);
  const long middle = ftell(file) / 2;
  fseek(file, middle, SEEK_SET);
  const int byte = fgetc(file);
  fseek(file, middle, SEEK_SET);
  fputc(byte ^ 0x5a, file);
  fclose(file);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CHECKPOINT_DIR\n", argv[0]);
    return 2;
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/ckpt", argv[1]);
  zero_comm* comm = NULL;
  CHECK_OK(zero_comm_local_group(1, &comm));
  zero_engine* engine = TrainAndSave(dir, comm);

  zero_ckpt_reader* reader = NULL;
  CHECK_OK(zero_ckpt_open(dir, &reader));
  const char* json = NULL;
  CHECK_OK(zero_ckpt_describe(reader, &json));
  const char* expected[] = {"\"step\":2", "\"stage\":2", "\"world\":1", "\"optimizer\":\"adamw\"",
                            "\"name\":\"embed.weight\",\"shape\":[3,5],\"dtype\":\"fp32\",\"numel\":15,"
                            "\"requires_grad\":true,\"saved\":true,\"aliases\":[\"lm_head.weight\"]",
                            "\"name\":\"base.weight\",\"shape\":[7],\"dtype\":\"fp32\",\"numel\":7,"
                            "\"requires_grad\":false,\"saved\":false,\"aliases\":[]",
                            "\"user_data\":\"{\\\"epoch\\\": 3}\""};
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; ++i) {
    CHECK(json != NULL && strstr(json, expected[i]) != NULL, "the description lacks %s: %s", expected[i],
          json ? json : "(null)");
  }
  CHECK_OK(zero_ckpt_verify(reader));

  /* Every saved param as the engine holds it, into poisoned memory. */
  float read[kRows * kCols], held[kRows * kCols];
  const int saved_params[2] = {0, 2}, sizes[2] = {kRows * kCols, kBias};
  for (int k = 0; k < 2; ++k) {
    for (int i = 0; i < kRows * kCols; ++i) read[i] = NAN;
    CHECK_OK(zero_ckpt_read_param(reader, saved_params[k], read));
    CHECK_OK(zero_get_param(engine, saved_params[k], held));
    CHECK(memcmp(read, held, sizeof(float) * (size_t)sizes[k]) == 0, "param %d differs from the engine's",
          saved_params[k]);
  }
  CHECK(zero_ckpt_read_param(reader, 1, read) == ZERO_FAILED_PRECONDITION, "the unsaved frozen param was read");
  CHECK(strstr(zero_last_error(), "base.weight") != NULL, "message: %s", zero_last_error());
  CHECK(zero_ckpt_read_param(reader, 3, read) == ZERO_INVALID_ARGUMENT, "index 3 accepted");
  CHECK(strstr(zero_last_error(), "index 3") != NULL, "message: %s", zero_last_error());
  CHECK(zero_ckpt_read_param(reader, -1, read) == ZERO_INVALID_ARGUMENT, "index -1 accepted");
  CHECK(zero_ckpt_read_param(reader, 0, NULL) == ZERO_INVALID_ARGUMENT, "a NULL output accepted");
  CHECK(zero_ckpt_describe(NULL, &json) == ZERO_INVALID_ARGUMENT, "a NULL reader accepted");
  zero_ckpt_close(reader);
  zero_ckpt_close(NULL);

  /* A damaged rank file: the open succeeds (it reads the indexes), the verify names the file. */
  char rank_file[4200];
  snprintf(rank_file, sizeof rank_file, "%s/rank-0-of-1.bin", dir);
  Damage(rank_file);
  reader = NULL;
  CHECK_OK(zero_ckpt_open(dir, &reader));
  const zero_status verified = zero_ckpt_verify(reader);
  CHECK(verified == ZERO_DATA_LOSS || verified == ZERO_INVALID_ARGUMENT, "a damaged file verified (%d)",
        (int)verified);
  CHECK(strstr(zero_last_error(), "rank-0-of-1") != NULL, "message: %s", zero_last_error());
  zero_ckpt_close(reader);

  zero_ckpt_reader* missing = (zero_ckpt_reader*)&failures; /* must be reset to NULL */
  char absent[4200];
  snprintf(absent, sizeof absent, "%s/absent", argv[1]);
  CHECK(zero_ckpt_open(absent, &missing) != ZERO_OK, "a missing checkpoint opened");
  CHECK(missing == NULL, "a failed open left its output set");
  CHECK(strstr(zero_last_error(), "absent") != NULL, "message: %s", zero_last_error());

  zero_engine_destroy(engine);
  zero_comm_destroy(comm);
  if (failures == 0) printf("checkpoint_reader_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
