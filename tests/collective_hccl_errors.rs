//! Error paths of the HCCL backend on the host-memory emulator, at 2 and 3 ranks: a wrong
//! `destMax`, reading a receive buffer before the stream is synchronised (poison), a query that
//! must not wait for late peers (`aclrtStreamQuery`), a mismatched
//! all-to-all-v count (every rank gets the failure at synchronisation; through the `Collective`
//! trait the job ends with a message naming the collective), and arguments HCCL rejects when called.
//!
//! `harness = false` (see Cargo.toml): run by `cargo test` this program launches itself under
//! `mpirun`; launched by mpirun it is one rank, checks on every rank and exits non-zero on failure.

mod collective_support;

use std::ffi::c_void;
use std::time::Duration;

use collective_support::mpirun;
use datahelix::collective::{prefix_sums, Collective};
use datahelix::comm::hccl::raw::check_acl;
use datahelix::comm::hccl::{self, AclCode, AllToAllVLayout, DataType, HcclCode, HcclCollective, HcclError};
use datahelix::comm::{Config, EXIT_ABORTED};

const POISON: u8 = 0xEE;

fn main() {
    if datahelix::comm::launched_by_mpi() {
        let mode = std::env::args().nth(1).unwrap_or_default();
        std::process::exit(match mode.as_str() {
            "checks" => rank_checks(),
            "trait-mismatch" => trait_mismatch(),
            _ => 2,
        });
    }
    let me = std::env::current_exe().expect("own path");
    let me = me.to_str().expect("utf-8 path");
    let env =
        [("HCCL_CONNECT_TIMEOUT", "60"), ("HCCL_EXEC_TIMEOUT", "60"), ("DATAHELIX_COLLECTIVE_TIMEOUT", "30")];
    let mut failed = 0;
    for np in [2, 3] {
        let o = mpirun(np, me, &["checks"], &env, Duration::from_secs(120));
        let ok = o.code == Some(0)
            && (0..np).all(|r| o.stdout.contains(&format!("rank {r}/{np}: all error paths ok")));
        println!("test error_paths_{np}_ranks ... {}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed += 1;
            eprintln!("exit {:?}\nstdout:\n{}\nstderr:\n{}", o.code, o.stdout, o.stderr);
        }
    }
    let o = mpirun(2, me, &["trait-mismatch"], &env, Duration::from_secs(120));
    let ok = o.code == Some(EXIT_ABORTED)
        && o.stderr.contains("all_to_all_v #0 failed (hccl)")
        && o.stderr.contains("ACL_ERROR_RT_INTERNAL_ERROR")
        && o.stderr.contains("recvCounts[0]");
    println!("test trait_mismatch_ends_the_job ... {}", if ok { "ok" } else { "FAILED" });
    if !ok {
        failed += 1;
        eprintln!("exit {:?}\nstdout:\n{}\nstderr:\n{}", o.code, o.stdout, o.stderr);
    }
    println!("\ntest result: {}. {} failed", if failed == 0 { "ok" } else { "FAILED" }, failed);
    std::process::exit(i32::from(failed != 0));
}

struct Checks {
    rank: usize,
    failures: Vec<String>,
}

impl Checks {
    fn expect(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let w = what();
            eprintln!("rank {}: FAILED {w}", self.rank);
            self.failures.push(w);
        }
    }
}

fn world() -> HcclCollective {
    let config = Config::from_env().expect("config");
    match HcclCollective::init(config) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("HCCL set-up failed: {e}");
            std::process::exit(2);
        }
    }
}

/// Every rank sends `count(src, dst)` u32 elements; blocks packed in rank order.
fn layout(n: usize, me: usize, count: impl Fn(usize, usize) -> u64) -> [Vec<u64>; 4] {
    let sc: Vec<u64> = (0..n).map(|d| count(me, d)).collect();
    let rc: Vec<u64> = (0..n).map(|s| count(s, me)).collect();
    let pre = |v: &[u64]| -> Vec<u64> {
        prefix_sums(&v.iter().map(|&x| x as usize).collect::<Vec<_>>())
            .into_iter()
            .map(|x| x as u64)
            .collect()
    };
    let (sd, rd) = (pre(&sc), pre(&rc));
    [sc, sd, rc, rd]
}

