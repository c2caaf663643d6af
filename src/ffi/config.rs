//! `dh_config`: how to load, from key/value pairs or a TOML file.

use std::ffi::c_char;
use std::path::PathBuf;
use std::time::Duration;

use super::{dh_result, ffi_boundary, out_arg, str_arg, Error};
use crate::comm;
use crate::exec::loader::LoaderConfig;
use crate::exec::state::LoaderState;

/// How to load: an opaque, owned configuration. Create it with `dh_config_new` or
/// `dh_config_from_file`, change it with `dh_config_set`, free it with `dh_config_free`.
/// `dh_loader_new` copies what it needs, so the configuration may be freed (or reused) right
/// after. Not thread-safe: use one configuration from one thread at a time.
pub struct dh_config {
    pub(crate) loader: LoaderConfig,
    pub(crate) comm: comm::Config,
    pub(crate) warmup: u64,
    /// The state to continue from (`resume` / `resume_file`).
    pub(crate) resume: Option<LoaderState>,
    /// Ranks per replica group (`replica_ranks`; 1: none).
    pub(crate) replica_ranks: usize,
    /// The collectives' backend (`backend`: `mpi`, or `hccl` in a build with it).
    pub(crate) backend: comm::Backend,
}

/// The keys of `dh_config_set` and of configuration files.
pub(crate) const KEYS: &[&str] = &[
    "data",
    "index_dir",
    "policy",
    "global_batch",
    "workers",
    "seed",
    "mix",
    "steps",
    "warmup",
    "lookahead",
    "budget_mib",
    "cpu_budget",
    "cores",
    "job",
    "check_plan",
    "split_above_s",
    "plan_group_ranks",
    "replica_ranks",
    "backend",
    "late_pieces",
    "transfer_model",
    "max_frames",
    "max_pixels",
    "collective_timeout_s",
    "decode_timeout_s",
    "max_skip_rate",
    "resume",
    "resume_file",
];

fn invalid(key: &str, value: &str, what: &str) -> Error {
    let value = crate::text::clipped(value, 80);
    let what = crate::text::clipped(what, 400);
    Error::new(dh_result::DH_INVALID_PARAMETER, format!("configuration key {key:?}: value {value:?}: {what}"))
}

fn num<T: std::str::FromStr>(key: &str, value: &str, what: &str) -> Result<T, Error> {
    value.trim().parse().map_err(|_| invalid(key, value, what))
}

fn boolean(key: &str, value: &str) -> Result<bool, Error> {
    match value.trim() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(invalid(key, value, "expected true or false")),
    }
}

/// A long value cut for an error message.
fn abbreviated(value: &str) -> String {
    match value.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &value[..at]),
        None => value.to_string(),
    }
}

impl dh_config {
    /// Defaults: no dataset yet, policy helix, G = 16, W = 4, 2 steps ahead, no step limit,
    /// collective watchdog from `DATAHELIX_COLLECTIVE_TIMEOUT` (else 300 s).
    pub(crate) fn defaults() -> Result<dh_config, Error> {
        let comm = comm::Config::from_env()
            .map_err(|e| Error::new(dh_result::DH_INVALID_PARAMETER, e.to_string()))?;
        Ok(dh_config {
            loader: LoaderConfig::new(PathBuf::new()),
            comm,
            warmup: 0,
            resume: None,
            replica_ranks: 1,
            backend: comm::Backend::Mpi,
        })
    }

    /// The defaults of [`dh_config_new`], for Rust bindings.
    pub fn new() -> Result<dh_config, Error> {
        dh_config::defaults()
    }

