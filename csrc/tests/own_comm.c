/* A job that splits MPI_COMM_WORLD into two data-parallel groups (even and odd ranks) and gives
 * each group its own loader on its own communicator (dh_loader_new_with_comm), group g with seed
 * 10 + g. Between loader calls it runs collectives of its own on MPI_COMM_WORLD, across both
 * groups. Half-way it saves the loader's state (dh_loader_state), frees the loader, and goes on
 * with a new one made from that state (the "resume" key).
 *
 *   mpirun -np 4 ./own_comm DATASET POLICY STEPS GLOBAL_BATCH
 * (with DH_TEST_BACKEND=hccl the loaders' collectives run on HCCL over those communicators)
 * prints, per rank and step, "ids GROUP STEP GROUP_RANK id,... skipped id,..." and "ok RANK". */
#include <mpi.h>
#include <stdint.h>

#include "dh_test.h"

static dh_loader *open_loader(char **argv, int group, MPI_Comm *comm, const char *resume) {
  char seed[32];
  snprintf(seed, sizeof seed, "%d", 10 + group);
  dh_config *cfg = NULL;
  CHECK(dh_config_new(&cfg));
  CHECK(dh_config_set(cfg, "data", argv[1]));
  CHECK(dh_config_set(cfg, "policy", argv[2]));
  CHECK(dh_config_set(cfg, "steps", argv[3]));
  CHECK(dh_config_set(cfg, "global_batch", argv[4]));
  CHECK(dh_config_set(cfg, "workers", "2"));
  CHECK(dh_config_set(cfg, "seed", seed));
  CHECK(dh_config_set(cfg, "cpu_budget", "false"));
  dh_test_backend_from_env(cfg);
  if (resume) CHECK(dh_config_set(cfg, "resume", resume));
  dh_loader *loader = NULL;
  CHECK(dh_loader_new_with_comm(cfg, comm, &loader));
  dh_config_free(cfg);
  return loader;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s DATASET POLICY STEPS GLOBAL_BATCH\n", argv[0]);
    return 2;
  }
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int group = rank % 2;
  MPI_Comm dp;
  MPI_Comm_split(MPI_COMM_WORLD, group, rank, &dp);
  const unsigned long steps = strtoul(argv[3], NULL, 10);

  /* A NULL or MPI_COMM_NULL communicator is refused before anything collective. */
  dh_config *probe = NULL;
  CHECK(dh_config_new(&probe));
  CHECK(dh_config_set(probe, "data", argv[1]));
  dh_loader *none = NULL;
  EXPECT(DH_NULL_PARAMETER, dh_loader_new_with_comm(probe, NULL, &none));
  MPI_Comm null_comm = MPI_COMM_NULL;
  EXPECT(DH_MPI_INIT, dh_loader_new_with_comm(probe, &null_comm, &none));
  ASSERT(none == NULL);
  dh_config_free(probe);

  dh_loader *loader = open_loader(argv, group, &dp, NULL);
  size_t dp_rank = 0, dp_size = 0;
  CHECK(dh_loader_world(loader, &dp_rank, &dp_size));
  ASSERT(dp_size == (size_t)size / 2);

  for (unsigned long step = 0; step < steps; step++) {
    if (step == steps / 2) {
      /* Checkpoint and continue on a new loader, as a restarted job would. */
      size_t needed = 0;
      CHECK(dh_loader_state(loader, NULL, 0, &needed));
      char *state = malloc(needed);
      ASSERT(state);
      size_t again = 0;
      CHECK(dh_loader_state(loader, state, needed, &again));
      ASSERT(again == needed && strlen(state) + 1 == needed);
      ASSERT(strstr(state, "\"next_step\"") != NULL);
      dh_loader_free(loader);
      loader = open_loader(argv, group, &dp, state);
      free(state);
    }
    dh_batch *batch = NULL;
    CHECK(dh_loader_next(loader, 0, &batch));
    uint64_t got_step = 0;
    CHECK(dh_batch_step(batch, &got_step));
    ASSERT(got_step == step);
    size_t n = 0, n_skipped = 0;
    const uint64_t *ids = NULL, *skipped = NULL;
    CHECK(dh_batch_ids(batch, &ids, &n));
    CHECK(dh_batch_skipped(batch, &skipped, &n_skipped));
    printf("ids %d %lu %zu ", group, step, dp_rank);
    for (size_t i = 0; i < n; i++) printf("%s%llu", i ? "," : "", (unsigned long long)ids[i]);
    printf(" skipped ");
    for (size_t i = 0; i < n_skipped; i++) printf("%s%llu", i ? "," : "", (unsigned long long)skipped[i]);
    printf("\n");
    fflush(stdout);
    /* The job's own collective across both groups, between loader calls. */
    int held = (int)(n + n_skipped), total = 0;
    MPI_Allreduce(&held, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    ASSERT((unsigned long)total == 2 * strtoul(argv[4], NULL, 10));
    CHECK(dh_loader_prepare_ahead(loader));
    CHECK(dh_loader_ship_ahead(loader, 0.01));
    CHECK(dh_loader_report_step(loader, 0.02));
    MPI_Barrier(MPI_COMM_WORLD);
    dh_batch_release(&batch);
  }
  dh_loader_free(loader);
  /* The caller's communicator is still the caller's. */
  int dp_check = 0;
  ASSERT(MPI_Comm_size(dp, &dp_check) == MPI_SUCCESS && dp_check == size / 2);
  MPI_Comm_free(&dp);
  printf("ok %d\n", rank);
  MPI_Finalize();
  return 0;
}
