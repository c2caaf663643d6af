//! PNG plots of a policy comparison (`datahelix compare --plots DIR`), drawn with `plotters` on
//! its bitmap backend. Text uses DejaVu Sans embedded in the binary (the `dejavu` crate), so the
//! plots render the same on a machine without any font packages.
//!
//! - [`wait_cdf`]: the input-wait CDF of each policy's measured (rank, step)s, log-scaled in ms,
//!   with the 1 ms and 10 ms miss thresholds marked.
//! - [`timeline`]: per policy, each rank's first measured steps as input wait, compute and the
//!   rest of the step (the gradient all-reduce, waiting for the slowest rank).
//! - [`throughput_bars`]: throughput per policy, each bar labelled with its speed-up over
//!   `rank-local`.
//!
//! Each takes results keyed by policy (any order; plots use the table order of
//! [`super::table::sort_policies`]) and an output path, and returns an error rather than
//! panicking on empty input.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::table::{policy_cmp, speedups, BASELINE};
use super::{Summary, TrainResult};

/// Drawing a plot failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// Nothing to draw: no results, or no measured records.
    #[error("nothing to plot in {}: {what}", path.display())]
    NoData {
        /// The plot that was not written.
        path: PathBuf,
        /// What was missing.
        what: String,
    },
    /// The embedded font could not be loaded (a build problem, not an input problem).
    #[error("the embedded plot font could not be loaded")]
    Font,
    /// Drawing or writing the PNG failed.
    #[error("cannot draw {}: {message}", path.display())]
    Draw {
        /// The plot file.
        path: PathBuf,
        /// What plotters or the file system said.
        message: String,
    },
}

/// The font family every plot uses.
const FONT: &str = "sans-serif";

/// Registers the embedded DejaVu Sans as `sans-serif` once per process.
fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

/// Colours of other policies (dark enough to read on white), by their place in the table.
const EXTRA_COLOURS: [RGBColor; 6] = [
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(227, 119, 194),
    RGBColor(31, 119, 180),
    RGBColor(0, 0, 0),
    RGBColor(120, 60, 160),
];

/// A fixed colour per known policy, so each reads the same in every plot.
fn colour(policy: &str, index: usize) -> RGBColor {
    match policy {
        "rank-local" => RGBColor(214, 39, 40),
        "actor-pool" => RGBColor(255, 127, 14),
        "post-balance" => RGBColor(148, 103, 189),
        "helix-batching" => RGBColor(140, 86, 75),
        "helix-placement" => RGBColor(23, 190, 207),
        "helix" => RGBColor(44, 160, 44),
        _ => EXTRA_COLOURS[index % EXTRA_COLOURS.len()],
    }
}

/// Results in table order, borrowing.
fn ordered(results: &[(String, TrainResult)]) -> Vec<(&str, &TrainResult)> {
    let mut v: Vec<(&str, &TrainResult)> = results.iter().map(|(p, r)| (p.as_str(), r)).collect();
    v.sort_by(|a, b| policy_cmp(a.0, b.0));
    v
}

fn draw_err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> PlotError + '_ {
    move |e| PlotError::Draw { path: path.to_path_buf(), message: e.to_string() }
}

fn no_data(path: &Path, what: &str) -> PlotError {
    PlotError::NoData { path: path.to_path_buf(), what: what.to_string() }
}

/// Opens a white PNG canvas of `size` pixels at `path`.
fn canvas(path: &Path, size: (u32, u32)) -> Result<DrawingArea<BitMapBackend<'_>, Shift>, PlotError> {
    ensure_font()?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err(path))?;
    Ok(root)
}

/// Smallest wait the log-scaled CDF shows; smaller waits (including zero) are drawn there.
pub const CDF_FLOOR_MS: f64 = 0.01;