    /// Sets one key from its text form (the keys and values of `dh_config_set`).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), Error> {
        let l = &mut self.loader;
        match key {
            "data" => {
                if value.is_empty() {
                    return Err(invalid(key, value, "expected the dataset folder"));
                }
                l.data = PathBuf::from(value);
            }
            "index_dir" => l.index_dir = (!value.is_empty()).then(|| PathBuf::from(value)),
            "policy" => l.policy = value.trim().parse().map_err(|e: String| invalid(key, value, &e))?,
            "global_batch" => l.global_batch = num(key, value, "expected a positive integer")?,
            "workers" => l.workers = num(key, value, "expected a positive integer")?,
            "seed" => l.seed = num(key, value, "expected an unsigned integer")?,
            "mix" => {
                l.mix = match value.trim() {
                    "" => None,
                    text => Some(text.parse().map_err(|e: String| invalid(key, value, &e))?),
                }
            }
            "steps" => l.steps = num(key, value, "expected an unsigned integer")?,
            "warmup" => self.warmup = num(key, value, "expected an unsigned integer")?,
            "lookahead" => l.lookahead = num(key, value, "expected a positive integer")?,
            "budget_mib" => {
                let mib: usize = num(key, value, "expected MiB, an unsigned integer")?;
                l.budget_bytes = mib.checked_mul(1 << 20).ok_or_else(|| invalid(key, value, "too large"))?;
            }
            "cpu_budget" => l.cpu_budget = boolean(key, value)?,
            "cores" => {
                let c: f64 = num(key, value, "expected a number of cores")?;
                if !(c.is_finite() && c >= 0.0) {
                    return Err(invalid(key, value, "expected a non-negative number (0: all cores)"));
                }
                l.cores = c;
            }
            "job" => l.job = value.to_string(),
            "check_plan" => l.check_plan = boolean(key, value)?,
            "late_pieces" => l.late_pieces = boolean(key, value)?,
            "backend" => self.backend = value.trim().parse().map_err(|e: String| invalid(key, value, &e))?,
            "transfer_model" => {
                l.measure_transfer = match value.trim() {
                    "default" => false,
                    "measured" => true,
                    _ => return Err(invalid(key, value, "expected default or measured")),
                }
            }
            "split_above_s" => {
                let v: f64 = value.trim().parse().map_err(|_| invalid(key, value, "expected seconds"))?;
                if !(v.is_finite() && v >= 0.0) {
                    return Err(invalid(key, value, "expected finite, non-negative seconds"));
                }
                l.split_above_s = Some(v);
            }
            "plan_group_ranks" => {
                l.plan_group_ranks = num(key, value, "expected ranks per planning group (0: automatic)")?
            }
            "replica_ranks" => {
                let n: usize = num(key, value, "expected ranks per replica group (1: none)")?;
                if n == 0 {
                    return Err(invalid(key, value, "expected at least 1 rank per replica group (1: none)"));
                }
                self.replica_ranks = n;
            }
            "max_frames" => l.params.max_frames = num(key, value, "expected a positive integer")?,
            "max_pixels" => l.params.max_pixels = num(key, value, "expected a positive integer")?,
            "collective_timeout_s" => {
                let s: f64 = num(key, value, "expected seconds")?;
                if !(s.is_finite() && s > 0.0) {
                    return Err(invalid(key, value, "expected a positive number of seconds"));
                }
                self.comm.timeout = Duration::try_from_secs_f64(s)
                    .map_err(|_| invalid(key, value, "too many seconds to be a timeout"))?;
            }
            "decode_timeout_s" => {
                let s: f64 = num(key, value, "expected seconds")?;
                if !(s.is_finite() && s >= 0.0) {
                    return Err(invalid(key, value, "expected finite, non-negative seconds (0: no limit)"));
                }
                l.decode_timeout = (s > 0.0).then(|| Duration::from_secs_f64(s.min(1e9)));
            }
            "max_skip_rate" => {
                let r: f64 = num(key, value, "expected a fraction")?;
                if !(r.is_finite() && r >= 0.0) {
                    return Err(invalid(key, value, "expected a fraction, 0 to 1 (1: no limit)"));
                }
                l.max_skip_rate = r;
            }
            "resume" => {
                let state =
                    LoaderState::from_json(value).map_err(|e| invalid(key, &abbreviated(value), &e))?;
                self.resume = Some(state);
            }
            "resume_file" => {
                let state = LoaderState::read(std::path::Path::new(value)).map_err(|e| {
                    Error::new(dh_result::DH_INVALID_PARAMETER, format!("configuration key {key:?}: {e}"))
                })?;
                self.resume = Some(state);
            }
            _ => {
                return Err(Error::new(
                    dh_result::DH_UNKNOWN_KEY,
                    format!("unknown configuration key {key:?}; known keys: {}", KEYS.join(", ")),
                ))
            }
        }
        Ok(())
    }

    /// Sets every key of a TOML document (top-level `key = value` pairs only).
    pub(crate) fn set_toml(&mut self, text: &str, origin: &str) -> Result<(), Error> {
        let table: toml::Table =
            text.parse().map_err(|e| Error::new(dh_result::DH_PARSE, format!("{origin}: {e}")))?;
        for (key, value) in &table {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(Error::new(
                        dh_result::DH_PARSE,
                        format!(
                            "{origin}: key {key:?}: a {} is not a setting; use a string, number or boolean",
                            other.type_str()
                        ),
                    ))
                }
            };
            self.set(key, &text).map_err(|e| Error::new(e.code, format!("{origin}: {}", e.message)))?;
        }
        Ok(())
    }
}

