//! `datahelix train` across hosts: two hosts of two ranks each, made of network namespaces on
//! this machine (`scripts/hosts.sh`), `mpirun` starting its daemons there as it would over ssh.
//! Between hosts the ranks talk TCP over veth links, slowed to 200 Mbit/s; on a host, shared
//! memory. Checked: the measured transfer model tells the two apart from the hosts' own names,
//! the run delivers the bytes a one-host run does, and a host cut off mid-run is named by the
//! others and does not leave the job hanging (with Open MPI's keep-alive on, the job ends on
//! every host).

mod common;
mod hosts_support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use common::results::{assert_exactly_once, step_checksums};
use hosts_support::Hosts;
use serde_json::Value;

/// The rate of the links between hosts, Mbit/s.
const LINK_MBIT: u32 = 200;

/// Helix's small multi-rank run (`common::train_args`) on the hosts' launcher command.
fn train_args(cmd: &mut Command, data: &Path, out: &Path, extra: &[&str]) {
    common::train_args(cmd, data, "helix", "0.02,1e-6,0,0.05", out, extra);
}

fn result_of(cmd: &mut Command, out: &Path) -> Value {
    let o = common::run_limited(cmd, Duration::from_secs(300));
    assert!(o.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

/// Each band's bytes per second.
fn betas(bands: &Value) -> Vec<f64> {
    let bands = bands.as_array().unwrap_or_else(|| panic!("not bands: {bands}"));
    bands.iter().map(|b| b["beta_bytes_per_s"].as_f64().unwrap()).collect()
}

/// Helix on two hosts with `--transfer-model measured`: the ranks' nodes come from the hosts'
/// names (no `DATAHELIX_NODE`), the network's bands are the shaped link's speed and far below
/// shared memory's, and every global batch arrives once with the bytes of a one-host run.
#[test]
fn two_hosts_train_over_tcp_and_the_measured_model_tells_their_network_apart() {
    let Some(hosts) = Hosts::for_test(2, Some(LINK_MBIT)) else { return };
    let dir = common::tiny_dataset();
    let out = tempfile::tempdir().unwrap();
    let extra = ["--steps", "6", "--transfer-model", "measured", "--checksums"];

    let across = out.path().join("two-hosts.json");
    let mut cmd = hosts.mpirun(2);
    cmd.env("DATAHELIX_COLLECTIVE_TIMEOUT", "60");
    train_args(&mut cmd, &dir, &across, &extra);
    let result = result_of(&mut cmd, &across);

    let transfer = &result["params"]["transfer"];
    assert_eq!(transfer["node_of"], serde_json::json!([0, 0, 1, 1]), "{transfer}");
    let (near, far) = (betas(&transfer["bands"]), betas(&transfer["inter_node_bands"]));
    // Each rank sends to two peers over its host's one link: a message gets at most the link.
    let link = f64::from(LINK_MBIT) * 1e6 / 8.0;
    for beta in &far {
        assert!(
            *beta > 0.0 && *beta <= 1.3 * link,
            "a network band faster than its link ({link} B/s): {transfer}"
        );
    }
    let (near_big, far_big) = (near.last().unwrap(), far.last().unwrap());
    eprintln!("largest messages: {near_big:.3e} B/s on a host, {far_big:.3e} B/s between hosts");
    assert!(near_big >= &(5.0 * far_big), "shared memory not told from the network: {transfer}");

    let ids = common::manifest_ids(&dir);
    assert_exactly_once(&result, &ids);
    let one_host = out.path().join("one-host.json");
    let mut cmd = Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["-np", "4"]).env("DATAHELIX_COLLECTIVE_TIMEOUT", "60");
    train_args(&mut cmd, &dir, &one_host, &extra);
    let reference = result_of(&mut cmd, &one_host);
    let one = &reference["params"]["transfer"];
    assert!(one["node_of"].is_null() && one["inter_node_bands"].is_null(), "one host, two classes: {one}");
    assert_eq!(step_checksums(&result), step_checksums(&reference), "two hosts delivered other bytes");
}

/// A launch whose output lines arrive, stamped, as they are printed.
struct Watched {
    child: Child,
    lines: Receiver<(Instant, String)>,
    seen: Vec<String>,
}

impl Watched {
    fn spawn(mut cmd: Command) -> Watched {
        use std::os::unix::process::CommandExt;
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        let (tx, lines) = std::sync::mpsc::channel();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for pipe in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = tx.send((Instant::now(), line));
                }
            });
        }
        Watched { child, lines, seen: Vec::new() }
    }

    /// When the first line holding `text` was printed, waiting at most `limit` for it.
    fn wait_for(&mut self, text: &str, limit: Duration) -> Option<Instant> {
        let end = Instant::now() + limit;
        loop {
            match self.lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok((at, line)) => {
                    let found = line.contains(text);
                    self.seen.push(line);
                    if found {
                        return Some(at);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// The launcher's exit status, waiting at most `limit`.
    fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Everything printed so far.
    fn text(&mut self) -> String {
        while let Ok((_, line)) = self.lines.try_recv() {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // SAFETY: kill() only sends a signal; a negative pid names our child's process group.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Helix on two hosts for a long run, `extra` given to `mpirun`; host 2 is cut off once the run
/// is under way. Returns the launch and when the cut came.
fn cut_mid_run(hosts: &Hosts, timeout_s: u64, mpirun_extra: &[&str]) -> (Watched, Instant) {
    let dir = common::tiny_dataset();
    let out = tempfile::tempdir().unwrap();
    let mut cmd = hosts.mpirun(2);
    cmd.args(mpirun_extra).env("DATAHELIX_COLLECTIVE_TIMEOUT", timeout_s.to_string());
    train_args(&mut cmd, &dir, &out.path().join("cut.json"), &["--steps", "400"]);
    let mut run = Watched::spawn(cmd);
    let started = run.wait_for("train: 4 ranks", Duration::from_secs(120));
    assert!(started.is_some(), "the run did not start:\n{}", run.text());
    std::thread::sleep(Duration::from_secs(3));
    assert!(run.child.try_wait().unwrap().is_none(), "the run ended before the cut:\n{}", run.text());
    hosts.cut(2);
    (run, Instant::now())
}

/// With Open MPI's defaults the launcher learns of a lost host only from TCP (minutes); the
/// ranks on the other host wait in a collective until DataHelix's watchdog times out, ask every
/// peer where it is, and name the two that do not answer as the cause — not a skipped
/// collective, though a peer of theirs has moved past the all-to-all they wait in.
#[test]
fn a_host_cut_off_mid_run_is_named_by_the_ranks_that_wait_for_it() {
    let Some(hosts) = Hosts::for_test(2, None) else { return };
    const TIMEOUT_S: u64 = 8;
    let (mut run, cut) = cut_mid_run(&hosts, TIMEOUT_S, &[]);
    let named = run.wait_for("did not answer", Duration::from_secs(TIMEOUT_S + 40));
    let text = run.text();
    let named = named.unwrap_or_else(|| panic!("no rank named the cut-off host:\n{text}"));
    // The collective began before the cut: the report comes within the timeout and the
    // watchdog's questions (2 s) of it, with room for a loaded machine.
    eprintln!("named {:.1} s after the cut (timeout {TIMEOUT_S} s)", (named - cut).as_secs_f64());
    assert!(
        named - cut <= Duration::from_secs(TIMEOUT_S + 15),
        "named {:?} after the cut:\n{text}",
        named - cut
    );
    assert!(text.contains("did not complete within"), "{text}");
    assert!(text.contains("Ranks [2, 3] did not answer"), "{text}");
    assert!(
        !text.contains("issued different collectives"),
        "a cut host read as a skipped collective:\n{text}"
    );
}

/// With the keep-alive the README's cluster section gives `mpirun` (3 s idle, then 3 probes a
/// second apart), the launcher finds the lost host within seconds and ends the job on every
/// host: nothing is left running in any namespace.
#[test]
fn a_host_cut_off_mid_run_ends_the_job_everywhere_with_keepalive() {
    let Some(hosts) = Hosts::for_test(2, None) else { return };
    let keepalive = [
        "--mca",
        "oob_tcp_keepalive_time",
        "3",
        "--mca",
        "oob_tcp_keepalive_intvl",
        "1",
        "--mca",
        "oob_tcp_keepalive_probes",
        "3",
    ];
    let (mut run, cut) = cut_mid_run(&hosts, 120, &keepalive);
    let status = run.wait_exit(Duration::from_secs(60));
    let ended = cut.elapsed();
    let text = run.text();
    let status = status.unwrap_or_else(|| panic!("the job still runs 60 s after the cut:\n{text}"));
    assert!(!status.success(), "{text}");
    eprintln!("the job ended {:.1} s after the cut", ended.as_secs_f64());
    assert!(ended <= Duration::from_secs(30), "the job ended {ended:?} after the cut:\n{text}");
    let mut left = hosts.processes_left();
    for _ in 0..100 {
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        left = hosts.processes_left();
    }
    assert_eq!(left, 0, "processes left on the hosts 10 s after the job ended:\n{text}");
}
