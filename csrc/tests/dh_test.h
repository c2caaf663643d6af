/* Helpers of the C tests: CHECK a call, EXPECT a result code, with the library's message. */
#ifndef DH_TEST_H
#define DH_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix.h"

static inline void dh_test_fail(const char *file, int line, const char *call, dh_result want, dh_result got) {
  char msg[1024];
  dh_error_message(msg, sizeof msg);
  fprintf(stderr, "%s:%d: %s: expected %s, got %s: %s\n", file, line, call, dh_result_name(want),
          dh_result_name(got), msg);
  exit(1);
}

#define EXPECT(want, call)                                                   \
  do {                                                                       \
    dh_result got_ = (call);                                                 \
    if (got_ != (dh_result)(want)) dh_test_fail(__FILE__, __LINE__, #call, (want), got_); \
  } while (0)

#define CHECK(call) EXPECT(DH_OK, call)

#define ASSERT(cond)                                                         \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* The collectives' backend from DH_TEST_BACKEND (mpi, hccl), where it is set: the same program
 * then runs on MPI and on HCCL. */
static inline void dh_test_backend_from_env(dh_config *cfg) {
  const char *backend = getenv("DH_TEST_BACKEND");
  if (backend && *backend) CHECK(dh_config_set(cfg, "backend", backend));
}

/* The last error message of this thread, in a static buffer. */
static inline const char *dh_test_message(void) {
  static char msg[1024];
  dh_error_message(msg, sizeof msg);
  return msg;
}

#endif