/// Creates a configuration with the defaults (no dataset: set `"data"` before `dh_loader_new`).
/// On success writes a new configuration to `*config_out`, owned by the caller (free it with
/// `dh_config_free`). Fails with `DH_NULL_PARAMETER` when `config_out` is NULL and with
/// `DH_INVALID_PARAMETER` when `DATAHELIX_COLLECTIVE_TIMEOUT` or `DATAHELIX_MPI_MAX_MESSAGE` in
/// the environment is malformed. Thread-safe.
#[no_mangle]
pub extern "C" fn dh_config_new(config_out: *mut *mut dh_config) -> dh_result {
    ffi_boundary!({
        let config_out = out_arg(config_out, "config_out")?;
        let cfg = Box::new(dh_config::defaults()?);
        // SAFETY: config_out is not NULL and, by the header's contract, points to writable
        // storage for one pointer.
        unsafe { config_out.write(Box::into_raw(cfg)) };
        Ok(())
    })
}

/// Reads a configuration from a TOML file of top-level `key = value` pairs (the keys of
/// `dh_config_set`; values may be strings, integers, floats or booleans), over the defaults.
/// On success writes a new configuration to `*config_out`, owned by the caller. Fails with
/// `DH_NULL_PARAMETER` (a NULL argument), `DH_INVALID_PARAMETER` (path not UTF-8, or a bad
/// value), `DH_IO` (unreadable file), `DH_PARSE` (not TOML, or a table/array value) or
/// `DH_UNKNOWN_KEY` (the message names the key); nothing is written then. Thread-safe.
#[no_mangle]
pub extern "C" fn dh_config_from_file(path: *const c_char, config_out: *mut *mut dh_config) -> dh_result {
    ffi_boundary!({
        // SAFETY: by the header's contract path is NULL or a NUL-terminated string.
        let path = unsafe { str_arg(path, "path") }?;
        let config_out = out_arg(config_out, "config_out")?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::new(dh_result::DH_IO, format!("cannot read configuration {path}: {e}")))?;
        let mut cfg = dh_config::defaults()?;
        cfg.set_toml(&text, path)?;
        // SAFETY: config_out is not NULL and points to writable storage for one pointer.
        unsafe { config_out.write(Box::into_raw(Box::new(cfg))) };
        Ok(())
    })
}

