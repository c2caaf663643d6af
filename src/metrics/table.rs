//! The policy comparison as a person reads it (a text table) and as tools read it (the
//! `datahelix compare --json` document, `shared/CLI.md`).
//!
//! ```
//! use datahelix::metrics::{table, Summary};
//!
//! let s = |throughput| Summary { throughput, ..Summary::default() };
//! let mut rows = vec![("helix".to_string(), s(300.0)), ("rank-local".to_string(), s(200.0))];
//! table::sort_policies(&mut rows);
//! assert_eq!(rows[0].0, "rank-local");
//! assert_eq!(table::speedups(&rows), vec![Some(1.0), Some(1.5)]);
//! assert!(table::render(&rows).contains("1.50x"));
//! ```

use std::cmp::Ordering;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{RankStep, Summary, TrainResult};

/// The policies in the order the table lists them (the baseline first, then by how much of
/// DataHelix they use); any other policy follows, alphabetically.
pub const POLICY_ORDER: [&str; 6] =
    ["rank-local", "actor-pool", "post-balance", "helix-batching", "helix-placement", "helix"];

/// The policy speed-ups are measured against.
pub const BASELINE: &str = "rank-local";

/// Where `policy` sorts: its place in [`POLICY_ORDER`], or after all of them.
fn rank_of(policy: &str) -> usize {
    POLICY_ORDER.iter().position(|p| *p == policy).unwrap_or(POLICY_ORDER.len())
}

/// Compares policy names in table order.
pub fn policy_cmp(a: &str, b: &str) -> Ordering {
    rank_of(a).cmp(&rank_of(b)).then_with(|| a.cmp(b))
}

/// Sorts `(policy, anything)` pairs into table order (stable for equal names).
pub fn sort_policies<T>(rows: &mut [(String, T)]) {
    rows.sort_by(|a, b| policy_cmp(&a.0, &b.0));
}

/// Each row's throughput over [`BASELINE`]'s; `None` for every row when there is no baseline row
/// or its throughput is not positive.
pub fn speedups(rows: &[(String, Summary)]) -> Vec<Option<f64>> {
    let base = rows.iter().find(|(p, _)| p == BASELINE).map(|(_, s)| s.throughput);
    rows.iter()
        .map(|(_, s)| match base {
            Some(b) if b > 0.0 && b.is_finite() => Some(s.throughput / b),
            _ => None,
        })
        .collect()
}

const MIB: f64 = 1024.0 * 1024.0;

fn ms(seconds: f64) -> String {
    format!("{:.2}", seconds * 1e3)
}

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// Column headers of [`render`].
pub const COLUMNS: [&str; 11] = [
    "policy",
    "samples/s",
    "speed-up",
    "miss >1ms",
    "miss >10ms",
    "p50 ms",
    "p95 ms",
    "max ms",
    "efficiency",
    "rebal run/skip",
    "MiB moved",
];

/// The comparison table, one row per policy in the order given (see [`sort_policies`]):
/// throughput in samples/s, speed-up over `rank-local` (`-` without it), miss rates over 1 ms and
/// 10 ms, p50/p95/max input wait in ms, ideal-bound efficiency, rebalances run/skipped and MiB of
/// decoded tensors moved. Text columns align left, numbers right; lines end with `\n`.
pub fn render(rows: &[(String, Summary)]) -> String {
    let speed = speedups(rows);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .zip(&speed)
        .map(|((policy, s), up)| {
            vec![
                policy.clone(),
                format!("{:.1}", s.throughput),
                up.map_or_else(|| "-".to_string(), |u| format!("{u:.2}x")),
                pct(s.miss_rate),
                pct(s.miss_rate_10ms),
                ms(s.p50_wait_s),
                ms(s.p95_wait_s),
                ms(s.max_wait_s),
                format!("{:.2}", s.efficiency),
                format!("{}/{}", s.rebalances_run, s.rebalances_skipped),
                format!("{:.1}", s.bytes_moved as f64 / MIB),
            ]
        })
        .collect();
    let mut width: Vec<usize> = COLUMNS.iter().map(|c| c.len()).collect();
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |row: &[String]| {
        let mut text = String::new();
        for (i, (c, w)) in row.iter().zip(&width).enumerate() {
            if i == 0 {
                let _ = write!(text, "{c:<w$}");
            } else {
                let _ = write!(text, "  {c:>w$}");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&COLUMNS.map(String::from));
    for row in &cells {
        line(row);
    }
    out
}

/// The `datahelix compare --json` document: `{"policies": {name: <train summary>}, "plots":
/// [paths]}`, policies in table order, plus `speedup_vs_rank_local` (`{name: ratio}`, only the
/// policies a ratio exists for).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    /// Each policy's summary, in table order (a JSON object keyed by policy).
    #[serde(with = "ordered_map")]
    pub policies: Vec<(String, Summary)>,
    /// Plot files written.
    pub plots: Vec<PathBuf>,
    /// Throughput over `rank-local`'s, per policy (a JSON object keyed by policy).
    #[serde(with = "ordered_map", default)]
    pub speedup_vs_rank_local: Vec<(String, f64)>,
}

impl CompareReport {
    /// A report of these summaries (sorted into table order here) and plot paths.
    pub fn new(mut policies: Vec<(String, Summary)>, plots: Vec<PathBuf>) -> Self {
        sort_policies(&mut policies);
        let speedup_vs_rank_local = policies
            .iter()
            .zip(speedups(&policies))
            .filter_map(|((p, _), up)| up.map(|u| (p.clone(), u)))
            .collect();
        CompareReport { policies, plots, speedup_vs_rank_local }
    }

    /// The text table of [`render`].
    pub fn table(&self) -> String {
        render(&self.policies)
    }
}

/// Serde for `Vec<(String, T)>` as a JSON object that keeps the vector's order.
mod ordered_map {
    use super::*;

    pub fn serialize<S: Serializer, T: Serialize>(rows: &[(String, T)], ser: S) -> Result<S::Ok, S::Error> {
        let mut map = ser.serialize_map(Some(rows.len()))?;
        for (k, v) in rows {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        de: D,
    ) -> Result<Vec<(String, T)>, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Vec<(String, T)>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object keyed by policy name")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    out.push(entry);
                }
                Ok(out)
            }
        }
        de.deserialize_map(V(std::marker::PhantomData))
    }
}

