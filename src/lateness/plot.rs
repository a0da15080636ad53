//! `--plot FILE.svg`: the completeness curve of settled rows — x: lateness on a log axis,
//! y: the share of rows not arrived yet, on a log axis (so the 99–100% band, where a lookback
//! is chosen, is as tall as the rest) — one line for the table and one per `--by` group (the
//! tail's owners first), with the target, the budget, the overlap and the lookback marked. Drawn by `plotters`'
//! SVG backend; written atomically (a temporary file beside it, then a rename).

use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::coord::combinators::{BindKeyPoints, IntoLogRange};
use plotters::element::{Drawable, PointCollection};
use plotters::prelude::*;
use plotters_backend::DrawingErrorKind;

use super::report::{LatenessReport, Profile};
use super::text::pct_text;
use super::{duration_text, LatenessError};

/// Points per curve (log-spaced).
const POINTS: usize = 400;

/// The groups' colours: Okabe and Ito's palette for colour-blind readers (orange, sky blue,
/// bluish green, blue, vermillion, reddish purple), without its pale yellow, which vanishes on
/// white. The whole table is black; the marks are greys, so no group is taken for a mark.
pub const PALETTE: [RGBColor; 6] = [
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0xCC, 0x79, 0xA7),
];
const MARK: RGBColor = RGBColor(0x55, 0x55, 0x55);
const LIGHT_MARK: RGBColor = RGBColor(0x99, 0x99, 0x99);

/// A line's dashes: drawn `on` pixels, then `off` (`off == 0`: solid).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dash {
    on: u32,
    off: u32,
}
const SOLID: Dash = Dash { on: 1, off: 0 };
const LONG_DASH: Dash = Dash { on: 8, off: 4 };
const DOTS: Dash = Dash { on: 2, off: 3 };
const SHORT_DASH: Dash = Dash { on: 4, off: 3 };
const RULE: Dash = Dash { on: 12, off: 3 };

/// Seconds → `15m`, `2h10m`, `3days`, for the x axis.
fn label(seconds: f64) -> String {
    duration_text(std::time::Duration::from_secs(
        seconds.round().max(0.0) as u64
    ))
}

/// The y axis's bottom: a power of ten below both one row's share of the settled rows and a
/// tenth of the share the target leaves missing, so the last row and the target both show.
pub fn floor_pct(settled_rows: u64, target_pct: f64) -> f64 {
    let one_row = 100.0 / settled_rows.max(1) as f64;
    let target_gap = ((100.0 - target_pct) / 10.0).max(1e-6);
    let low = one_row.min(target_gap).max(1e-6);
    // (a hair up: 0.1 / 10 in binary floating point is just under 0.01)
    10f64.powf((low.log10() + 1e-9).floor())
}

/// The share of rows not arrived yet, in %, as the y axis draws it: nothing missing sits on
/// the axis's floor (a log axis has no zero).
pub fn missing_pct(arrived_pct: f64, floor: f64) -> f64 {
    match arrived_pct.is_finite() {
        true => (100.0 - arrived_pct).clamp(floor, 100.0),
        false => 100.0,
    }
}

/// `(x, % still missing with lateness <= x)` at log-spaced x from 1 s to `max`.
fn curve(p: &Profile, max: f64, floor: f64) -> Vec<(f64, f64)> {
    let total = p.curve.total();
    if total == 0 {
        return Vec::new();
    }
    let step = max.ln() / (POINTS - 1) as f64;
    (0..POINTS)
        .map(|i| {
            let x = (step * i as f64).exp().min(max);
            let within = p.curve.at_most(x.floor() as i64);
            (x, missing_pct(100.0 * within as f64 / total as f64, floor))
        })
        .collect()
}

/// A y tick: `10%`, `0.1%`, and the floor as `none`.
fn y_label(y: f64, floor: f64) -> String {
    if (y / floor - 1.0).abs() < 1e-9 {
        return "none".into();
    }
    let text = format!("{y:.6}");
    format!("{}%", text.trim_end_matches('0').trim_end_matches('.'))
}

