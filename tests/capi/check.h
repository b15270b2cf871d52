/* The C ABI tests' check macros: a failed check prints what failed and counts it; main
 * returns 1 when `failures` is not 0. Define CHECK_PROGRAM (the test's name) first. */
#ifndef ZERO_TESTS_CAPI_CHECK_H_
#define ZERO_TESTS_CAPI_CHECK_H_

#include <stdio.h>

#include "zero/zero.h"

static int failures = 0;

#define CHECK(condition, ...)                                         \
  do {                                                                \
    if (!(condition)) {                                               \
      fprintf(stderr, "%s: FAILED %s: ", CHECK_PROGRAM, #condition);  \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

#define CHECK_OK(call) CHECK((call) == ZERO_OK, "%s", zero_last_error())

#endif /* ZERO_TESTS_CAPI_CHECK_H_ */
