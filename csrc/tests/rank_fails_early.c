/* One rank fails before its loader exists and exits; the others are creating theirs. The job
 * must end with an error within the collective timeout, never hang: the failing rank's exit
 * waits in MPI_Finalize (the library initialised MPI for it, in an earlier failed
 * dh_loader_new), the others in the loader's communicator duplicate.
 *
 *   mpirun -np 2 ./rank_fails_early DATASET       (exits non-zero; prints "rank R: ...") */
#include <stdlib.h>

#include "dh_test.h"

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DATASET\n", argv[0]);
    return 2;
  }
  const char *rank = getenv("OMPI_COMM_WORLD_RANK");
  ASSERT(rank != NULL);
  dh_config *cfg = NULL;
  dh_loader *loader = NULL;
  CHECK(dh_config_new(&cfg));
  CHECK(dh_config_set(cfg, "collective_timeout_s", "5"));
  /* Every rank: a missing dataset (MPI is initialised by the library, then the loader fails). */
  CHECK(dh_config_set(cfg, "data", "/nonexistent/dataset"));
  EXPECT(DH_INDEX, dh_loader_new(cfg, &loader));
  if (atoi(rank) == 1) {
    fprintf(stderr, "rank %s: fails on its own before its second loader; exiting\n", rank);
    exit(1);
  }
  CHECK(dh_config_set(cfg, "data", argv[1]));
  dh_result got = dh_loader_new(cfg, &loader);
  fprintf(stderr, "rank %s: dh_loader_new returned %s\n", rank, dh_result_name(got));
  return 1;
}
