/* A training program that initialises MPI itself and runs its own blocking collectives on
 * MPI_COMM_WORLD between every pair of loader calls, as a training step does (a metrics
 * all-gather, a loss all-reduce, a barrier). Two ways through each step, alternating:
 *   - the calls one by one: next, all-gather, prepare_ahead, all-reduce, ship_ahead, barrier,
 *     report_step, all-reduce (the gradient);
 *   - dh_loader_step, whose launch callback runs the caller's all-gather inside the step.
 * With a DELAY_SEED every rank sleeps a random 0-40 ms before each loader call.
 *
 *   mpirun -np 4 ./own_collectives DATASET POLICY STEPS GLOBAL_BATCH WORKERS [DELAY_SEED] [SPLIT_ABOVE_S]
 * prints, per rank and step, "ids STEP RANK id,... skipped id,..." and finally "ok RANK". */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <time.h>

#include "dh_test.h"

static void sleep_s(double s) {
  if (s <= 0) return;
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int delays = 0;
static uint64_t delay_seed = 0, draws = 0;
static int my_rank = 0;

static void pause_randomly(void) {
  if (!delays) return;
  draws++;
  uint64_t r = splitmix64(delay_seed ^ splitmix64((uint64_t)my_rank * 1000003u + draws));
  sleep_s((double)(r % 40000) * 1e-6);
}

/* Prints the batch's ids and checks, with the caller's own collectives, that the ranks hold
 * the global batch between them exactly once. */
static void check_batch(dh_batch *batch, unsigned long step, unsigned long global_batch, double *accel_s) {
  size_t n = 0, n_skipped = 0;
  const uint64_t *ids = NULL, *skipped = NULL;
  CHECK(dh_batch_ids(batch, &ids, &n));
  CHECK(dh_batch_skipped(batch, &skipped, &n_skipped));
  uint64_t got_step = 0;
  CHECK(dh_batch_step(batch, &got_step));
  ASSERT(got_step == step);
  printf("ids %lu %d ", step, my_rank);
  for (size_t i = 0; i < n; i++) printf("%s%llu", i ? "," : "", (unsigned long long)ids[i]);
  printf(" skipped ");
  for (size_t i = 0; i < n_skipped; i++) printf("%s%llu", i ? "," : "", (unsigned long long)skipped[i]);
  printf("\n");
  fflush(stdout);
  /* The caller's all-gather: every rank's count, then every id. (An id may appear twice in a
   * batch that spans an epoch boundary, PROTOCOL v1.3; the Rust side compares the ids printed
   * with the sampler's batch, duplicates included.) */
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int mine = (int)(n + n_skipped);
  int *counts = calloc((size_t)size, sizeof *counts), *displs = calloc((size_t)size, sizeof *displs);
  ASSERT(counts && displs);
  MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; r++) {
    displs[r] = total;
    total += counts[r];
  }
  ASSERT((unsigned long)total == global_batch);
  uint64_t *all_ids = calloc((size_t)total + 1, sizeof *all_ids), *local = calloc((size_t)mine + 1, sizeof *local);
  ASSERT(all_ids && local);
  for (size_t i = 0; i < n; i++) local[i] = ids[i];
  for (size_t i = 0; i < n_skipped; i++) local[n + i] = skipped[i];
  MPI_Allgatherv(local, mine, MPI_UINT64_T, all_ids, counts, displs, MPI_UINT64_T, MPI_COMM_WORLD);
  /* Every rank received the same list. */
  uint64_t sum = 0, first = 0;
  for (int i = 0; i < total; i++) sum += all_ids[i] * (uint64_t)(i + 1);
  first = sum;
  MPI_Bcast(&first, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  ASSERT(first == sum);
  uint64_t tokens = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t tk = 0;
    CHECK(dh_batch_tokens(batch, i, &tk));
    tokens += tk;
  }
  *accel_s = 0.05 + 2e-6 * (double)tokens;
  free(counts);
  free(displs);
  free(all_ids);
  free(local);
}

/* dh_loader_step's accelerator: launch checks the batch (the caller's collectives inside the
 * step), the step then takes accel_s. */
struct step_state {
  unsigned long step, global_batch;
  double accel_s, started;
};

static int launch(void *user, const dh_batch *batch) {
  struct step_state *st = user;
  check_batch((dh_batch *)batch, st->step, st->global_batch, &st->accel_s);
  st->started = now_s();
  return 0;
}

static double seconds_left(void *user) {
  struct step_state *st = user;
  double left = st->started + st->accel_s - now_s();
  return left > 0 ? left : 0;
}

static double wait_step(void *user) {
  struct step_state *st = user;
  sleep_s(seconds_left(user));
  double loss = 0, mine = st->accel_s;
  MPI_Allreduce(&mine, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); /* the loss */
  return st->accel_s;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s DATASET POLICY STEPS GLOBAL_BATCH WORKERS [DELAY_SEED] [SPLIT_ABOVE_S]\n", argv[0]);
    return 2;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  if (argc > 6 && strcmp(argv[6], "-") != 0) {
    delays = 1;
    delay_seed = strtoull(argv[6], NULL, 10);
  }
  const unsigned long steps = strtoul(argv[3], NULL, 10);
  const unsigned long global_batch = strtoul(argv[4], NULL, 10);

  dh_config *cfg = NULL;
  CHECK(dh_config_new(&cfg));
  CHECK(dh_config_set(cfg, "data", argv[1]));
  CHECK(dh_config_set(cfg, "policy", argv[2]));
  CHECK(dh_config_set(cfg, "steps", argv[3]));
  CHECK(dh_config_set(cfg, "global_batch", argv[4]));
  CHECK(dh_config_set(cfg, "workers", argv[5]));
  CHECK(dh_config_set(cfg, "seed", "5"));
  CHECK(dh_config_set(cfg, "cpu_budget", "false"));
  CHECK(dh_config_set(cfg, "check_plan", "true"));
  if (argc > 7) CHECK(dh_config_set(cfg, "split_above_s", argv[7]));
  dh_loader *loader = NULL;
  CHECK(dh_loader_new(cfg, &loader));
  dh_config_free(cfg);

  for (unsigned long step = 0; step < steps; step++) {
    dh_batch *batch = NULL;
    if (step % 2 == 0) {
      pause_randomly();
      CHECK(dh_loader_next(loader, 0, &batch));
      double accel_s = 0;
      check_batch(batch, step, global_batch, &accel_s);
      pause_randomly();
      CHECK(dh_loader_prepare_ahead(loader));
      double loss = 0;
      MPI_Allreduce(&accel_s, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      sleep_s(accel_s * 0.5);
      pause_randomly();
      CHECK(dh_loader_ship_ahead(loader, accel_s * 0.5));
      MPI_Barrier(MPI_COMM_WORLD);
      sleep_s(accel_s * 0.5);
      pause_randomly();
      CHECK(dh_loader_report_step(loader, accel_s));
    } else {
      pause_randomly();
      struct step_state st = {step, global_batch, 0, 0};
      dh_accelerator accel = {launch, seconds_left, wait_step, &st};
      CHECK(dh_loader_step(loader, &accel, &batch));
    }
    double grad = 1, sum = 0;
    MPI_Allreduce(&grad, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); /* the gradient */
    dh_batch_release(&batch);
  }
  dh_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  CHECK(dh_loader_metrics(loader, &m));
  ASSERT(m.steps == steps);
  dh_loader_free(loader);
  printf("ok %d\n", my_rank);
  MPI_Finalize();
  return 0;
}