/// Sets one key from its text form. Keys: `data` (dataset folder, indexed with `datahelix
/// index`), `index_dir` (the folder of its index when not inside the dataset, as `datahelix
/// index --index-dir`; default `DATAHELIX_INDEX_DIR`, else the dataset's `.datahelix/`), `policy` (`helix`, `rank-local`, `actor-pool`, `post-balance`, `helix-batching`,
/// `helix-placement`), `global_batch`, `workers` (decode workers across all ranks), `seed`,
/// `mix` (draw the global batches from the dataset's groups — the first folders of its samples'
/// paths — at integer weights, `video=3,image=1`, instead of uniformly; empty: uniform),
/// `steps` (steps the run takes; `dh_loader_next` returns `DH_END` after them; default: no
/// limit), `warmup` (first steps left out of `dh_loader_metrics`), `lookahead`, `budget_mib`,
/// `cpu_budget` (`true`/`false`: confine decode workers to a cgroup), `cores`, `job`,
/// `check_plan` (`true`/`false`), `split_above_s` (placement policies: decode every sample
/// predicted longer than this many seconds in pieces), `plan_group_ranks` (place decode work
/// within groups of this many consecutive ranks, each rank planning only its own; default 0:
/// automatic, groups only from 1024 ranks), `replica_ranks` (groups of this many consecutive
/// ranks — a tensor-parallel group — receive the same batch, byte for byte: only each group's
/// first rank decodes, as one rank of the data-parallel world of those first ranks, and sends
/// the batch to the rest of its group; the world size must be a multiple; default 1: none),
/// `backend` (`mpi`, default: collectives over MPI in host memory; `hccl`: over HCCL on the
/// rank's Ascend device, bootstrapped over MPI — the job's world or the communicator passed —,
/// in a library built with the `hccl` feature, else refused at `dh_loader_new`),
/// `late_pieces` (`true`/`false`, default `false`: in
/// a step where some rank must wait whatever the schedule — the CPUs cannot keep up, or decode
/// chains outlast the deadline — the last ranks (of each planning group) wait for their input
/// and the pieces others decoded for them cross from their next call — only where every rank calls
/// `dh_loader_prepare_ahead` or `dh_loader_ship_ahead` right after `dh_loader_next`, before any
/// collective of its own, as `dh_loader_step` does), `transfer_model` (`default`: 20 µs +
/// 5 GB/s; `measured`: an all-to-all-v sweep at `dh_loader_new`, the same model on every rank),
/// `max_frames`, `max_pixels`,
/// `collective_timeout_s` (the
/// collectives' watchdog, see `dh_loader_next`), `decode_timeout_s` (the most one sample's
/// decode may take before it is skipped with a reason; default 60, 0: no limit),
/// `max_skip_rate` (the largest fraction of planned samples that may fail before the run ends
/// with their ids, once 10 have; default 0.01, 1: no limit), `resume` (a state document from
/// `dh_loader_state`: the loader continues that run; checked here, and against the dataset by
/// `dh_loader_new`) or `resume_file` (a file holding one, e.g. from `datahelix train
/// --save-state`). Fails with `DH_NULL_PARAMETER`,
/// `DH_UNKNOWN_KEY` (the message names the key and lists the known ones) or
/// `DH_INVALID_PARAMETER` (the message names the key and the expected value); the configuration
/// is unchanged then. Not thread-safe for one configuration.
#[no_mangle]
pub extern "C" fn dh_config_set(
    config: *mut dh_config,
    key: *const c_char,
    value: *const c_char,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: config is NULL or a live configuration from dh_config_new/_from_file that no
        // other thread uses now (header contract).
        let config = unsafe { config.as_mut() }.ok_or_else(|| Error::null("config"))?;
        // SAFETY: key and value are NULL or NUL-terminated strings (header contract).
        let (key, value) = unsafe { (str_arg(key, "key")?, str_arg(value, "value")?) };
        config.set(key, value)
    })
}

/// Frees a configuration. NULL is a no-op. Freeing twice, or using the configuration afterwards,
/// is undefined behaviour (as with `free`).
#[no_mangle]
pub extern "C" fn dh_config_free(config: *mut dh_config) {
    ffi_boundary!(() => {
        if !config.is_null() {
            // SAFETY: config came from Box::into_raw in dh_config_new/_from_file and, by the
            // header's contract, is freed once.
            drop(unsafe { Box::from_raw(config) });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_toml() {
        let mut c = dh_config::defaults().unwrap();
        c.set("global_batch", "8").unwrap();
        assert_eq!(c.loader.global_batch, 8);
        let e = c.set("nope", "1").unwrap_err();
        assert_eq!(e.code, dh_result::DH_UNKNOWN_KEY);
        assert!(e.message.contains("\"nope\""));
        let e = c.set("workers", "many").unwrap_err();
        assert_eq!(e.code, dh_result::DH_INVALID_PARAMETER);
        c.set_toml("data = \"/d\"\nsteps = 5\ncpu_budget = false\ncores = 2.5\npolicy = \"rank-local\"", "t")
            .unwrap();
        assert_eq!((c.loader.steps, c.loader.cores), (5, 2.5));
        assert!(!c.loader.late_pieces, "late ranks are the caller's choice");
        c.set("late_pieces", "true").unwrap();
        assert!(c.loader.late_pieces);
        assert_eq!(c.set("late_pieces", "sometimes").unwrap_err().code, dh_result::DH_INVALID_PARAMETER);
        assert_eq!(c.set_toml("x = [1]", "t").unwrap_err().code, dh_result::DH_PARSE);
        assert_eq!(c.set_toml("bogus = 1", "t").unwrap_err().code, dh_result::DH_UNKNOWN_KEY);
        assert_eq!(c.set_toml("= =", "t").unwrap_err().code, dh_result::DH_PARSE);
        let e = c.set("resume", "{\"format\": \"datahelix-loader-state\"").unwrap_err();
        assert_eq!(e.code, dh_result::DH_INVALID_PARAMETER);
        assert!(e.message.contains("truncated"), "{}", e.message);
        assert!(c.resume.is_none());
        let e = c.set("resume_file", "/nonexistent/state.json").unwrap_err();
        assert!(e.message.contains("/nonexistent/state.json"), "{}", e.message);
    }
}
