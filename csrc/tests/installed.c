/* A client of the *installed* library: tests/install.rs copies this file out of the source tree
 * and builds it with nothing but `pkg-config --cflags --libs datahelix` (and, once more, with
 * `--static`), then runs it under mpirun with the prefix's lib/ as the only place to find
 * libdatahelix.so.0. It checks the header's version macros against the library it runs on and
 * prints, per rank and step, "ids STEP RANK id,id,... skipped id,..." and finally "ok RANK VERSION".
 *
 *   mpirun -np 2 ./installed DATASET STEPS GLOBAL_BATCH */
#include <datahelix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(DH_VERSION_MAJOR) || !defined(DH_VERSION_MINOR) || !defined(DH_VERSION_PATCH)
#error "datahelix.h has no DH_VERSION_MAJOR/MINOR/PATCH"
#endif

static void check(dh_result r, const char *what) {
  if (r != DH_OK) {
    char msg[1024];
    dh_error_message(msg, sizeof msg);
    fprintf(stderr, "%s: %s: %s\n", what, dh_result_name(r), msg);
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s DATASET STEPS GLOBAL_BATCH\n", argv[0]);
    return 2;
  }
  /* The library that runs is the one the header describes: "datahelix MAJOR.MINOR.PATCH". */
  char want[64];
  snprintf(want, sizeof want, "datahelix %d.%d.%d", DH_VERSION_MAJOR, DH_VERSION_MINOR, DH_VERSION_PATCH);
  if (strcmp(dh_version(), want) != 0) {
    fprintf(stderr, "header says %s, library says %s\n", want, dh_version());
    return 1;
  }
  dh_config *cfg = NULL;
  check(dh_config_new(&cfg), "dh_config_new");
  check(dh_config_set(cfg, "data", argv[1]), "data");
  check(dh_config_set(cfg, "steps", argv[2]), "steps");
  check(dh_config_set(cfg, "global_batch", argv[3]), "global_batch");
  check(dh_config_set(cfg, "policy", "helix"), "policy");
  check(dh_config_set(cfg, "workers", "2"), "workers");
  check(dh_config_set(cfg, "cpu_budget", "false"), "cpu_budget");
  check(dh_config_set(cfg, "max_frames", "4"), "max_frames");
  dh_loader *loader = NULL;
  check(dh_loader_new(cfg, &loader), "dh_loader_new");
  dh_config_free(cfg);
  size_t rank = 0, size = 0;
  check(dh_loader_world(loader, &rank, &size), "dh_loader_world");
  const unsigned long steps = strtoul(argv[2], NULL, 10);
  for (unsigned long step = 0; step < steps; step++) {
    dh_batch *batch = NULL;
    check(dh_loader_next(loader, 0, &batch), "dh_loader_next");
    const uint64_t *ids = NULL;
    size_t n = 0;
    check(dh_batch_ids(batch, &ids, &n), "dh_batch_ids");
    const uint64_t *skipped = NULL;
    size_t n_skipped = 0;
    check(dh_batch_skipped(batch, &skipped, &n_skipped), "dh_batch_skipped");
    printf("ids %lu %zu ", step, rank);
    for (size_t i = 0; i < n; i++) printf("%s%llu", i ? "," : "", (unsigned long long)ids[i]);
    printf(" skipped ");
    for (size_t i = 0; i < n_skipped; i++) printf("%s%llu", i ? "," : "", (unsigned long long)skipped[i]);
    printf("\n");
    check(dh_loader_prepare_ahead(loader), "dh_loader_prepare_ahead");
    check(dh_loader_ship_ahead(loader, 0.0), "dh_loader_ship_ahead");
    dh_batch_release(&batch);
    check(dh_loader_report_step(loader, 0.005), "dh_loader_report_step");
  }
  dh_metrics m = {.struct_size = sizeof(dh_metrics)};
  check(dh_loader_metrics(loader, &m), "dh_loader_metrics");
  if (m.steps == 0) {
    fprintf(stderr, "rank %zu measured no steps\n", rank);
    return 1;
  }
  dh_loader_free(loader);
  printf("ok %zu %s\n", rank, want);
  return 0;
}
