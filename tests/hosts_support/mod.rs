//! Several hosts on one machine, for what crosses a network: `scripts/hosts.sh`'s network
//! namespaces joined by a bridge, each host with its own name, and `mpirun` starting its
//! daemons on them through an rsh agent, as it would over ssh. Ranks on one host talk over
//! shared memory; ranks on two hosts over TCP on veth links, held to a rate where asked.
//!
//! ```no_run
//! let hosts = hosts_support::Hosts::new(2, Some(200)).expect("network namespaces"); // 200 Mbit/s
//! let mut mpirun = hosts.mpirun(2); // 2 ranks a host
//! mpirun.arg("hostname");
//! // ... run it; dropping `hosts` ends what still runs on them and removes them.
//! ```
//!
//! Traffic stays inside the namespaces the script makes. Everything is removed on drop, also
//! when a test fails: every process still in a namespace (a daemon cut off from its launcher
//! outlives it), then the namespaces, which take their links with them.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A set of hosts; see the module's doc.
pub struct Hosts {
    name: String,
}

fn script() -> Command {
    let mut c = Command::new("bash");
    c.arg(crate::common::repo().join("scripts/hosts.sh"));
    c
}

/// Runs `scripts/hosts.sh ARGS` and says what failed.
fn hosts_sh(args: &[&str]) -> Result<String, String> {
    let o = script().args(args).output().map_err(|e| format!("scripts/hosts.sh: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!("scripts/hosts.sh {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
    }
}

impl Hosts {
    /// `n` hosts, their links held to `mbit` Mbit/s each way where given, or why they cannot
    /// be made here (not root, no iproute2, or a sandbox that forbids network namespaces).
    pub fn new(n: usize, mbit: Option<u32>) -> Result<Hosts, String> {
        static SETS: AtomicU64 = AtomicU64::new(0);
        let name = format!("dh{}x{}", std::process::id(), SETS.fetch_add(1, Ordering::Relaxed));
        // Kept before it is made: a failure half-way removes what was made.
        let hosts = Hosts { name };
        let (n, mbit) = (n.to_string(), mbit.map(|m| m.to_string()));
        let mut args = vec!["up", hosts.name.as_str(), n.as_str()];
        args.extend(mbit.as_deref());
        hosts_sh(&args)?;
        Ok(hosts)
    }

    /// The hosts of a test that needs them: `None` (the test passes, saying why on stderr)
    /// where they cannot be made and `DATAHELIX_REQUIRE_NETNS` is unset; `scripts/test.sh`
    /// sets it, so that CI fails instead of passing without them.
    pub fn for_test(n: usize, mbit: Option<u32>) -> Option<Hosts> {
        match Hosts::new(n, mbit) {
            Ok(h) => Some(h),
            Err(e) if std::env::var_os("DATAHELIX_REQUIRE_NETNS").is_none() => {
                eprintln!("SKIPPED: no network namespaces here ({e}); DATAHELIX_REQUIRE_NETNS=1 makes this a failure");
                None
            }
            Err(e) => panic!("cannot make network namespaces for the test's hosts: {e}"),
        }
    }

    /// Cuts host `i` (1-based) off the network: its link goes down.
    pub fn cut(&self, i: usize) {
        hosts_sh(&["cut", &self.name, &i.to_string()]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// `mpirun` in the hosts' launcher, placing `per_host` ranks on each host, with this
    /// machine's Open MPI settings (`common::mpi_env`). Add the program and its arguments. The
    /// process started is `mpirun` itself (the script execs it).
    pub fn mpirun(&self, per_host: usize) -> Command {
        let mut cmd = script();
        crate::common::mpi_env(&mut cmd);
        cmd.args(["mpirun", &self.name, &per_host.to_string()]);
        cmd
    }

    /// How many processes still run on the hosts and their launcher.
    pub fn processes_left(&self) -> usize {
        hosts_sh(&["pids", &self.name]).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(usize::MAX)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if let Err(e) = hosts_sh(&["down", &self.name]) {
            eprintln!("{e}");
        }
    }
}
