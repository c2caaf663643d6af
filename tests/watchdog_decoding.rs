//! A rank waiting for its own decodes keeps answering the collective watchdog (issue 18, item
//! 3): when a peer's collective times out, its report says this rank is alive and decoding
//! instead of "no answer" (which reads as dead). Before, the rank blocked in the decode pool's
//! receive and answered nothing until its decodes were done. With `--features hccl`, also over
//! the HCCL backend.

mod common;

use std::process::Command;

/// One slow sample (every sampled frame decodes from the only keyframe, at 1080p) and three quick
/// ones, indexed in `d`: with rank-local placement one rank waits for the slow decode while the
/// other is already in the step's collective.
fn one_slow_sample(d: &std::path::Path) {
    let slow = "-nostdin -loglevel error -y -f lavfi -i testsrc2=size=1920x1080:rate=30 -t 30 \
                -c:v libx264 -preset ultrafast -g 900 -bf 0";
    let o = common::run(Command::new("ffmpeg").args(slow.split_whitespace()).arg(d.join("slow.mp4")));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut manifest = String::from("{\"id\": 1, \"path\": \"slow.mp4\", \"text_tokens\": 4}\n");
    for id in 2..=4 {
        let quick = "-nostdin -loglevel error -y -f lavfi -i testsrc2=size=64x64 -frames:v 1";
        let name = format!("quick{id}.png");
        let o = common::run(Command::new("ffmpeg").args(quick.split_whitespace()).arg(d.join(&name)));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        manifest.push_str(&format!("{{\"id\": {id}, \"path\": \"{name}\", \"text_tokens\": 4}}\n"));
    }
    std::fs::write(d.join("manifest.jsonl"), manifest).unwrap();
    let o = common::run(common::datahelix().arg("index").arg(d));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Trains `one_slow_sample`'s data on 2 ranks under a one-second timeout and checks that the step
/// times out with the decoding rank reported alive and decoding.
fn decoding_rank_is_named(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    one_slow_sample(dir.path());
    let mut args = vec!["--warmup", "0"];
    args.extend_from_slice(extra);
    let run = common::train_2_ranks(
        dir.path(),
        "rank-local",
        1,
        &args,
        &[("DATAHELIX_COLLECTIVE_TIMEOUT", "1".into())],
    );
    assert!(!run.ok, "the step should time out: {}", run.text);
    assert!(run.text.contains("did not complete within"), "{}", run.text);
    assert!(
        run.text.contains("alive, waiting for its own decodes"),
        "the decoding rank should be reported alive and decoding: {}",
        run.text
    );
}

#[test]
fn a_decoding_rank_is_reported_alive_and_decoding() {
    decoding_rank_is_named(&[]);
}

/// The same over HCCL (the emulator here): the waiting rank polls its HCCL collective and asks
/// over the bootstrap MPI world, which the decoding rank answers. Before, the step ended with
/// HCCL's own timeout error, naming no rank.
#[cfg(feature = "hccl")]
#[test]
fn a_decoding_rank_is_reported_alive_and_decoding_over_hccl() {
    decoding_rank_is_named(&["--backend", "hccl"]);
}
