//! Chrome trace-event JSON from a run's [`Span`]s (`datahelix train --trace FILE`).
//!
//! The file follows the Trace Event Format (the JSON object form, `{"traceEvents": [...]}`) that
//! Perfetto (ui.perfetto.dev) and `chrome://tracing` open: one process per rank named `rank N`,
//! one thread per rank thread (`train` for thread 0, `decode K` for decode worker K), and one
//! complete event (`"ph": "X"`) per span with `ts`/`dur` in microseconds and the span's category.
//!
//! ```
//! use datahelix::metrics::{trace, Span};
//!
//! let spans = vec![
//!     Span { rank: 0, thread: 0, cat: "wait".into(), name: "step 0".into(), start_s: 0.0, dur_s: 0.002 },
//!     Span { rank: 1, thread: 1, cat: "decode".into(), name: "decode 7".into(), start_s: 0.001, dur_s: 0.01 },
//! ];
//! let doc = trace::trace_json(&spans, &[]);
//! let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
//! let events = v["traceEvents"].as_array().unwrap();
//! assert!(events.iter().any(|e| e["ph"] == "X" && e["dur"] == 10000.0));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::Span;

/// What else to say about a rank in its process name, e.g. the host it ran on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankMeta {
    /// The rank.
    pub rank: u32,
    /// Appended to the process name: `rank 3 (node-b, 2 workers)`.
    pub label: String,
}

/// Writing a trace file failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be created or written.
    #[error("cannot write trace {}: {source}", path.display())]
    Io {
        /// The trace file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
}

/// One trace event. Metadata events (`"ph": "M"`) carry `args.name` or `args.sort_index`.
#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'a str>,
    ph: &'static str,
    pid: u32,
    tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Args>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Args {
    Name { name: String },
    Sort { sort_index: i64 },
}

#[derive(Serialize)]
struct Document<'a> {
    #[serde(rename = "traceEvents")]
    trace_events: Vec<Event<'a>>,
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
}

/// The name of thread `thread` of a rank: `train` for 0, `decode K` for decode worker K.
pub fn thread_name(thread: u32) -> String {
    if thread == 0 {
        "train".to_string()
    } else {
        format!("decode {thread}")
    }
}

fn metadata(name: &'static str, pid: u32, tid: u32, args: Args) -> Event<'static> {
    Event { name, cat: None, ph: "M", pid, tid, ts: None, dur: None, args: Some(args) }
}

fn events<'a>(spans: &'a [Span], meta: &[RankMeta]) -> Vec<Event<'a>> {
    // Every rank and thread that appears, in order, so the viewer lists rank 0 first.
    let mut threads: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for m in meta {
        threads.entry(m.rank).or_default();
    }
    for s in spans {
        threads.entry(s.rank).or_default().insert(s.thread);
    }
    let labels: BTreeMap<u32, &str> =
        meta.iter().filter(|m| !m.label.is_empty()).map(|m| (m.rank, m.label.as_str())).collect();

    let mut out = Vec::with_capacity(spans.len() + 4 * threads.len());
    for (&rank, tids) in &threads {
        let name = match labels.get(&rank) {
            Some(label) => format!("rank {rank} ({label})"),
            None => format!("rank {rank}"),
        };
        out.push(metadata("process_name", rank, 0, Args::Name { name }));
        out.push(metadata("process_sort_index", rank, 0, Args::Sort { sort_index: i64::from(rank) }));
        for &tid in tids {
            out.push(metadata("thread_name", rank, tid, Args::Name { name: thread_name(tid) }));
            out.push(metadata("thread_sort_index", rank, tid, Args::Sort { sort_index: i64::from(tid) }));
        }
    }
    for s in spans {
        // JSON has no NaN or infinity: a span without a finite time cannot be placed.
        if !s.start_s.is_finite() || !s.dur_s.is_finite() {
            continue;
        }
        out.push(Event {
            name: &s.name,
            cat: Some(&s.cat),
            ph: "X",
            pid: s.rank,
            tid: s.thread,
            ts: Some(s.start_s * 1e6),
            dur: Some(s.dur_s.max(0.0) * 1e6),
            args: None,
        });
    }
    out
}