fn rank_checks() -> i32 {
    let w = world();
    let (me, n) = (w.rank(), w.size());
    let mut c = Checks { rank: me, failures: Vec::new() };
    c.expect(hccl::EMULATOR, || "these checks need the emulator (a build without CANN)".into());

    // 1. aclrtMemcpy enforces destMax: the raw call fails with ACL_ERROR_INVALID_PARAM, which the
    //    safe layer maps to a typed error naming the call; the safe layer itself never passes a
    //    wrong destMax (it rejects out-of-range copies before calling).
    let buf = w.alloc(64).expect("alloc");
    let src = [7u8; 32];
    // SAFETY: `buf` is a live 64-byte device allocation and `src` a live 32-byte host array; the
    // deliberately wrong destMax (16 < 32) makes the call fail without copying.
    let ret = unsafe {
        hccl_sys::aclrtMemcpy(
            buf.as_ptr().cast_mut(),
            16,
            src.as_ptr().cast(),
            32,
            hccl_sys::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    };
    let e = check_acl(ret, "aclrtMemcpy").err();
    c.expect(e.as_ref().and_then(HcclError::acl_code) == Some(AclCode::InvalidParam), || {
        format!("destMax 16 < count 32 gave {ret} ({e:?}), expected ACL_ERROR_INVALID_PARAM")
    });
    c.expect(
        e.map(|e| e.to_string()).as_deref() == Some("aclrtMemcpy returned ACL_ERROR_INVALID_PARAM (100000)"),
        || "destMax error message".into(),
    );
    // SAFETY: as above, with destMax equal to the count: a valid copy.
    let ret = unsafe {
        hccl_sys::aclrtMemcpy(
            buf.as_ptr().cast_mut(),
            32,
            src.as_ptr().cast(),
            32,
            hccl_sys::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    };
    c.expect(ret == 0, || format!("a valid aclrtMemcpy returned {ret}"));
    let mut buf = buf;
    let r = buf.write(60, &[0u8; 8]);
    c.expect(matches!(r, Err(HcclError::Invalid { call: "aclrtMemcpy", .. })), || {
        format!("out-of-range write: {r:?}")
    });

    // 2. Reading before synchronisation sees poison; after it, the data. u32 elements, uneven counts
    //    (element counts, not bytes: HCCL's convention).
    let count = |s: usize, d: usize| (3 * s + 5 * d + 1) as u64;
    let [sc, sd, rc, rd] = layout(n, me, count);
    let send_elems: u64 = sc.iter().sum();
    let recv_elems: u64 = rc.iter().sum();
    let mut host_send = Vec::with_capacity(send_elems as usize * 4);
    for (d, &cnt) in sc.iter().enumerate() {
        for i in 0..cnt {
            host_send.extend_from_slice(&((me as u32) << 24 | (d as u32) << 16 | i as u32).to_le_bytes());
        }
    }
    let mut send = w.alloc(host_send.len()).expect("alloc");
    send.write(0, &host_send).expect("H2D");
    let mut recv = w.alloc(recv_elems as usize * 4).expect("alloc");
    recv.write(0, &vec![0u8; recv_elems as usize * 4]).expect("H2D zeros");
    let recv_ptr = recv.as_ptr();
    let lay = AllToAllVLayout { send_counts: &sc, send_displs: &sd, recv_counts: &rc, recv_displs: &rd };
    match w.all_to_all_v_device_async(&send, &mut recv, lay, DataType::U32) {
        Ok(pending) => {
            let mut early = vec![0u8; recv_elems as usize * 4];
            // SAFETY: `recv_ptr` is the live receive allocation of early.len() bytes; reading it
            // while the collective is enqueued is the mistake under test (the emulator has poisoned it).
            let ret = unsafe {
                hccl_sys::aclrtMemcpy(
                    early.as_mut_ptr().cast::<c_void>(),
                    early.len(),
                    recv_ptr,
                    early.len(),
                    hccl_sys::ACL_MEMCPY_DEVICE_TO_HOST,
                )
            };
            c.expect(ret == 0 && early.iter().all(|&b| b == POISON), || {
                format!(
                    "read before sync: ret {ret}, {} of {} bytes poisoned",
                    early.iter().filter(|&&b| b == POISON).count(),
                    early.len()
                )
            });
            let r = pending.wait(Some(Duration::from_secs(30)));
            c.expect(r.is_ok(), || format!("all_to_all_v_device: {r:?}"));
        }
        Err(e) => c.expect(false, || format!("all_to_all_v_device_async: {e}")),
    }
    let mut got = vec![0u8; recv_elems as usize * 4];
    recv.read(0, &mut got).expect("D2H");
    let mut at = 0;
    for (s, &cnt) in rc.iter().enumerate() {
        for i in 0..cnt {
            let v = u32::from_le_bytes(got[at..at + 4].try_into().unwrap_or_default());
            let want = (s as u32) << 24 | (me as u32) << 16 | i as u32;
            c.expect(v == want, || {
                format!("after sync: element {i} from rank {s} is {v:#x}, expected {want:#x}")
            });
            at += 4;
        }
    }

    // 2b. A query does not wait: with its peers 300 ms late, rank 0's collective is not done when
    //     first asked, goes on at each later query (the emulator keeps it queued, as a device
    //     does) and delivers the same data as above.
    if me != 0 {
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut recv3 = w.alloc(recv_elems as usize * 4).expect("alloc");
    let lay = AllToAllVLayout { send_counts: &sc, send_displs: &sd, recv_counts: &rc, recv_displs: &rd };
    match w.all_to_all_v_device_async(&send, &mut recv3, lay, DataType::U32) {
        Ok(pending) => {
            let first = pending.is_done();
            if me == 0 {
                c.expect(matches!(first, Ok(false)), || format!("first query with peers late: {first:?}"));
            }
            let t0 = std::time::Instant::now();
            let mut queries = 1;
            while !matches!(pending.is_done(), Ok(true) | Err(_)) && t0.elapsed() < Duration::from_secs(30) {
                queries += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            let r = pending.wait(Some(Duration::from_secs(30)));
            c.expect(r.is_ok() && (me != 0 || queries > 1), || {
                format!("late peers: wait {r:?} after {queries} queries")
            });
        }
        Err(e) => c.expect(false, || format!("all_to_all_v_device_async (late peers): {e}")),
    }
    let mut got3 = vec![0u8; got.len()];
    recv3.read(0, &mut got3).expect("D2H");
    c.expect(got3 == got, || "late peers: the data differs from the on-time collective's".into());

    // 3. A mismatched count: rank 1 expects one element less from rank 0 than rank 0 sends. Every
    //    rank's wait fails at its stream query (the emulator detects it instead of corrupting memory).
    let mut rc_bad = rc.clone();
    if me == 1 {
        rc_bad[0] -= 1;
    }
    let rd_bad: Vec<u64> = rd.iter().map(|&d| d + 1).collect();
    let lay =
        AllToAllVLayout { send_counts: &sc, send_displs: &sd, recv_counts: &rc_bad, recv_displs: &rd_bad };
    let mut recv2 = w.alloc(recv_elems as usize * 4 + 4).expect("alloc");
    let r = w.all_to_all_v_device(&send, &mut recv2, lay, DataType::U32);
    c.expect(
        matches!(&r, Err(HcclError::Acl { call: "aclrtStreamQuery", code: AclCode::RtInternal })),
        || format!("mismatched count: {r:?}"),
    );

    // 4. Arguments rejected when called (nothing enqueued, so nothing to agree on).
    let lay =
        AllToAllVLayout { send_counts: &sc[..n - 1], send_displs: &sd, recv_counts: &rc, recv_displs: &rd };
    let r = w.all_to_all_v_device(&send, &mut recv2, lay, DataType::U32);
    c.expect(matches!(r, Err(HcclError::Invalid { call: "HcclAlltoAllV", .. })), || {
        format!("short counts: {r:?}")
    });
    let mut sc_self = sc.clone();
    sc_self[me] += 1;
    let rc_self = rc.clone();
    let lay =
        AllToAllVLayout { send_counts: &sc_self, send_displs: &sd, recv_counts: &rc_self, recv_displs: &rd };
    let mut big = w.alloc(host_send.len() + 64).expect("alloc");
    let big_send = w.alloc(host_send.len() + 64).expect("alloc");
    let r = w.all_to_all_v_device(&big_send, &mut big, lay, DataType::U32);
    c.expect(r.as_ref().err().and_then(HcclError::hccl_code) == Some(HcclCode::Para), || {
        format!("self count mismatch: {r:?}, expected HCCL_E_PARA")
    });

    let ok = c.failures.is_empty();
    let bad = w.agree(u64::from(ok)).ok() != Some(true) || !ok;
    if !bad {
        println!("rank {me}/{n}: all error paths ok");
    }
    i32::from(bad)
}

/// The trait's all_to_all_v with a count the peer does not send: the job ends (exit 3) with a
/// message naming the collective and the call.
fn trait_mismatch() -> i32 {
    let w = world();
    let (me, n) = (w.rank(), w.size());
    let send_counts = vec![100usize; n];
    let mut recv_counts = vec![100usize; n];
    if me == 1 {
        recv_counts[0] = 99;
    }
    let send = vec![1u8; 100 * n];
    let mut recv = vec![0u8; recv_counts.iter().sum()];
    let r = w.all_to_all_v(
        &send,
        &send_counts,
        &prefix_sums(&send_counts),
        &mut recv,
        &recv_counts,
        &prefix_sums(&recv_counts),
    );
    eprintln!("rank {me}: all_to_all_v returned {r:?} instead of ending the job");
    1
}