/// Writes the input-wait CDF of every policy (measured steps only) to `path`: x is the wait in
/// ms on a log scale (waits under [`CDF_FLOOR_MS`] drawn at it), y the share of (rank, step)s
/// waiting at most that long; dashed lines mark the 1 ms and 10 ms miss thresholds.
pub fn wait_cdf(results: &[(String, TrainResult)], path: &Path) -> Result<(), PlotError> {
    let mut curves: Vec<(&str, usize, Vec<f64>)> = Vec::new();
    for (i, (policy, r)) in ordered(results).into_iter().enumerate() {
        let mut waits: Vec<f64> = r
            .measured()
            .map(|s| s.input_wait_s * 1e3)
            .filter(|w| w.is_finite())
            .map(|w| w.max(CDF_FLOOR_MS))
            .collect();
        if waits.is_empty() {
            continue;
        }
        waits.sort_by(f64::total_cmp);
        curves.push((policy, i, waits));
    }
    if curves.is_empty() {
        return Err(no_data(path, "no measured (rank, step) records in any result"));
    }
    let max = curves.iter().filter_map(|c| c.2.last().copied()).fold(0.0f64, f64::max);
    let hi = (max * 1.5).max(20.0);

    let root = canvas(path, (1000, 640))?;
    let err = draw_err(path);
    let mut chart = ChartBuilder::on(&root)
        .caption("Input wait per (rank, step), measured steps", (FONT, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((CDF_FLOOR_MS..hi).log_scale(), 0.0f64..1.0)
        .map_err(&err)?;
    chart
        .configure_mesh()
        .x_desc(format!(
            "input wait (ms, log scale; under {CDF_FLOOR_MS} ms drawn at {CDF_FLOOR_MS}; dashed: the 1 ms and 10 ms miss thresholds)"
        ))
        .y_desc("share of (rank, step)s")
        .x_label_formatter(&|v| format!("{v}"))
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(&err)?;
    // The miss thresholds (1 ms, 10 ms) sit on the axis ticks of the same values.
    for threshold in [1.0, 10.0] {
        chart
            .draw_series(DashedLineSeries::new(
                [(threshold, 0.0), (threshold, 1.0)],
                6,
                4,
                ShapeStyle::from(&BLACK.mix(0.5)).stroke_width(1),
            ))
            .map_err(&err)?;
    }
    for (policy, i, waits) in &curves {
        let n = waits.len() as f64;
        let mut points = Vec::with_capacity(2 * waits.len() + 1);
        points.push((CDF_FLOOR_MS, 0.0));
        for (k, &w) in waits.iter().enumerate() {
            points.push((w, k as f64 / n));
            points.push((w, (k + 1) as f64 / n));
        }
        points.push((hi, 1.0));
        let c = colour(policy, *i);
        chart
            .draw_series(LineSeries::new(points, ShapeStyle::from(&c).stroke_width(2)))
            .map_err(&err)?
            .label(policy.to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], ShapeStyle::from(&c).stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, 16))
        .draw()
        .map_err(&err)?;
    root.present().map_err(&err)
}

/// How many measured steps [`timeline`] shows per policy.
pub const TIMELINE_STEPS: u64 = 12;

const WAIT_COLOUR: RGBColor = RGBColor(214, 39, 40);
const COMPUTE_COLOUR: RGBColor = RGBColor(31, 119, 180);
const SYNC_COLOUR: RGBColor = RGBColor(199, 199, 199);

/// Writes a per-rank timeline of each result to `path`, one panel per policy (table order): for
/// the first [`TIMELINE_STEPS`] measured steps, each rank's row shows the step's input wait (red,
/// from `start_s`), compute (blue, `gpu_s` after the wait) and the rest of the step up to `end_s`
/// (grey: the all-reduce, waiting for the slowest rank). Time is seconds from the first shown
/// step's start, on one scale for every panel. Pass one result for the timeline of one run.
pub fn timeline(results: &[(String, TrainResult)], path: &Path) -> Result<(), PlotError> {
    struct Panel<'a> {
        policy: &'a str,
        ranks: u32,
        first: u64,
        t0: f64,
        t1: f64,
        records: Vec<&'a super::RankStep>,
    }
    let mut panels = Vec::new();
    for (policy, r) in ordered(results) {
        let Some(first) = r.measured().map(|s| s.step).min() else { continue };
        let records: Vec<_> = r
            .measured()
            .filter(|s| s.step < first.saturating_add(TIMELINE_STEPS))
            .filter(|s| s.start_s.is_finite() && s.end_s.is_finite())
            .collect();
        if records.is_empty() {
            continue;
        }
        let ranks = records.iter().map(|s| s.rank).max().unwrap_or(0) + 1;
        let t0 = records.iter().map(|s| s.start_s).fold(f64::INFINITY, f64::min);
        let t1 = records.iter().map(|s| s.end_s.max(s.start_s + s.input_wait_s + s.gpu_s)).fold(t0, f64::max);
        panels.push(Panel { policy, ranks, first, t0, t1, records });
    }
    if panels.is_empty() {
        return Err(no_data(path, "no measured (rank, step) records with finite times in any result"));
    }
    let row_px = |ranks: u32| -> u32 { (ranks.clamp(1, 64) * 28).clamp(60, 640) };
    let heights: Vec<u32> = panels.iter().map(|p| 90 + row_px(p.ranks)).collect();
    let total: u32 = 50 + heights.iter().sum::<u32>();
    let root = canvas(path, (1200, total))?;
    let err = draw_err(path);

    let (legend_area, mut rest) = root.split_vertically(50);
    legend_area
        .draw(&Text::new(
            "Per-rank timeline:",
            (16, 16),
            TextStyle::from((FONT, 18).into_font().style(FontStyle::Bold)),
        ))
        .map_err(&err)?;
    for (k, (label, c)) in [
        ("input wait", WAIT_COLOUR),
        ("compute", COMPUTE_COLOUR),
        ("all-reduce / waiting for slowest rank", SYNC_COLOUR),
    ]
    .into_iter()
    .enumerate()
    {
        let x = 200 + 180 * k as i32;
        legend_area.draw(&Rectangle::new([(x, 16), (x + 24, 34)], c.filled())).map_err(&err)?;
        legend_area.draw(&Text::new(label, (x + 30, 17), (FONT, 16).into_font())).map_err(&err)?;
    }

    // One time scale for every panel, so a slower policy's steps look longer.
    let span = panels.iter().map(|p| p.t1 - p.t0).fold(1e-6, f64::max);
    for (panel, h) in panels.iter().zip(&heights) {
        let (area, below) = rest.split_vertically(*h);
        rest = below;
        let ranks = f64::from(panel.ranks);
        let mut chart = ChartBuilder::on(&area)
            .caption(
                format!("{}: steps {}..{}", panel.policy, panel.first, panel.first + TIMELINE_STEPS - 1),
                (FONT, 18),
            )
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..span * 1.01, -0.5..ranks - 0.5)
            .map_err(&err)?;
        let rank_label = |y: &f64| {
            let r = y.round();
            if (y - r).abs() < 1e-6 && r >= 0.0 && r < ranks {
                format!("rank {}", panel.ranks - 1 - r as u32)
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(panel.ranks.min(64) as usize)
            .y_label_formatter(&rank_label)
            .x_desc("seconds from the first shown step's start")
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(&err)?;
        let mut boxes = Vec::with_capacity(3 * panel.records.len());
        for s in &panel.records {
            // Rank 0 on top.
            let y = f64::from(panel.ranks - 1 - s.rank);
            let t = s.start_s - panel.t0;
            let wait = s.input_wait_s.max(0.0);
            let gpu = s.gpu_s.max(0.0);
            let end = (s.end_s - panel.t0).max(t + wait + gpu);
            for (a, b, c) in [
                (t, t + wait, WAIT_COLOUR),
                (t + wait, t + wait + gpu, COMPUTE_COLOUR),
                (t + wait + gpu, end, SYNC_COLOUR),
            ] {
                if b > a {
                    boxes.push(Rectangle::new([(a, y - 0.35), (b, y + 0.35)], c.filled()));
                }
            }
        }
        chart.draw_series(boxes).map_err(&err)?;
    }
    root.present().map_err(&err)
}

/// Writes one throughput bar per policy (table order) to `path`, each labelled with its speed-up
/// over `rank-local` (or its samples/s when no `rank-local` result is given).
pub fn throughput_bars(results: &[(String, TrainResult)], path: &Path) -> Result<(), PlotError> {
    if results.is_empty() {
        return Err(no_data(path, "no results"));
    }
    let rows: Vec<(String, Summary)> =
        ordered(results).into_iter().map(|(p, r)| (p.to_string(), r.summary.clone())).collect();
    let up = speedups(&rows);
    let finite = |v: f64| if v.is_finite() { v.max(0.0) } else { 0.0 };
    let top = rows.iter().map(|(_, s)| finite(s.throughput)).fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.18 } else { 1.0 };
    let n = rows.len();

    let width = (160 + 150 * n as u32).clamp(700, 2400);
    let root = canvas(path, (width, 600))?;
    let err = draw_err(path);
    let caption = if up.iter().any(Option::is_some) {
        format!("Throughput (labels: speed-up over {BASELINE})")
    } else {
        "Throughput".to_string()
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, (FONT, 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..top)
        .map_err(&err)?;
    let name_of = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            rows.get(*i).map(|r| r.0.clone()).unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&name_of)
        .y_desc("samples / s")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(&err)?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, (p, s))| {
            let mut bar = Rectangle::new(
                [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), finite(s.throughput))],
                colour(p, i).filled(),
            );
            bar.set_margin(0, 0, 18, 18);
            bar
        }))
        .map_err(&err)?;
    let above = TextStyle::from((FONT, 18).into_font().style(FontStyle::Bold))
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(rows.iter().zip(&up).enumerate().map(|(i, ((_, s), u))| {
            let label = match u {
                Some(u) => format!("{u:.2}x"),
                None => format!("{:.1}/s", s.throughput),
            };
            Text::new(label, (SegmentValue::CenterOf(i), finite(s.throughput) + top * 0.01), above.clone())
        }))
        .map_err(&err)?;
    root.present().map_err(&err)
}