/// The trace document as a JSON string: one process per rank (every rank with a span or a
/// [`RankMeta`]), named threads, and one complete event per span. Spans with a non-finite start
/// or duration are left out; negative durations become 0.
pub fn trace_json(spans: &[Span], meta: &[RankMeta]) -> String {
    let doc = Document { trace_events: events(spans, meta), display_time_unit: "ms" };
    // Serialising plain strings and finite numbers cannot fail.
    serde_json::to_string(&doc).unwrap_or_else(|_| String::from("{\"traceEvents\":[]}"))
}

/// Writes the trace document of [`trace_json`] to `path`.
pub fn write_trace(path: &Path, spans: &[Span], meta: &[RankMeta]) -> Result<(), TraceError> {
    let io = |source| TraceError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    let doc = Document { trace_events: events(spans, meta), display_time_unit: "ms" };
    serde_json::to_writer(&mut w, &doc).map_err(|e| io(e.into()))?;
    w.write_all(b"\n").map_err(io)?;
    w.flush().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn span(rank: u32, thread: u32, cat: &str, start_s: f64, dur_s: f64) -> Span {
        Span { rank, thread, cat: cat.into(), name: format!("{cat} {rank}.{thread}"), start_s, dur_s }
    }

    fn parse(spans: &[Span], meta: &[RankMeta]) -> Vec<Value> {
        let v: Value = serde_json::from_str(&trace_json(spans, meta)).unwrap();
        v["traceEvents"].as_array().unwrap().clone()
    }

    #[test]
    fn one_process_per_rank_with_named_threads() {
        let spans = [
            span(0, 0, "wait", 0.0, 0.001),
            span(0, 2, "decode", 0.0, 0.004),
            span(2, 0, "compute", 0.5, 0.25),
            span(1, 1, "decode", 0.1, 0.01),
        ];
        let ev = parse(&spans, &[]);
        let procs: Vec<(u64, String)> = ev
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string()))
            .collect();
        assert_eq!(procs, vec![(0, "rank 0".into()), (1, "rank 1".into()), (2, "rank 2".into())]);
        let mut threads: Vec<(u64, u64, String)> = ev
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| {
                (
                    e["pid"].as_u64().unwrap(),
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap().into(),
                )
            })
            .collect();
        threads.sort();
        assert_eq!(
            threads,
            vec![
                (0, 0, "train".into()),
                (0, 2, "decode 2".into()),
                (1, 1, "decode 1".into()),
                (2, 0, "train".into())
            ]
        );
        let complete: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(complete.len(), 4);
        let c = complete.iter().find(|e| e["cat"] == "compute").unwrap();
        assert_eq!(
            (c["pid"].as_u64(), c["ts"].as_f64(), c["dur"].as_f64()),
            (Some(2), Some(500000.0), Some(250000.0))
        );
    }

    #[test]
    fn metadata_labels_and_adds_ranks_without_spans() {
        let meta = [RankMeta { rank: 0, label: "node-a".into() }, RankMeta { rank: 3, label: String::new() }];
        let ev = parse(&[span(0, 0, "plan", 0.0, 0.0)], &meta);
        let names: Vec<&str> = ev
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["rank 0 (node-a)", "rank 3"]);
    }

    #[test]
    fn empty_and_non_finite_spans_still_make_valid_json() {
        let v: Value = serde_json::from_str(&trace_json(&[], &[])).unwrap();
        assert_eq!(v["traceEvents"].as_array().map(Vec::len), Some(0));
        let ev = parse(&[span(0, 0, "wait", f64::NAN, 1.0), span(0, 0, "wait", 1.0, -1.0)], &[]);
        let complete: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(complete.len(), 1);
        assert_eq!(complete[0]["dur"].as_f64(), Some(0.0));
    }

    #[test]
    fn write_trace_names_the_path_on_failure() {
        let dir = std::env::temp_dir().join("datahelix-no-such-dir-for-trace").join("x");
        let err = write_trace(&dir.join("t.json"), &[], &[]).unwrap_err();
        assert!(err.to_string().contains("datahelix-no-such-dir-for-trace"), "{err}");
    }
}