impl TrainResult {
    /// The run's policy (`params.policy`), if it says.
    pub fn policy(&self) -> Option<&str> {
        self.params.get("policy").and_then(|p| p.as_str())
    }

    /// Warm-up steps (`params.warmup`; 0 when absent). Records of earlier steps are not measured.
    pub fn warmup(&self) -> u64 {
        self.params.get("warmup").and_then(|w| w.as_u64()).unwrap_or(0)
    }

    /// The records of the measured steps (`step >= warmup`).
    pub fn measured(&self) -> impl Iterator<Item = &RankStep> {
        let warmup = self.warmup();
        self.records.iter().filter(move |r| r.step >= warmup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(throughput: f64) -> Summary {
        Summary { throughput, ..Summary::default() }
    }

    #[test]
    fn policies_sort_canonically_then_alphabetically() {
        let mut rows: Vec<(String, ())> = [
            "zeta",
            "helix",
            "alpha",
            "rank-local",
            "helix-placement",
            "actor-pool",
            "post-balance",
            "helix-batching",
        ]
        .iter()
        .map(|p| (p.to_string(), ()))
        .collect();
        sort_policies(&mut rows);
        let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "rank-local",
                "actor-pool",
                "post-balance",
                "helix-batching",
                "helix-placement",
                "helix",
                "alpha",
                "zeta"
            ]
        );
    }

    #[test]
    fn speedups_need_a_positive_baseline() {
        assert_eq!(speedups(&[("helix".into(), s(3.0))]), vec![None]);
        assert_eq!(speedups(&[("rank-local".into(), s(0.0)), ("helix".into(), s(3.0))]), vec![None, None]);
        assert_eq!(
            speedups(&[("rank-local".into(), s(2.0)), ("helix".into(), s(3.0))]),
            vec![Some(1.0), Some(1.5)]
        );
    }

    #[test]
    fn table_formats_units() {
        let row = Summary {
            throughput: 123.456,
            miss_rate: 0.25,
            miss_rate_10ms: 0.125,
            p50_wait_s: 0.0005,
            p95_wait_s: 0.012,
            max_wait_s: 0.25,
            efficiency: 0.912,
            rebalances_run: 7,
            rebalances_skipped: 3,
            bytes_moved: 3 * 1024 * 1024 + 512 * 1024,
            ..Summary::default()
        };
        let text = render(&[("rank-local".into(), row)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "rank-local",
                "123.5",
                "1.00x",
                "25.0%",
                "12.5%",
                "0.50",
                "12.00",
                "250.00",
                "0.91",
                "7/3",
                "3.5"
            ]
        );
        // Columns line up: every line as wide as the header or narrower only by trailing space.
        assert!(lines[0].starts_with("policy"));
        assert_eq!(lines[0].len(), lines[1].len());
    }

    #[test]
    fn json_keeps_table_order() {
        let report = CompareReport::new(
            vec![("helix".into(), s(3.0)), ("custom".into(), s(1.0)), ("rank-local".into(), s(2.0))],
            vec![PathBuf::from("p/wait_cdf.png")],
        );
        let text = serde_json::to_string(&report).unwrap();
        let (a, b, c) = (
            text.find("\"rank-local\"").unwrap(),
            text.find("\"helix\"").unwrap(),
            text.find("\"custom\"").unwrap(),
        );
        assert!(a < b && b < c, "{text}");
        let back: CompareReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, report);
        assert_eq!(back.speedup_vs_rank_local[1], ("helix".to_string(), 1.5));
    }

    #[test]
    fn result_helpers_read_params() {
        let r = TrainResult {
            params: serde_json::json!({"policy": "helix", "warmup": 2}),
            records: (0..4).map(|step| RankStep { step, ..RankStep::default() }).collect(),
            summary: Summary::default(),
        };
        assert_eq!(r.policy(), Some("helix"));
        assert_eq!(r.measured().count(), 2);
        assert_eq!(TrainResult::default().warmup(), 0);
    }
}