/// File names [`write_all`] uses inside its output folder.
pub const FILES: [&str; 3] = ["wait_cdf.png", "timeline.png", "throughput.png"];

/// Writes [`wait_cdf`], [`timeline`] and [`throughput_bars`] into `dir` (created if missing) as
/// [`FILES`]; returns the paths written.
pub fn write_all(results: &[(String, TrainResult)], dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    std::fs::create_dir_all(dir).map_err(draw_err(dir))?;
    let paths: Vec<PathBuf> = FILES.iter().map(|f| dir.join(f)).collect();
    wait_cdf(results, &paths[0])?;
    timeline(results, &paths[1])?;
    throughput_bars(results, &paths[2])?;
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::RankStep;

    #[test]
    fn the_embedded_font_registers() {
        ensure_font().unwrap();
        ensure_font().unwrap();
    }

    #[test]
    fn empty_input_is_an_error_not_a_panic() {
        let dir = std::env::temp_dir().join(format!("datahelix-plots-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.png");
        assert!(matches!(wait_cdf(&[], &p), Err(PlotError::NoData { .. })));
        assert!(matches!(timeline(&[], &p), Err(PlotError::NoData { .. })));
        assert!(matches!(throughput_bars(&[], &p), Err(PlotError::NoData { .. })));
        // A result with no records: the bars still draw (from the summary), the others refuse.
        let r = vec![("helix".to_string(), TrainResult::default())];
        assert!(matches!(wait_cdf(&r, &p), Err(PlotError::NoData { .. })));
        assert!(matches!(timeline(&r, &p), Err(PlotError::NoData { .. })));
        throughput_bars(&r, &p).unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn degenerate_records_do_not_panic() {
        let dir = std::env::temp_dir().join(format!("datahelix-plots-degenerate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rec = RankStep {
            rank: 0,
            step: 0,
            input_wait_s: 0.0,
            gpu_s: 0.0,
            start_s: 1.0,
            end_s: 1.0,
            ..Default::default()
        };
        let nan =
            RankStep { rank: 3, step: 0, input_wait_s: f64::NAN, start_s: f64::NAN, ..Default::default() };
        let r = vec![("odd".to_string(), TrainResult { records: vec![rec, nan], ..Default::default() })];
        wait_cdf(&r, &dir.join("a.png")).unwrap();
        timeline(&r, &dir.join("b.png")).unwrap();
        throughput_bars(&r, &dir.join("c.png")).unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }
}
