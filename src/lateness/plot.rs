//! `--plot FILE.svg`: the completeness curve of settled rows — x: lateness on a log axis,
//! y: % of rows arrived — one line for the table and one per `--by` group (the tail's owners
//! first), with the budget, the overlap and the recommendation marked. Drawn by `plotters`'
//! SVG backend; written atomically (a temporary file beside it, then a rename).

use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::coord::combinators::{BindKeyPoints, IntoLogRange};
use plotters::prelude::*;

use super::report::{LatenessReport, Profile};
use super::text::pct_text;
use super::{duration_text, LatenessError};

/// Groups drawn besides the whole table (the legend stays readable).
pub const MAX_PLOTTED_GROUPS: usize = 10;
/// Points per curve (log-spaced).
const POINTS: usize = 400;

/// Seconds → `15m`, `2h10m`, `3days`, for the x axis.
fn label(seconds: f64) -> String {
    duration_text(std::time::Duration::from_secs(
        seconds.round().max(0.0) as u64
    ))
}

/// `(x, % arrived with lateness <= x)` at log-spaced x from 1 s to `max`.
fn curve(p: &Profile, max: f64) -> Vec<(f64, f64)> {
    let total = p.curve.total();
    if total == 0 {
        return Vec::new();
    }
    let step = max.ln() / (POINTS - 1) as f64;
    (0..POINTS)
        .map(|i| {
            let x = (step * i as f64).exp().min(max);
            let within = p.curve.at_most(x.floor() as i64);
            (x, 100.0 * within as f64 / total as f64)
        })
        .collect()
}

/// Renders the SVG.
pub fn render(report: &LatenessReport) -> Result<String, String> {
    let max_x = longest(report) * 1.5;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (title, body) = root.split_vertically(64);
        titles(&title, report)?;
        let keys: Vec<f64> = [
            1.0,
            10.0,
            60.0,
            600.0,
            3_600.0,
            21_600.0,
            86_400.0,
            604_800.0,
            2_592_000.0,
            31_536_000.0,
        ]
        .into_iter()
        .filter(|k| *k <= max_x)
        .collect();
        let mut chart = ChartBuilder::on(&body)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d(
                (1.0f64..max_x).log_scale().with_key_points(keys),
                0f64..100f64,
            )
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("lateness: arrival - event time (log scale)")
            .y_desc("% of settled rows arrived")
            .x_label_formatter(&|x| label(*x))
            .y_label_formatter(&|y| format!("{y:.0}%"))
            .draw()
            .map_err(|e| e.to_string())?;
        marks(&mut chart, report)?;
        curves(&mut chart, report, max_x)?;
        recommendation(&mut chart, report)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// The longest lateness the x axis must show: the budget (at least a minute), the overlap, the
/// recommended lookback, the latest row.
fn longest(report: &LatenessReport) -> f64 {
    let overall = &report.overall;
    [
        report.overlap_s,
        overall.recommendation.as_ref().map(|r| r.lookback_s as f64),
        overall.percentiles_s.max,
    ]
    .into_iter()
    .flatten()
    .fold(report.budget_s.max(60.0), f64::max)
}

/// The title and the line under it (the window, `now`, the recommendation's sentence).
fn titles<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    report: &LatenessReport,
) -> Result<(), String> {
    let source = match &report.pipeline {
        Some(p) => format!("pipeline {p}"),
        None => report.table.clone(),
    };
    area.draw(&Text::new(
        format!(
            "Completeness of settled rows — {source} ({} by {})",
            report.arrival, report.event_time
        ),
        (16, 10),
        ("sans-serif", 20).into_font(),
    ))
    .map_err(|e| e.to_string())?;
    area.draw(&Text::new(
        format!(
            "events {}..{} before {}; {}",
            report.settled.from,
            report.settled.to,
            report.now.as_deref().unwrap_or("now"),
            report.sentence(&report.overall)
        ),
        (16, 38),
        ("sans-serif", 13).into_font(),
    ))
    .map_err(|e| e.to_string())
}

/// The chart the curves are drawn on: lateness (log) by % arrived.
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<
        plotters::coord::combinators::WithKeyPoints<plotters::coord::combinators::LogCoord<f64>>,
        plotters::coord::types::RangedCoordf64,
    >,
>;

/// The budget and the overlap as dashed verticals.
fn marks(chart: &mut Chart<'_, '_>, report: &LatenessReport) -> Result<(), String> {
    let mut mark = |x: f64, color: RGBColor, name: String| -> Result<(), String> {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, 0.0), (x, 100.0)],
                6,
                4,
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        Ok(())
    };
    mark(
        report.budget_s.max(1.0),
        RGBColor(200, 30, 30),
        format!("budget {}", report.budget),
    )?;
    if let (Some(o), Some(secs)) = (&report.overlap, report.overlap_s) {
        mark(secs.max(1.0), RGBColor(230, 140, 0), format!("overlap {o}"))?;
    }
    Ok(())
}

/// A curve per group (the first [`MAX_PLOTTED_GROUPS`]), then the whole table's on top.
fn curves(chart: &mut Chart<'_, '_>, report: &LatenessReport, max_x: f64) -> Result<(), String> {
    for (i, g) in report.groups.iter().take(MAX_PLOTTED_GROUPS).enumerate() {
        let color = Palette99::pick(i + 1).to_rgba();
        let name = g.group.clone().unwrap_or_else(|| "(null)".into());
        chart
            .draw_series(LineSeries::new(
                curve(&g.profile, max_x),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(format!(
                "{} = {name}",
                report.by.as_deref().unwrap_or("group")
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .draw_series(LineSeries::new(
            curve(&report.overall, max_x),
            BLACK.stroke_width(3),
        ))
        .map_err(|e| e.to_string())?
        .label("all rows")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3)));
    Ok(())
}

/// The recommended lookback: a dashed guide from the target completeness, and its point.
fn recommendation(chart: &mut Chart<'_, '_>, report: &LatenessReport) -> Result<(), String> {
    let Some(r) = report.overall.recommendation.as_ref() else {
        return Ok(());
    };
    let x = (r.lookback_s as f64).max(1.0);
    let blue = RGBColor(30, 90, 200);
    chart
        .draw_series(DashedLineSeries::new(
            vec![(1.0, r.target_pct), (x, r.target_pct), (x, 0.0)],
            3,
            3,
            blue.stroke_width(1),
        ))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(std::iter::once(Circle::new(
            (x, r.lookback_covers_pct),
            5,
            blue.filled(),
        )))
        .map_err(|e| e.to_string())?
        .label(format!(
            "{} needs a lookback of {}",
            pct_text(r.target_pct),
            r.lookback
        ))
        .legend(move |(x, y)| Circle::new((x + 10, y), 4, blue.filled()));
    Ok(())
}

/// Draws the report's curve into `path`, atomically: a temporary file in the same directory,
/// synced, then renamed over `path`.
pub fn write_plot(report: &LatenessReport, path: &Path) -> Result<(), LatenessError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(LatenessError::PlotDirectory {
            path: path.to_path_buf(),
            dir,
        });
    }
    if path.is_dir() {
        return Err(LatenessError::PlotWrite {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "it is a directory; name a file, e.g. lateness.svg",
            ),
        });
    }
    let svg = render(report).map_err(|message| LatenessError::PlotDraw {
        path: path.to_path_buf(),
        message,
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plot.svg".into());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(svg.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    written.map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        LatenessError::PlotWrite {
            path: path.to_path_buf(),
            source,
        }
    })
}
