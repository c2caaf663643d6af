//! The per-rank CPU budget of the benchmark protocol (`shared/bench/PROTOCOL.md`, "CPU budget"):
//! rank r's decode workers run in a CPU cgroup of their own, `datahelix-<job>-r<rank>`, whose
//! quota is `cores × workers_r / W` cores, so one machine cannot pool its cores across ranks the
//! way a cluster never could. The rank's main thread stays outside.
//!
//! Linux cgroup v1 `cpu` controller (`cpu.cfs_quota_us` / `cpu.cfs_period_us`), where threads can
//! be placed one by one. Threads inherit their creator's cgroup, so the executor enters the group,
//! starts its decode workers, and leaves. The group yields the core to any thread outside it that
//! wakes (`cpu.idle`), as a cluster node's main thread never waits for its decode workers. Where no group can be made (not root, no v1 `cpu`
//! controller), the run proceeds unenforced and says so.
//!
//! ```no_run
//! use datahelix::exec::cgroup::CpuGroup;
//!
//! let group = CpuGroup::create("job42", 0, 0.5); // half a core for rank 0's workers
//! println!("cpu budget: {}", group.status());
//! group.enter_current_thread();
//! // ... spawn decode workers here: they inherit the group ...
//! group.leave_current_thread();
//! ```

use std::path::{Path, PathBuf};

const PERIOD_US: u64 = 100_000;

/// A rank's CPU cgroup, or the reason there is none.
#[derive(Debug)]
pub struct CpuGroup {
    dir: Option<PathBuf>,
    home: Option<PathBuf>,
    why_not: Option<String>,
    cores: f64,
}

fn thread_id() -> u64 {
    // SAFETY: gettid takes no arguments, cannot fail and touches no memory.
    unsafe { libc::gettid() as u64 }
}

/// Where the v1 `cpu` controller is mounted and this thread's group inside it.
fn v1_cpu_home() -> Result<PathBuf, String> {
    let text = std::fs::read_to_string("/proc/thread-self/cgroup")
        .map_err(|e| format!("cannot read /proc/thread-self/cgroup: {e}"))?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "cpu") {
            for mount in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
                let home = Path::new(mount).join(path.trim_start_matches('/'));
                if home.join("cpu.cfs_quota_us").exists() {
                    return Ok(home);
                }
            }
            return Err("the cgroup v1 cpu controller is not mounted at /sys/fs/cgroup/cpu".into());
        }
    }
    Err("no cgroup v1 cpu controller (cgroup v2 threaded groups are not supported yet)".into())
}

/// Lets every thread outside the group take a core from the group's decode workers as soon as it
/// wakes: `cpu.idle = 1` (Linux ≥ 5.15), else the least `cpu.shares`. On a cluster a rank's main
/// thread — its training loop, collectives and MPI progress — has a core of its own; on one
/// machine it competes with the decode workers of every rank, and waking from a poll's pause it
/// waited up to a scheduler slice for one: 1–10 ms of input wait in the steps of post-balance
/// that all-gather on the input path (`scripts/workloads/README.md`: 0.15–0.18 of its rank-steps
/// missed at R = 2 accelerator-bound, 0.088 with the groups idle). The quota still caps the
/// group; only who waits for whom changes. Best effort: a kernel without either file leaves the
/// group as it was.
fn yield_to_main_threads(dir: &Path) {
    if std::fs::write(dir.join("cpu.idle"), "1").is_err() {
        let _ = std::fs::write(dir.join("cpu.shares"), "2");
    }
}

/// How old an empty group of another job must be before [`sweep_stale`] removes it: a job
/// enters its groups within milliseconds of making them.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the groups earlier runs left behind: a rank its launcher kills (another rank's
/// `MPI_Abort`, a signal) never runs [`CpuGroup`]'s `Drop`, and its empty groups would pile up
/// in the controller. Takes the groups in `home` named `prefix…`, except this job's own
/// (`own_prefix…`, which it may be reusing), made more than `older_than` ago; the kernel refuses
/// to remove a group that still has threads, so a live job's groups stay. Best effort; returns
/// how many went.
fn sweep_stale(home: &Path, prefix: &str, own_prefix: &str, older_than: std::time::Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(home) else { return 0 };
    let now = std::time::SystemTime::now();
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(prefix) && !name.starts_with(own_prefix)
        })
        .filter(|e| {
            let made = e.metadata().and_then(|m| m.modified());
            made.is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age >= older_than))
        })
        .filter(|e| std::fs::remove_dir(e.path()).is_ok())
        .count()
}