/// Renders the SVG.
pub fn render(report: &LatenessReport) -> Result<String, String> {
    let max_x = longest(report) * 1.5;
    let floor = floor_pct(report.overall.settled_rows, report.target_completeness_pct);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 640)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (title, body) = root.split_vertically(84);
        titles(&title, report)?;
        let x_keys: Vec<f64> = [
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
        let y_keys: Vec<f64> = (0..=8)
            .map(|i| 100.0 / 10f64.powi(i))
            .take_while(|y| *y >= floor * 0.999)
            .collect();
        let mut chart = ChartBuilder::on(&body)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (1.0f64..max_x).log_scale().with_key_points(x_keys),
                (floor..100f64).log_scale().with_key_points(y_keys),
            )
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("lateness: arrival - event time (log scale)")
            .y_desc("share of settled rows not arrived yet (log scale)")
            .x_label_formatter(&|x| label(*x))
            .y_label_formatter(&|y| y_label(*y, floor))
            .draw()
            .map_err(|e| e.to_string())?;
        marks(&mut chart, report, max_x)?;
        curves(&mut chart, report, max_x, floor)?;
        recommendation(&mut chart, report, floor)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
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

/// The title and the two lines under it: the window and the lookback, then the overlap.
fn titles<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    report: &LatenessReport,
) -> Result<(), String> {
    let source = match &report.pipeline {
        Some(p) => format!("pipeline {p}"),
        None => report.table.clone(),
    };
    let lines = [
        (
            format!(
                "How late rows arrive — {source} ({} by {})",
                report.arrival, report.event_time
            ),
            20,
        ),
        (
            format!(
                "events {}..{} before {}: {}",
                report.settled.from,
                report.settled.to,
                report.now.as_deref().unwrap_or("now"),
                report.lookback_sentence(&report.overall)
            ),
            13,
        ),
        (
            report.overlap_sentence(&report.overall).unwrap_or_default(),
            13,
        ),
    ];
    let mut y = 10;
    for (text, size) in lines {
        area.draw(&Text::new(text, (16, y), ("sans-serif", size).into_font()))
            .map_err(|e| e.to_string())?;
        y += size + 10;
    }
    Ok(())
}

/// The chart the curves are drawn on: lateness (log) by % still missing (log).
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<
        plotters::coord::combinators::WithKeyPoints<plotters::coord::combinators::LogCoord<f64>>,
        plotters::coord::combinators::WithKeyPoints<plotters::coord::combinators::LogCoord<f64>>,
    >,
>;

/// The segments of a legend swatch 24 px wide drawn with `dash`, relative to its anchor: the
/// legend draws each line as it is drawn in the chart.
pub fn swatch_segments(dash: Dash) -> Vec<(i32, i32)> {
    const WIDTH: u32 = 24;
    if dash.off == 0 {
        return vec![(0, WIDTH as i32)];
    }
    let mut out = Vec::new();
    let mut x = 0;
    while x < WIDTH {
        out.push((x as i32, (x + dash.on).min(WIDTH) as i32));
        x += dash.on + dash.off;
    }
    out
}

/// A legend entry's swatch, dashed like its line: the legend draws each line as the chart
/// does (plotters' own legend entries are solid).
struct Swatch {
    at: (i32, i32),
    dash: Dash,
    style: ShapeStyle,
}

impl<'a> PointCollection<'a, (i32, i32)> for &'a Swatch {
    type Point = &'a (i32, i32);
    type IntoIter = std::iter::Once<&'a (i32, i32)>;
    fn point_iter(self) -> Self::IntoIter {
        std::iter::once(&self.at)
    }
}

impl<DB: DrawingBackend> Drawable<DB> for Swatch {
    fn draw<I: Iterator<Item = (i32, i32)>>(
        &self,
        mut pos: I,
        backend: &mut DB,
        _: (u32, u32),
    ) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let Some((x, y)) = pos.next() else {
            return Ok(());
        };
        for (from, to) in swatch_segments(self.dash) {
            backend.draw_line((x + from, y), (x + to, y), &self.style)?;
        }
        Ok(())
    }
}

/// A dashed or solid line through `points`, named in the legend with a matching swatch.
fn line<'b>(
    chart: &mut Chart<'_, 'b>,
    points: Vec<(f64, f64)>,
    dash: Dash,
    style: ShapeStyle,
    name: String,
) -> Result<(), String> {
    let drawn = match dash.off {
        0 => chart.draw_series(LineSeries::new(points, style)),
        _ => chart.draw_series(DashedLineSeries::new(points, dash.on, dash.off, style)),
    };
    drawn
        .map_err(|e| e.to_string())?
        .label(name)
        .legend(move |at| Swatch { at, dash, style });
    Ok(())
}

