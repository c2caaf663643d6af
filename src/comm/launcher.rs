//! Launchers that start several processes without MPI: each process would become rank 0 of 1
//! and train alone, silently. The check stops it.
//!
//! ```
//! use datahelix::comm::launcher::mismatch;
//!
//! // torchrun sets WORLD_SIZE and RANK; MPI, not started by a launcher it knows, sees one rank.
//! let env = [("WORLD_SIZE", "4"), ("RANK", "2")];
//! let e = mismatch(1, |v| env.iter().find(|(k, _)| *k == v).map(|(_, x)| x.to_string())).unwrap();
//! assert!(e.contains("WORLD_SIZE=4") && e.contains("mpirun"));
//! assert!(mismatch(4, |v| env.iter().find(|(k, _)| *k == v).map(|(_, x)| x.to_string())).is_none());
//! ```

/// Variables that say how many processes a job has, and who sets them.
const SIZE_VARS: [(&str, &str); 6] = [
    ("WORLD_SIZE", "torchrun / torch.distributed"),
    ("SLURM_STEP_NUM_TASKS", "srun"),
    ("PMI_SIZE", "a PMI launcher"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's launcher"),
    ("PMIX_SIZE", "a PMIx launcher"),
];

/// Variables shown beside them, when set (which process this is).
const RANK_VARS: [&str; 4] = ["RANK", "LOCAL_RANK", "SLURM_PROCID", "PMI_RANK"];

/// `Some(message)` when `env` says the job has more processes than the `mpi_size` MPI sees.
pub fn mismatch(mpi_size: usize, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let said: Vec<(String, &str, usize)> = SIZE_VARS
        .iter()
        .filter_map(|(var, who)| {
            let value = env(var)?;
            let n = value.trim().parse::<usize>().ok()?;
            (n > mpi_size).then(|| (format!("{var}={}", value.trim()), *who, n))
        })
        .collect();
    let (_, _, n) = said.iter().max_by_key(|s| s.2)?;
    let mut seen: Vec<String> = said.iter().map(|(kv, who, _)| format!("{kv} ({who})")).collect();
    seen.extend(RANK_VARS.iter().filter_map(|v| env(v).map(|x| format!("{v}={}", x.trim()))));
    Some(format!(
        "the environment says this job has {n} processes ({}), but MPI sees {mpi_size}: the processes were \
         not started by an MPI launcher, so each would train alone on its own copy of the data. Start \
         them with `mpirun -np {n} …` (or `mpiexec`), or under Slurm with `srun --mpi=pmix …` \
         (`srun --mpi=list` shows what the cluster offers); torchrun does not start MPI. To run a single \
         process on purpose, unset those variables",
        seen.join(", ")
    ))
}

/// [`mismatch`] over this process's environment.
pub fn check(mpi_size: usize) -> Result<(), String> {
    match mismatch(mpi_size, |v| std::env::var(v).ok()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |v| vars.iter().find(|(k, _)| *k == v).map(|(_, x)| x.to_string())
    }

    #[test]
    fn srun_without_pmi_is_named() {
        let vars = [("SLURM_STEP_NUM_TASKS", "8"), ("SLURM_PROCID", "3")];
        let e = mismatch(1, env(&vars)).expect("a mismatch");
        assert!(e.contains("SLURM_STEP_NUM_TASKS=8 (srun)") && e.contains("SLURM_PROCID=3"), "{e}");
        assert!(e.contains("srun --mpi=pmix") && e.contains("has 8 processes"), "{e}");
    }

    #[test]
    fn agreeing_or_absent_or_garbled_variables_pass() {
        assert!(mismatch(1, env(&[])).is_none());
        assert!(mismatch(1, env(&[("WORLD_SIZE", "1")])).is_none());
        assert!(mismatch(4, env(&[("OMPI_COMM_WORLD_SIZE", "4")])).is_none());
        assert!(mismatch(1, env(&[("WORLD_SIZE", "many")])).is_none());
    }
}