impl CpuGroup {
    /// Creates (or reuses) `datahelix-<job>-r<rank>` with a quota of `cores` cores. Never fails:
    /// on any problem the group is unenforced and [`CpuGroup::status`] says why.
    pub fn create(job: &str, rank: usize, cores: f64) -> CpuGroup {
        let unenforced = |why: String| CpuGroup { dir: None, home: None, why_not: Some(why), cores };
        if !(cores.is_finite() && cores > 0.0) {
            return unenforced(format!("quota of {cores} cores is not positive"));
        }
        let home = match v1_cpu_home() {
            Ok(h) => h,
            Err(e) => return unenforced(e),
        };
        sweep_stale(&home, "datahelix-", &format!("datahelix-{job}-"), STALE_AFTER);
        let dir = home.join(format!("datahelix-{job}-r{rank}"));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return unenforced(format!("cannot create {}: {e}", dir.display()));
        }
        let quota = ((PERIOD_US as f64) * cores).round().max(1000.0) as u64;
        let set = std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())
            .and_then(|_| std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()));
        if let Err(e) = set {
            let _ = std::fs::remove_dir(&dir);
            return unenforced(format!("cannot set the quota in {}: {e}", dir.display()));
        }
        yield_to_main_threads(&dir);
        CpuGroup { dir: Some(dir), home: Some(home), why_not: None, cores }
    }

    /// A group that enforces nothing (the budget was not asked for).
    pub fn none(why: &str) -> CpuGroup {
        CpuGroup { dir: None, home: None, why_not: Some(why.to_string()), cores: 0.0 }
    }

    /// `"enforced"` or `"unenforced"` (PROTOCOL.md's words).
    pub fn status(&self) -> &'static str {
        if self.dir.is_some() {
            "enforced"
        } else {
            "unenforced"
        }
    }

    /// Why the budget is not enforced, if it is not.
    pub fn why_not(&self) -> Option<&str> {
        self.why_not.as_deref()
    }

    /// The quota in cores.
    pub fn cores(&self) -> f64 {
        self.cores
    }

    /// Moves the calling thread into the group (threads it starts afterwards inherit it).
    pub fn enter_current_thread(&self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::write(dir.join("tasks"), thread_id().to_string());
        }
    }

    /// Moves the calling thread back to the group it came from.
    pub fn leave_current_thread(&self) {
        if let Some(home) = &self.home {
            let _ = std::fs::write(home.join("tasks"), thread_id().to_string());
        }
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // The workers have exited by now (the pool is dropped first); an empty group can go.
        if let Some(dir) = &self.dir {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_quota_is_unenforced_with_a_reason() {
        let g = CpuGroup::create("test", 0, 0.0);
        assert_eq!(g.status(), "unenforced");
        assert!(g.why_not().unwrap().contains("not positive"));
    }

    #[test]
    fn where_cgroups_work_the_quota_is_written_and_the_group_removed() {
        let g = CpuGroup::create(&format!("unit{}", std::process::id()), 3, 0.25);
        if g.status() == "unenforced" {
            eprintln!("cgroup unavailable here: {}", g.why_not().unwrap_or(""));
            return;
        }
        let dir = g.dir.clone().unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).unwrap().trim(), "25000");
        // The decode workers yield to every main thread (idle group, or the least weight).
        let idle = std::fs::read_to_string(dir.join("cpu.idle")).map(|t| t.trim() == "1");
        let shares = std::fs::read_to_string(dir.join("cpu.shares")).map(|t| t.trim() == "2");
        assert!(idle.unwrap_or(false) || shares.unwrap_or(false), "the group yields to main threads");
        // A thread entering and leaving shows up in and out of the group's task list.
        std::thread::spawn(move || {
            g.enter_current_thread();
            let tasks = std::fs::read_to_string(g.dir.as_ref().unwrap().join("tasks")).unwrap();
            assert!(tasks.lines().any(|l| l.trim() == thread_id().to_string()));
            g.leave_current_thread();
        })
        .join()
        .unwrap();
        assert!(!dir.exists(), "the group is removed on drop");
    }

    /// A group a killed rank left behind is swept; one with a thread in it, and this job's own,
    /// are not. (Its own name prefix keeps the sweep off other tests' groups.)
    #[test]
    fn groups_left_behind_are_swept_but_not_live_or_own_ones() {
        let Ok(home) = v1_cpu_home() else { return };
        let prefix = format!("datahelix-sweep{}-", std::process::id());
        let make = |name: &str| {
            let dir = home.join(format!("{prefix}{name}"));
            std::fs::create_dir_all(&dir).map(|()| dir)
        };
        let (Ok(left), Ok(live), Ok(own)) = (make("a-r0"), make("b-r0"), make("own-r0")) else {
            eprintln!("cgroup unavailable here");
            return;
        };
        let (enter, entered) = (std::sync::mpsc::channel::<()>(), std::sync::mpsc::channel::<()>());
        let tasks = live.join("tasks");
        let inside = std::thread::spawn(move || {
            std::fs::write(&tasks, thread_id().to_string()).unwrap();
            entered.0.send(()).unwrap();
            enter.1.recv().unwrap(); // stays in the group until told
        });
        entered.1.recv().unwrap();
        let own_prefix = format!("{prefix}own-");
        assert_eq!(
            sweep_stale(&home, &prefix, &own_prefix, std::time::Duration::from_secs(3600)),
            0,
            "too young"
        );
        assert_eq!(sweep_stale(&home, &prefix, &own_prefix, std::time::Duration::ZERO), 1);
        assert!(!left.exists(), "the empty group left behind is gone");
        assert!(live.exists(), "a group with a thread in it stays");
        assert!(own.exists(), "this job's own group stays");
        enter.0.send(()).unwrap();
        inside.join().unwrap(); // the thread exits, and leaves the group empty
        for dir in [&live, &own] {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(!dir.exists());
        }
    }
}