/// The target (a horizontal), the budget and the overlap (verticals).
fn marks(chart: &mut Chart<'_, '_>, report: &LatenessReport, max_x: f64) -> Result<(), String> {
    let target = report.target_completeness_pct;
    let gap = (100.0 - target).max(1e-9);
    line(
        chart,
        vec![(1.0, gap), (max_x, gap)],
        SHORT_DASH,
        MARK.stroke_width(1),
        format!(
            "target: {} arrived ({} missing)",
            pct_text(target),
            pct_text(gap)
        ),
    )?;
    let (top, bottom) = (100.0, 1e-9);
    line(
        chart,
        vec![
            (report.budget_s.max(1.0), bottom),
            (report.budget_s.max(1.0), top),
        ],
        LONG_DASH,
        LIGHT_MARK.stroke_width(2),
        format!("budget {}", report.budget),
    )?;
    if let (Some(o), Some(secs)) = (&report.overlap, report.overlap_s) {
        line(
            chart,
            vec![(secs.max(1.0), bottom), (secs.max(1.0), top)],
            DOTS,
            MARK.stroke_width(2),
            format!("overlap {o} (cost setting; later rows still merged)"),
        )?;
    }
    Ok(())
}

/// A curve per group (the first six, one per colour of [`PALETTE`]: the tail's owners), then
/// the whole table's on top.
fn curves(
    chart: &mut Chart<'_, '_>,
    report: &LatenessReport,
    max_x: f64,
    floor: f64,
) -> Result<(), String> {
    for (g, color) in report.groups.iter().zip(PALETTE) {
        let name = g.group.clone().unwrap_or_else(|| "(null)".into());
        let by = report.by.as_deref().unwrap_or("group");
        line(
            chart,
            curve(&g.profile, max_x, floor),
            SOLID,
            color.stroke_width(2),
            format!("{by} = {name}"),
        )?;
    }
    line(
        chart,
        curve(&report.overall, max_x, floor),
        SOLID,
        BLACK.stroke_width(3),
        "all rows".into(),
    )
}

/// The recommended lookback: a vertical down from the top to the curve, and its point.
fn recommendation(
    chart: &mut Chart<'_, '_>,
    report: &LatenessReport,
    floor: f64,
) -> Result<(), String> {
    let Some(r) = report.overall.recommendation.as_ref() else {
        return Ok(());
    };
    let x = (r.lookback_s as f64).max(1.0);
    let y = missing_pct(r.lookback_covers_pct, floor);
    line(
        chart,
        vec![(x, 100.0), (x, y)],
        RULE,
        BLACK.stroke_width(2),
        format!(
            "lookback {}: {} arrived",
            r.lookback,
            pct_text(r.lookback_covers_pct)
        ),
    )?;
    chart
        .draw_series(std::iter::once(Circle::new((x, y), 5, BLACK.filled())))
        .map_err(|e| e.to_string())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_shows_one_row_and_the_target() {
        assert_eq!(floor_pct(20_000, 99.9), 0.001);
        assert_eq!(floor_pct(10, 99.9), 0.01);
        assert!((floor_pct(0, 99.0) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn nothing_missing_sits_on_the_floor() {
        assert_eq!(missing_pct(100.0, 0.001), 0.001);
        assert!((missing_pct(99.9, 0.001) - 0.1).abs() < 1e-9);
        assert_eq!(missing_pct(0.0, 0.001), 100.0);
        assert_eq!(missing_pct(f64::NAN, 0.001), 100.0);
        assert_eq!(y_label(0.001, 0.001), "none");
        assert_eq!(y_label(0.1, 0.001), "0.1%");
        assert_eq!(y_label(100.0, 0.001), "100%");
    }

    #[test]
    fn swatches_are_dashed_like_their_lines() {
        assert_eq!(swatch_segments(SOLID), vec![(0, 24)]);
        assert_eq!(swatch_segments(LONG_DASH), vec![(0, 8), (12, 20)]);
        assert!(swatch_segments(DOTS).len() > 3);
    }

    #[test]
    fn no_group_colour_is_pale_or_grey() {
        for c in PALETTE {
            let luminance = 0.2126 * c.0 as f64 + 0.7152 * c.1 as f64 + 0.0722 * c.2 as f64;
            assert!(luminance < 200.0, "{c:?} is too pale on white");
            assert!(
                !(c.0 == c.1 && c.1 == c.2),
                "{c:?} is a grey, like the marks"
            );
        }
    }
}
