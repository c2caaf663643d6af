/* Misuse of the C ABI, expecting result codes, never crashes: NULL everywhere, release twice,
 * next after close, bad configuration keys and values, missing dataset, out-of-range indices,
 * calls from another thread.
 *
 *   mpirun -np 2 ./misuse DATASET TMPDIR       (prints "ok RANK")
 *
 * The ranks share TMPDIR: each writes its own files (named by its pid), or one rank could read
 * a file another is still writing. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "dh_test.h"

/* Calls a loader from another thread than its own: refused, and nothing done. */
static void *from_another_thread(void *arg) {
  dh_loader *loader = arg;
  dh_batch *batch = NULL;
  EXPECT(DH_WRONG_THREAD, dh_loader_next(loader, 0, &batch));
  ASSERT(batch == NULL);
  EXPECT(DH_WRONG_THREAD, dh_loader_prepare_ahead(loader));
  EXPECT(DH_WRONG_THREAD, dh_loader_report_step(loader, 0.1));
  dh_metrics m;
  m.struct_size = sizeof m;
  EXPECT(DH_WRONG_THREAD, dh_loader_metrics(loader, &m));
  ASSERT(strstr(dh_test_message(), "thread") != NULL);
  return NULL;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ASSERT(f != NULL);
  fputs(text, f);
  fclose(f);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s DATASET TMPDIR\n", argv[0]);
    return 2;
  }
  const char *data = argv[1];
  char path[4096];

  /* Static strings and the error buffer. */
  ASSERT(dh_version() != NULL);
  ASSERT(strcmp(dh_result_name(DH_NULL_PARAMETER), "DH_NULL_PARAMETER") == 0);
  ASSERT(strcmp(dh_result_name(DH_PANIC), "DH_PANIC") == 0);
  ASSERT(strcmp(dh_result_name(12345), "DH_UNKNOWN_RESULT") == 0);
  ASSERT(dh_error_message(NULL, 0) >= 1);
  ASSERT(dh_error_message(NULL, 100) >= 1);

  /* Configuration. */
  EXPECT(DH_NULL_PARAMETER, dh_config_new(NULL));
  dh_config *cfg = NULL;
  CHECK(dh_config_new(&cfg));
  EXPECT(DH_NULL_PARAMETER, dh_config_set(NULL, "data", data));
  EXPECT(DH_NULL_PARAMETER, dh_config_set(cfg, NULL, data));
  EXPECT(DH_NULL_PARAMETER, dh_config_set(cfg, "data", NULL));
  EXPECT(DH_UNKNOWN_KEY, dh_config_set(cfg, "no_such_key", "1"));
  ASSERT(strstr(dh_test_message(), "no_such_key") != NULL);
  {
    char small[8];
    size_t need = dh_error_message(small, sizeof small);
    ASSERT(need > sizeof small && strlen(small) == sizeof small - 1);
  }
  EXPECT(DH_INVALID_PARAMETER, dh_config_set(cfg, "workers", "lots"));
  ASSERT(strstr(dh_test_message(), "workers") != NULL);
  EXPECT(DH_INVALID_PARAMETER, dh_config_set(cfg, "policy", "fastest"));
  EXPECT(DH_INVALID_PARAMETER, dh_config_set(cfg, "collective_timeout_s", "-1"));
  EXPECT(DH_INVALID_PARAMETER, dh_config_set(cfg, "data", "\xff\xfe"));

  dh_config *from_file = NULL;
  EXPECT(DH_NULL_PARAMETER, dh_config_from_file(NULL, &from_file));
  EXPECT(DH_NULL_PARAMETER, dh_config_from_file("x.toml", NULL));
  EXPECT(DH_IO, dh_config_from_file("/nonexistent/datahelix.toml", &from_file));
  snprintf(path, sizeof path, "%s/%ld-bad-key.toml", argv[2], (long)getpid());
  write_file(path, "data = \"x\"\nspeed = 11\n");
  EXPECT(DH_UNKNOWN_KEY, dh_config_from_file(path, &from_file));
  ASSERT(strstr(dh_test_message(), "speed") != NULL);
  snprintf(path, sizeof path, "%s/%ld-bad-syntax.toml", argv[2], (long)getpid());
  write_file(path, "data = = 1\n");
  EXPECT(DH_PARSE, dh_config_from_file(path, &from_file));
  snprintf(path, sizeof path, "%s/%ld-bad-type.toml", argv[2], (long)getpid());
  write_file(path, "workers = [1, 2]\n");
  EXPECT(DH_PARSE, dh_config_from_file(path, &from_file));
  ASSERT(from_file == NULL); /* outputs are written only on success */

  /* Loader creation. */
  dh_loader *loader = NULL;
  EXPECT(DH_NULL_PARAMETER, dh_loader_new(NULL, &loader));
  EXPECT(DH_NULL_PARAMETER, dh_loader_new(cfg, NULL));
  EXPECT(DH_INVALID_PARAMETER, dh_loader_new(cfg, &loader)); /* no "data" */
  long long fake_comm = 0;
  EXPECT(DH_NULL_PARAMETER, dh_loader_new_with_comm(cfg, NULL, &loader));
  /* MPI is not initialised yet: a communicator cannot be real, and is not read. */
  EXPECT(DH_MPI_INIT, dh_loader_new_with_comm(cfg, &fake_comm, &loader));
  ASSERT(strstr(dh_test_message(), "MPI_Init") != NULL);
  CHECK(dh_config_set(cfg, "data", "/nonexistent/dataset"));
  EXPECT(DH_INDEX, dh_loader_new(cfg, &loader)); /* missing dataset */
  ASSERT(strstr(dh_test_message(), "/nonexistent/dataset") != NULL);
  ASSERT(loader == NULL);
  dh_config_free(cfg);
  dh_config_free(NULL);

  /* A real loader, from a TOML file. */
  snprintf(path, sizeof path, "%s/%ld-good.toml", argv[2], (long)getpid());
  {
    char text[8192];
    snprintf(text, sizeof text,
             "data = \"%s\"\nglobal_batch = 4\nworkers = 2\nsteps = 3\ncpu_budget = false\n"
             "max_frames = 2\ncollective_timeout_s = 120.0\n",
             data);
    write_file(path, text);
  }
  CHECK(dh_config_from_file(path, &from_file));
  CHECK(dh_loader_new(from_file, &loader));
  dh_config_free(from_file);
  size_t rank = 0, size = 0;
  EXPECT(DH_NULL_PARAMETER, dh_loader_world(NULL, &rank, &size));
  EXPECT(DH_NULL_PARAMETER, dh_loader_world(loader, NULL, &size));
  EXPECT(DH_NULL_PARAMETER, dh_loader_world(loader, &rank, NULL));
  CHECK(dh_loader_world(loader, &rank, &size));

  /* NULL handles and outputs. */
  dh_batch *batch = NULL;
  dh_metrics m;
  dh_tensor t;
  uint64_t u = 0;
  size_t n = 0;
  const uint64_t *ids = NULL;
  double x = 0;
  EXPECT(DH_NULL_PARAMETER, dh_loader_next(NULL, 0, &batch));
  EXPECT(DH_NULL_PARAMETER, dh_loader_next(loader, 0, NULL));
  EXPECT(DH_NULL_PARAMETER, dh_loader_report_step(NULL, 0.1));
  EXPECT(DH_NULL_PARAMETER, dh_loader_prepare_ahead(NULL));
  EXPECT(DH_NULL_PARAMETER, dh_loader_ship_ahead(NULL, 0.1));
  /* dh_loader_step: a NULL loader, accelerator, output or callback is refused before any step. */
  dh_accelerator no_callbacks = {NULL, NULL, NULL, NULL};
  EXPECT(DH_NULL_PARAMETER, dh_loader_step(NULL, &no_callbacks, &batch));
  EXPECT(DH_NULL_PARAMETER, dh_loader_step(loader, NULL, &batch));
  EXPECT(DH_NULL_PARAMETER, dh_loader_step(loader, &no_callbacks, NULL));
  EXPECT(DH_NULL_PARAMETER, dh_loader_step(loader, &no_callbacks, &batch));
  ASSERT(batch == NULL);
  EXPECT(DH_NULL_PARAMETER, dh_loader_metrics(NULL, &m));
  EXPECT(DH_NULL_PARAMETER, dh_loader_metrics(loader, NULL));
  EXPECT(DH_NULL_PARAMETER, dh_loader_close(NULL));
  EXPECT(DH_NULL_PARAMETER, dh_loader_all_reduce_sum(NULL, &x, 1));
  EXPECT(DH_NULL_PARAMETER, dh_loader_all_reduce_sum(loader, NULL, 1));
  EXPECT(DH_NULL_PARAMETER, dh_batch_step(NULL, &u));
  EXPECT(DH_NULL_PARAMETER, dh_batch_len(NULL, &n));
  EXPECT(DH_NULL_PARAMETER, dh_batch_ids(NULL, &ids, &n));
  EXPECT(DH_NULL_PARAMETER, dh_batch_skipped(NULL, &ids, &n));
  EXPECT(DH_NULL_PARAMETER, dh_batch_tensor(NULL, 0, &t));
  EXPECT(DH_NULL_PARAMETER, dh_batch_tokens(NULL, 0, &u));
  EXPECT(DH_NULL_PARAMETER, dh_batch_input_wait(NULL, &x));
  const char *text = NULL;
  size_t text_len = 0;
  const double *times = NULL;
  EXPECT(DH_NULL_PARAMETER, dh_batch_meta(NULL, 0, &text, &n));
  EXPECT(DH_NULL_PARAMETER, dh_batch_timestamps(NULL, 0, &times, &n));
  dh_batch_release(NULL);
  dh_batch_release(&batch); /* *batch is NULL */

  /* Reporting before any step, and a too-short timeout under MPI. */
  EXPECT(DH_INVALID_PARAMETER, dh_loader_report_step(loader, 0.1));
  if (size > 1) EXPECT(DH_UNSUPPORTED, dh_loader_next(loader, 1, &batch));
  ASSERT(batch == NULL);
  CHECK(dh_loader_all_reduce_sum(loader, NULL, 0)); /* collective, on every rank */

  /* Another thread is refused; the loader goes on afterwards on its own thread. */
  pthread_t other;
  ASSERT(pthread_create(&other, NULL, from_another_thread, loader) == 0);
  ASSERT(pthread_join(other, NULL) == 0);

  /* Step 0: out-of-range indices and NULL outputs on a live batch; bad reports. */
  CHECK(dh_loader_next(loader, 0, &batch));
  CHECK(dh_batch_len(batch, &n));
  EXPECT(DH_OUT_OF_RANGE, dh_batch_tensor(batch, n, &t));
  EXPECT(DH_OUT_OF_RANGE, dh_batch_tokens(batch, n + 1000, &u));
  EXPECT(DH_OUT_OF_RANGE, dh_batch_meta(batch, n, &text, &text_len));
  EXPECT(DH_OUT_OF_RANGE, dh_batch_timestamps(batch, n, &times, &text_len));
  EXPECT(DH_NULL_PARAMETER, dh_batch_meta(batch, 0, NULL, &text_len));
  EXPECT(DH_NULL_PARAMETER, dh_batch_timestamps(batch, 0, &times, NULL));
  EXPECT(DH_NULL_PARAMETER, dh_batch_tensor(batch, 0, NULL));
  EXPECT(DH_NULL_PARAMETER, dh_batch_ids(batch, NULL, &n));
  EXPECT(DH_NULL_PARAMETER, dh_batch_ids(batch, &ids, NULL));
  EXPECT(DH_NULL_PARAMETER, dh_batch_step(batch, NULL));
  EXPECT(DH_NULL_PARAMETER, dh_batch_len(batch, NULL));
  EXPECT(DH_NULL_PARAMETER, dh_batch_input_wait(batch, NULL));
  EXPECT(DH_INVALID_PARAMETER, dh_loader_report_step(loader, -1.0));
  EXPECT(DH_INVALID_PARAMETER, dh_loader_report_step(loader, NAN));
  dh_batch_release(&batch);
  dh_batch_release(&batch); /* twice: a no-op */
  CHECK(dh_loader_report_step(loader, 0.01)); /* after release: allowed */
  EXPECT(DH_INVALID_PARAMETER, dh_loader_report_step(loader, 0.01)); /* twice */

  /* Step 1: a batch kept across close stays readable until released. */
  dh_batch *kept = NULL;
  CHECK(dh_loader_next(loader, 0, &kept));
  CHECK(dh_loader_close(loader));
  CHECK(dh_loader_close(loader)); /* closing twice: a no-op */
  CHECK(dh_batch_len(kept, &n));
  unsigned long sum = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK(dh_batch_tensor(kept, i, &t));
    for (uint64_t k = 0; k < t.nbytes; k++) sum += t.data[k];
  }
  (void)sum;

  /* Next after close. */
  EXPECT(DH_CLOSED, dh_loader_next(loader, 0, &batch));
  ASSERT(batch == NULL);
  EXPECT(DH_CLOSED, dh_loader_report_step(loader, 0.01));
  EXPECT(DH_CLOSED, dh_loader_prepare_ahead(loader));
  EXPECT(DH_CLOSED, dh_loader_ship_ahead(loader, 0.01));
  EXPECT(DH_CLOSED, dh_loader_all_reduce_sum(loader, &x, 1));
  /* struct_size: unset is refused with a message; a caller built against a longer future
     dh_metrics gets this build's fields and its extra bytes untouched. */
  memset(&m, 0, sizeof m);
  EXPECT(DH_INVALID_PARAMETER, dh_loader_metrics(loader, &m));
  ASSERT(strstr(dh_test_message(), "struct_size") != NULL);
  struct {
    dh_metrics v;
    uint64_t later_field;
  } longer;
  memset(&longer, 0, sizeof longer);
  longer.v.struct_size = sizeof longer;
  longer.later_field = 0xfeedULL;
  CHECK(dh_loader_metrics(loader, &longer.v));
  ASSERT(longer.v.struct_size == sizeof(dh_metrics) && longer.later_field == 0xfeedULL);
  ASSERT(longer.v.steps == 2);
  m.struct_size = sizeof m;
  CHECK(dh_loader_metrics(loader, &m));
  ASSERT(m.steps == 2 && m.struct_size == sizeof m);
  CHECK(dh_loader_world(loader, &rank, &size));
  dh_loader_free(loader);
  dh_loader_free(NULL);
  dh_batch_release(&kept); /* after its loader was freed */
  ASSERT(kept == NULL);
  printf("ok %zu\n", rank);
  return 0;
}
