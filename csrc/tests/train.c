/* Trains a few emulated steps through the C ABI under mpirun: checks steps, ids, shapes and
 * tensor bytes, releases every batch (twice: the second is a no-op), reports accelerator time,
 * all-reduces an emulated gradient, reads metrics, and checks DH_END and DH_CLOSED.
 *
 *   mpirun -np 2 ./train DATASET STEPS GLOBAL_BATCH
 * prints, per rank and step: "ids STEP RANK id,id,... skipped id,..." and finally "ok RANK". */
#include <math.h>
#include <time.h>

#include "dh_test.h"

static void sleep_s(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s DATASET STEPS GLOBAL_BATCH\n", argv[0]);
    return 2;
  }
  const unsigned long steps = strtoul(argv[2], NULL, 10);
  const unsigned long global_batch = strtoul(argv[3], NULL, 10);
  ASSERT(dh_version() != NULL && strncmp(dh_version(), "datahelix ", 10) == 0);

  dh_config *cfg = NULL;
  CHECK(dh_config_new(&cfg));
  CHECK(dh_config_set(cfg, "data", argv[1]));
  CHECK(dh_config_set(cfg, "steps", argv[2]));
  CHECK(dh_config_set(cfg, "global_batch", argv[3]));
  CHECK(dh_config_set(cfg, "workers", "2"));
  CHECK(dh_config_set(cfg, "seed", "1"));
  CHECK(dh_config_set(cfg, "cpu_budget", "false"));
  CHECK(dh_config_set(cfg, "check_plan", "true"));
  CHECK(dh_config_set(cfg, "max_frames", "4"));
  dh_loader *loader = NULL;
  CHECK(dh_loader_new(cfg, &loader));
  dh_config_free(cfg); /* the loader keeps no reference to it */

  size_t rank = 99, size = 0;
  CHECK(dh_loader_world(loader, &rank, &size));
  ASSERT(rank < size);

  for (unsigned long step = 0; step < steps; step++) {
    dh_batch *batch = NULL;
    CHECK(dh_loader_next(loader, 0, &batch));
    ASSERT(batch != NULL);
    uint64_t got_step = 99;
    CHECK(dh_batch_step(batch, &got_step));
    ASSERT(got_step == step);
    size_t n = 0, n_ids = 0, n_skipped = 0;
    const uint64_t *ids = NULL, *skipped = NULL;
    CHECK(dh_batch_len(batch, &n));
    CHECK(dh_batch_ids(batch, &ids, &n_ids));
    CHECK(dh_batch_skipped(batch, &skipped, &n_skipped));
    ASSERT(n == n_ids && (n == 0 || ids != NULL));
    double wait = -1;
    CHECK(dh_batch_input_wait(batch, &wait));
    ASSERT(wait >= 0);

    printf("ids %lu %zu ", step, rank);
    for (size_t i = 0; i < n; i++) printf("%s%llu", i ? "," : "", (unsigned long long)ids[i]);
    printf(" skipped ");
    for (size_t i = 0; i < n_skipped; i++) printf("%s%llu", i ? "," : "", (unsigned long long)skipped[i]);
    printf("\n");

    uint64_t tokens = 0;
    unsigned long checksum = 0;
    for (size_t i = 0; i < n; i++) {
      dh_tensor t;
      CHECK(dh_batch_tensor(batch, i, &t));
      ASSERT(t.ndim == 4 && t.dtype == DH_DTYPE_U8 && t.device == DH_DEVICE_HOST);
      ASSERT(t.shape[0] >= 1 && t.shape[1] >= 1 && t.shape[2] >= 1 && t.shape[3] == 3);
      ASSERT(t.nbytes == t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]);
      ASSERT(t.data != NULL);
      /* Read every byte (valgrind checks that the view is valid, initialised memory). */
      for (uint64_t k = 0; k < t.nbytes; k++) checksum += t.data[k];
      uint64_t tk = 0;
      CHECK(dh_batch_tokens(batch, i, &tk));
      tokens += tk;
      const char *meta = NULL;
      size_t meta_len = 0;
      CHECK(dh_batch_meta(batch, i, &meta, &meta_len));
      ASSERT(meta != NULL && strlen(meta) == meta_len && meta[0] == '{');
      printf("meta %llu %s\n", (unsigned long long)ids[i], meta);
      const double *times = NULL;
      size_t n_times = 99;
      CHECK(dh_batch_timestamps(batch, i, &times, &n_times));
      ASSERT(n_times == t.shape[0] && times != NULL);
      printf("times %llu", (unsigned long long)ids[i]);
      for (size_t k = 0; k < n_times; k++) printf(" %.17g", times[k]);
      printf("\n");
    }
    (void)checksum;

    /* The emulated accelerator step (the loader plans and sends meanwhile, and ships the next
     * step's tensors at its end), then the gradient all-reduce every data-parallel step has. */
    double accel_s = 0.002 + 1e-8 * (double)tokens;
    CHECK(dh_loader_prepare_ahead(loader));
    sleep_s(accel_s);
    EXPECT(DH_INVALID_PARAMETER, dh_loader_ship_ahead(loader, -1.0));
    CHECK(dh_loader_ship_ahead(loader, 0.0));
    double grad[2] = {accel_s, (double)(n + n_skipped)};
    CHECK(dh_loader_all_reduce_sum(loader, grad, 2));
    ASSERT(fabs(grad[1] - (double)global_batch) < 0.5); /* every sample on exactly one rank */

    dh_batch_release(&batch);
    ASSERT(batch == NULL);
    dh_batch_release(&batch); /* released twice through the same variable: a no-op */
    CHECK(dh_loader_report_step(loader, accel_s));
  }

  dh_batch *extra = NULL;
  EXPECT(DH_END, dh_loader_next(loader, 0, &extra));
  ASSERT(extra == NULL);

  dh_metrics m = {.struct_size = sizeof(dh_metrics)};
  CHECK(dh_loader_metrics(loader, &m));
  ASSERT(m.struct_size == sizeof(dh_metrics));
  ASSERT(m.steps == steps);
  ASSERT(m.throughput > 0 && m.wall_s > 0 && m.accel_s > 0);
  ASSERT(m.miss_rate >= 0 && m.miss_rate <= 1 && m.p95_wait_s <= m.max_wait_s + 1e-12);
  printf("metrics %zu steps=%llu samples=%llu throughput=%.2f miss_rate=%.2f p95_wait_ms=%.1f\n", rank,
         (unsigned long long)m.steps, (unsigned long long)m.samples, m.throughput, m.miss_rate,
         m.p95_wait_s * 1e3);

  CHECK(dh_loader_close(loader));
  EXPECT(DH_CLOSED, dh_loader_next(loader, 0, &extra));
  ASSERT(extra == NULL);
  CHECK(dh_loader_metrics(loader, &m)); /* still readable */
  dh_loader_free(loader);
  printf("ok %zu\n", rank);
  return 0;
}
