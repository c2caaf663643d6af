/* Replica groups from C (the `replica_ranks` key): pairs of consecutive ranks, a tensor-parallel
 * pair, receive the same batch byte for byte; only each pair's first rank decodes. Half-way every
 * rank takes its loader's state, rank 1's (a follower's) goes to all, and every rank continues
 * on a new loader from it, as a job restarted from the checkpoint a follower wrote would.
 *
 *   mpirun -np 4 ./replicas DATASET POLICY STEPS GLOBAL_BATCH
 * (with DH_TEST_BACKEND=hccl the groups and the leaders' world run on HCCL)
 * prints, per rank and step, "batch STEP RANK GROUP LEADS HASH id,..." (HASH covers every id,
 * shape, tensor byte, frame time and metadata) and "meta STEP RANK ID JSON" per sample, per rank
 * "state RANK HASH" of the state taken half-way, and "ok RANK". */
#include <mpi.h>
#include <stdint.h>

#include "dh_test.h"

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

static dh_loader *open_loader(char **argv, const char *resume) {
  dh_config *cfg = NULL;
  CHECK(dh_config_new(&cfg));
  CHECK(dh_config_set(cfg, "data", argv[1]));
  CHECK(dh_config_set(cfg, "policy", argv[2]));
  CHECK(dh_config_set(cfg, "steps", argv[3]));
  CHECK(dh_config_set(cfg, "global_batch", argv[4]));
  CHECK(dh_config_set(cfg, "workers", "2"));
  CHECK(dh_config_set(cfg, "seed", "3"));
  CHECK(dh_config_set(cfg, "cpu_budget", "false"));
  CHECK(dh_config_set(cfg, "replica_ranks", "2"));
  dh_test_backend_from_env(cfg);
  if (resume) CHECK(dh_config_set(cfg, "resume", resume));
  dh_loader *loader = NULL;
  CHECK(dh_loader_new(cfg, &loader));
  dh_config_free(cfg);
  return loader;
}

/* This rank's state, then rank 1's on every rank (malloc'd). */
static char *state_of_rank_1(dh_loader *loader, int rank) {
  size_t needed = 0;
  CHECK(dh_loader_state(loader, NULL, 0, &needed));
  char *mine = malloc(needed);
  ASSERT(mine);
  CHECK(dh_loader_state(loader, mine, needed, &needed));
  printf("state %d %016llx\n", rank, (unsigned long long)fnv(0xcbf29ce484222325ULL, mine, strlen(mine)));
  unsigned long long len = rank == 1 ? (unsigned long long)needed : 0;
  MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, 1, MPI_COMM_WORLD);
  char *theirs = malloc(len);
  ASSERT(theirs);
  if (rank == 1) memcpy(theirs, mine, len);
  MPI_Bcast(theirs, (int)len, MPI_CHAR, 1, MPI_COMM_WORLD);
  free(mine);
  return theirs;
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
  const unsigned long steps = strtoul(argv[3], NULL, 10);

  /* Groups that do not divide the world are refused on every rank alike. */
  dh_config *odd = NULL;
  CHECK(dh_config_new(&odd));
  CHECK(dh_config_set(odd, "data", argv[1]));
  CHECK(dh_config_set(odd, "replica_ranks", "3"));
  EXPECT(DH_INVALID_PARAMETER, dh_config_set(odd, "replica_ranks", "0"));
  dh_loader *none = NULL;
  EXPECT(DH_LOADER, dh_loader_new(odd, &none));
  ASSERT(none == NULL && strstr(dh_test_message(), "do not divide") != NULL);
  dh_config_free(odd);

  dh_loader *loader = open_loader(argv, NULL);
  size_t world_rank = 0, world_size = 0;
  CHECK(dh_loader_world(loader, &world_rank, &world_size));
  ASSERT(world_rank == (size_t)rank && world_size == (size_t)size);

  for (unsigned long step = 0; step < steps; step++) {
    if (step == steps / 2) {
      char *state = state_of_rank_1(loader, rank);
      dh_loader_free(loader);
      loader = open_loader(argv, state);
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
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
      dh_tensor t;
      CHECK(dh_batch_tensor(batch, i, &t));
      h = fnv(h, &ids[i], sizeof ids[i]);
      h = fnv(h, t.shape, sizeof t.shape);
      h = fnv(h, t.data, (size_t)t.nbytes);
      const double *times = NULL;
      size_t n_times = 0;
      CHECK(dh_batch_timestamps(batch, i, &times, &n_times));
      ASSERT(n_times == t.shape[0] || n_times == 0);
      h = fnv(h, times, n_times * sizeof *times);
      const char *meta = NULL;
      size_t meta_len = 0;
      CHECK(dh_batch_meta(batch, i, &meta, &meta_len));
      ASSERT(strstr(meta, "\"path\"") != NULL);
      h = fnv(h, meta, meta_len);
      printf("meta %lu %d %llu %.*s\n", step, rank, (unsigned long long)ids[i], (int)meta_len, meta);
    }
    h = fnv(h, skipped, n_skipped * sizeof *skipped);
    printf("batch %lu %d %d %s %016llx ", step, rank, rank / 2, rank % 2 == 0 ? "true" : "false",
           (unsigned long long)h);
    for (size_t i = 0; i < n; i++) printf("%s%llu", i ? "," : "", (unsigned long long)ids[i]);
    for (size_t i = 0; i < n_skipped; i++) printf("%s%llu", i || n ? "," : "", (unsigned long long)skipped[i]);
    printf("\n");
    fflush(stdout);
    CHECK(dh_loader_prepare_ahead(loader));
    CHECK(dh_loader_ship_ahead(loader, 0.01));
    CHECK(dh_loader_report_step(loader, 0.02));
    /* The job's own collective over every rank, leaders and followers. */
    double one = 1.0;
    CHECK(dh_loader_all_reduce_sum(loader, &one, 1));
    ASSERT(one == (double)size);
    dh_batch_release(&batch);
  }
  dh_loader_free(loader);
  printf("ok %d\n", rank);
  MPI_Finalize();
  return 0;
}
