//! Charts as inline SVG strings: line charts with shaded fault windows (Jepsen's latency and rate
//! plots), the HdrHistogram-style latency-by-percentile plot, the per-node fault timeline, and a
//! message sequence chart for model-checker counterexamples.
//!
//! Line charts and the timeline are drawn with plotters' SVG backend *without* its `ttf`
//! feature: text becomes SVG `<text>` elements in the generic `sans-serif` family, so no font
//! file or system library is needed and the SVG is self-contained. Log axes are drawn on a
//! linear axis over `log10(value)` with our own key points and labels, so one code path serves
//! both scales. The sequence chart is plain SVG written here (plotters has no notion of it).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::ops::Sub as _;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A chart could not be drawn (plotters reported an error). Rendering shows the message in
/// place of the chart instead of failing the whole report.
#[derive(Debug, thiserror::Error)]
#[error("chart '{chart}' could not be drawn: {message}")]
pub struct ChartError {
    pub chart: String,
    pub message: String,
}

fn chart_err<E: std::fmt::Display>(chart: &str) -> impl Fn(E) -> ChartError + '_ {
    move |e| ChartError {
        chart: chart.to_owned(),
        message: e.to_string(),
    }
}

/// Series colours: Tableau 10, then the ten darker shades of Tableau 20's pairs and a few more
/// darks, so that a chart of up to 24 series gives each its own colour (distinguishable, and
/// readable on white).
pub const PALETTE: [RGBColor; 24] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(57, 59, 121),
    RGBColor(99, 121, 57),
    RGBColor(140, 109, 49),
    RGBColor(132, 60, 57),
    RGBColor(123, 65, 115),
    RGBColor(82, 84, 163),
    RGBColor(140, 162, 82),
    RGBColor(189, 158, 57),
    RGBColor(173, 73, 74),
    RGBColor(165, 81, 148),
    RGBColor(0, 0, 0),
    RGBColor(0, 90, 50),
    RGBColor(120, 0, 60),
    RGBColor(0, 60, 120),
];

/// Colour of the i-th series.
pub fn series_color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Shading colours of windows, by distinct label in order of appearance (the first is red:
/// a chart with one kind of fault window shades it red).
const SHADE_COLORS: [RGBColor; 5] = [
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(140, 86, 75),
];

/// Colour of each shade: one per distinct label, in order of first appearance.
fn shade_color(shades: &[Shade], label: &str) -> RGBColor {
    let mut seen: Vec<&str> = Vec::new();
    for s in shades {
        if !seen.contains(&s.label.as_str()) {
            seen.push(&s.label);
        }
    }
    SHADE_COLORS[seen.iter().position(|l| *l == label).unwrap_or(0) % SHADE_COLORS.len()]
}

/// Y axis scale of a line chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Base-10 logarithmic; values ≤ 0 are clamped to the smallest positive value shown.
    Log10,
}

/// One line of a line chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A shaded x interval (a fault window, a phase).
#[derive(Clone, Debug)]
pub struct Shade {
    pub start: f64,
    pub end: f64,
    pub label: String,
}

/// A line chart with optional shaded windows.
#[derive(Clone, Debug)]
pub struct LineChart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub y_scale: Scale,
    pub series: Vec<Series>,
    pub shades: Vec<Shade>,
    pub size: (u32, u32),
    /// The x axis's `[start, end]`; `None`: the data's extent. Charts of one run set the same
    /// range so that their time axes line up.
    pub x_range: Option<(f64, f64)>,
}

/// The `[min, max]` of the values, padded so a constant series still has a visible range.
fn padded_range(values: impl Iterator<Item = f64>, include_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if include_zero {
        lo = lo.min(0.0);
        hi = hi.max(0.0);
    }
    if hi - lo < 1e-9 {
        return (lo - 1.0, hi + 1.0);
    }
    let pad = (hi - lo) * 0.05;
    (
        if include_zero && lo >= 0.0 {
            lo
        } else {
            lo - pad
        },
        hi + pad,
    )
}

/// 1-2-5 key points between `lo` and `hi` (both in log10 space), as log10 values.
fn log_key_points(lo: f64, hi: f64) -> Vec<f64> {
    let mut points = Vec::new();
    let decades = (hi - lo).max(0.0);
    let multipliers: &[f64] = if decades > 4.0 {
        &[1.0]
    } else if decades > 2.0 {
        &[1.0, 3.0]
    } else {
        &[1.0, 2.0, 5.0]
    };
    let mut exp = lo.floor() as i32;
    // Bounded: at most a few hundred decades even for absurd inputs.
    while (exp as f64) <= hi.ceil() && points.len() < 200 {
        for m in multipliers {
            let v = (m * 10f64.powi(exp)).log10();
            if v >= lo && v <= hi {
                points.push(v);
            }
        }
        exp += 1;
    }
    points
}

/// Short human form of a number for tick labels: 1.5k, 20, 0.25.
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

fn draw_shades<DB: DrawingBackend, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    shades: &[Shade],
    (y0, y1): (f64, f64),
    name: &str,
) -> Result<(), ChartError> {
    // A window shorter than half a percent of the axis (a sub-second kill in a minute-long
    // run) is drawn that wide, so that it stays visible; its exact times are in the tables.
    let (x0, x1) = {
        let r = chart.x_range();
        (r.start, r.end)
    };
    let width_min = (x1 - x0) * 0.005;
    for s in shades {
        let end = s.end.max(s.start + width_min);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(s.start, y0), (end, y1)],
                shade_color(shades, &s.label).mix(0.15).filled(),
            )))
            .map_err(chart_err(name))?;
    }
    Ok(())
}

/// What a legend entry shows next to its label.
#[derive(Clone, Copy, Debug)]
enum Swatch {
    Line(RGBColor),
    Block(RGBAColor),
}

/// Height of one legend row, in pixels.
const LEGEND_ROW_H: i32 = 24;
/// Estimated width of one label character at the legend font size (plotters without `ttf`
/// cannot measure text, so the layout estimates it).
const LEGEND_CHAR_W: i32 = 8;
/// Left edge of the legend: aligned with the plotting area (margin + y label area).
const LEGEND_LEFT: i32 = 82;

/// Positions `(x, row)` of each legend item, wrapping at `width`.
fn legend_layout(items: &[(String, Swatch)], width: u32) -> Vec<(i32, i32)> {
    let mut x = LEGEND_LEFT;
    let mut row = 0;
    items
        .iter()
        .map(|(label, _)| {
            let w = 26 + LEGEND_CHAR_W * label.chars().count() as i32 + 22;
            if x + w > width as i32 - 12 && x > LEGEND_LEFT {
                x = LEGEND_LEFT;
                row += 1;
            }
            let at = (x, row);
            x += w;
            at
        })
        .collect()
}

/// Height of the legend strip for `items` (0 when there are none).
fn legend_height(items: &[(String, Swatch)], width: u32) -> u32 {
    match legend_layout(items, width).last() {
        Some((_, rows)) => ((rows + 1) * LEGEND_ROW_H + 6) as u32,
        None => 0,
    }
}

/// Draws the legend as a strip under the chart, so it never hides data.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    items: &[(String, Swatch)],
    width: u32,
    name: &str,
) -> Result<(), ChartError> {
    for ((label, swatch), (x, row)) in items.iter().zip(legend_layout(items, width)) {
        let y = row * LEGEND_ROW_H + LEGEND_ROW_H / 2;
        match swatch {
            Swatch::Line(c) => area.draw(&PathElement::new(
                vec![(x, y), (x + 20, y)],
                c.stroke_width(2),
            )),
            Swatch::Block(c) => {
                area.draw(&Rectangle::new([(x, y - 6), (x + 20, y + 6)], c.filled()))
            }
        }
        .map_err(chart_err(name))?;
        area.draw(&Text::new(
            label.clone(),
            (x + 26, y),
            TextStyle::from(("sans-serif", 16).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(chart_err(name))?;
    }
    Ok(())
}

/// Legend entries of a line chart: one per distinct shade label, then one per series.
fn line_legend(shades: &[Shade], series: &[String]) -> Vec<(String, Swatch)> {
    let mut seen = BTreeSet::new();
    let mut items: Vec<(String, Swatch)> = shades
        .iter()
        .filter(|s| seen.insert(s.label.clone()))
        .map(|s| {
            (
                s.label.clone(),
                Swatch::Block(shade_color(shades, &s.label).mix(0.3)),
            )
        })
        .collect();
    items.extend(
        series
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), Swatch::Line(series_color(i)))),
    );
    items
}

/// Splits a series at missing values (`None`) into runs drawn as separate lines, so an interval
/// without samples (the server was down) is a gap, not a drop to zero.
fn runs(points: impl Iterator<Item = (f64, Option<f64>)>) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (x, y) in points {
        match y {
            Some(y) if y.is_finite() && x.is_finite() => {
                out.last_mut().map_or((), |r| r.push((x, y)))
            }
            _ => {
                if out.last().is_some_and(|r| !r.is_empty()) {
                    out.push(Vec::new());
                }
            }
        }
    }
    out.retain(|r| !r.is_empty());
    out
}

/// A linear f64 axis whose ticks (and grid lines) are exactly the given key points: used for
/// log axes (1-2-5 decades), the percentile axis (50/90/99/99.9%) and timeline lanes.
/// (plotters' own `WithKeyPoints` does not implement the formatter the mesh needs.)
#[derive(Clone, Debug)]
pub struct KeyedAxis {
    lo: f64,
    hi: f64,
    keys: Vec<f64>,
}

impl KeyedAxis {
    pub fn new(lo: f64, hi: f64, keys: Vec<f64>) -> Self {
        let hi = if hi > lo { hi } else { lo + 1.0 };
        Self {
            lo,
            hi,
            keys: keys.into_iter().filter(|k| (lo..=hi).contains(k)).collect(),
        }
    }
}

impl Ranged for KeyedAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let frac = (value - self.lo) / (self.hi - self.lo);
        let px = f64::from(limit.0) + frac * f64::from(limit.1 - limit.0);
        // Clamp far-off values instead of overflowing the pixel type.
        px.clamp(-1e6, 1e6).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Only bold points (labelled ticks); no light grid lines in between.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.keys.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// The x range of a line chart: its points and shades (0..1 when there are none).
fn line_x_range(spec: &LineChart) -> std::ops::Range<f64> {
    if let Some((x0, x1)) = spec.x_range
        && x0.is_finite()
        && x1 > x0
    {
        return x0..x1;
    }
    let xs = spec
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(spec.shades.iter().flat_map(|s| [s.start, s.end]));
    let (x0, x1) = xs
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if x0.is_finite() && x1 > x0 {
        x0..x1
    } else if x0.is_finite() {
        x0..x0 + 1.0
    } else {
        0.0..1.0
    }
}

/// The plotted y of value `v`: missing values (NaN) and, on a log axis, values ≤ 0 are gaps.
fn plotted_y(scale: Scale, v: f64) -> Option<f64> {
    match scale {
        Scale::Linear => v.is_finite().then_some(v),
        Scale::Log10 => (v.is_finite() && v > 0.0).then(|| v.log10()),
    }
}

/// The y axis of a line chart: its range and, on a log axis, its key points (whole decades).
fn line_y_axis(spec: &LineChart) -> (f64, f64, Option<Vec<f64>>) {
    let ys = spec
        .series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| plotted_y(spec.y_scale, p.1)));
    match spec.y_scale {
        Scale::Linear => {
            let (lo, hi) = padded_range(ys, true);
            (lo, hi, None)
        }
        Scale::Log10 => {
            let (lo, hi) = padded_range(ys, false);
            let (lo, hi) = (lo.floor(), hi.ceil());
            (lo, hi, Some(log_key_points(lo, hi)))
        }
    }
}

/// Draws each series of a line chart, broken at its gaps.
fn draw_lines<DB: DrawingBackend, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    spec: &LineChart,
    name: &str,
) -> Result<(), ChartError> {
    for (i, s) in spec.series.iter().enumerate() {
        let color = series_color(i);
        for run in runs(
            s.points
                .iter()
                .map(|&(x, y)| (x, plotted_y(spec.y_scale, y))),
        ) {
            chart
                .draw_series(LineSeries::new(run, color.stroke_width(2)))
                .map_err(chart_err(name))?;
        }
    }
    Ok(())
}

/// Draws a line chart; returns the `<svg>` element.
pub fn line_chart(spec: &LineChart) -> Result<String, ChartError> {
    let name = spec.title.as_str();
    let x_range = line_x_range(spec);
    let (y0, y1, key_points) = line_y_axis(spec);
    let mut svg = String::new();
    {
        let legend = line_legend(
            &spec.shades,
            &spec
                .series
                .iter()
                .map(|s| s.label.clone())
                .collect::<Vec<_>>(),
        );
        let legend_h = legend_height(&legend, spec.size.0);
        let root = SVGBackend::with_string(&mut svg, (spec.size.0, spec.size.1 + legend_h))
            .into_drawing_area();
        root.fill(&WHITE).map_err(chart_err(name))?;
        let (plot_area, legend_area) = root.split_vertically(spec.size.1);
        let mut builder = ChartBuilder::on(&plot_area);
        builder
            .caption(&spec.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        let y_coord = match key_points {
            Some(points) => KeyedAxis::new(y0, y1, points),
            None => {
                let inner: RangedCoordf64 = (y0..y1).into();
                KeyedAxis::new(y0, y1, inner.key_points(8))
            }
        };
        let mut chart = builder
            .build_cartesian_2d(x_range, y_coord)
            .map_err(chart_err(name))?;
        let log = spec.y_scale == Scale::Log10;
        let y_fmt = move |v: &f64| {
            if log {
                short_number(10f64.powf(*v))
            } else {
                short_number(*v)
            }
        };
        chart
            .configure_mesh()
            .x_desc(spec.x_desc.as_str())
            .y_desc(spec.y_desc.as_str())
            .x_label_formatter(&|v| short_number(*v))
            .y_label_formatter(&y_fmt)
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .axis_desc_style(("sans-serif", 17))
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(chart_err(name))?;
        draw_shades(&mut chart, &spec.shades, (y0, y1), name)?;
        draw_lines(&mut chart, spec, name)?;
        draw_legend(&legend_area, &legend, spec.size.0, name)?;
        root.present().map_err(chart_err(name))?;
    }
    Ok(svg)
}

/// x position of quantile `q` on the percentile plot: `log10(1 / (1 - q))`.
pub fn quantile_x(q: f64) -> f64 {
    let q = q.clamp(0.0, 0.999_999_9);
    (1.0 / (1.0 - q)).log10()
}

/// Tick label of percentile-plot position `x`: 50%, 90%, 99%, 99.9%, ...
pub fn quantile_label(x: f64) -> String {
    let q = 1.0 - 10f64.powf(-x);
    let decimals = (x.round() as i64 - 2).max(0) as usize;
    format!("{:.*}%", decimals, q * 100.0)
}

/// The HdrHistogram-style latency-by-percentile plot: x is `log10(1/(1-q))` with ticks at
/// 50/90/99/99.9/99.99%, y is latency in milliseconds on a log scale; one line per series
/// (`(quantile, latency_us)` points).
pub fn percentile_chart(
    title: &str,
    series: &[(String, Vec<(f64, u64)>)],
    size: (u32, u32),
) -> Result<String, ChartError> {
    let x_max = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| quantile_x(p.0)))
        .fold(0.0f64, f64::max)
        // Tolerate rounding: quantile 0.99999 is x = 5.000000000x, not worth a sixth decade.
        .sub(1e-6)
        .ceil()
        .clamp(2.0, 6.0);
    // Room on the right so the last tick label is not cut off.
    let x_end = x_max + 0.2;
    let mut keys = vec![2f64.log10()];
    keys.extend((1..=x_max as i32).map(f64::from));
    let ys = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| (p.1.max(1) as f64 / 1000.0).log10()));
    let (lo, hi) = padded_range(ys, false);
    let (y0, y1) = (lo.floor(), hi.ceil());
    let mut svg = String::new();
    {
        let legend = line_legend(&[], &series.iter().map(|s| s.0.clone()).collect::<Vec<_>>());
        let legend_h = legend_height(&legend, size.0);
        let root =
            SVGBackend::with_string(&mut svg, (size.0, size.1 + legend_h)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err(title))?;
        let (plot_area, legend_area) = root.split_vertically(size.1);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(
                KeyedAxis::new(0.0, x_end, keys),
                KeyedAxis::new(y0, y1, log_key_points(y0, y1)),
            )
            .map_err(chart_err(title))?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency (ms, log scale)")
            .x_label_formatter(&|x| quantile_label(*x))
            .y_label_formatter(&|v| short_number(10f64.powf(*v)))
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .axis_desc_style(("sans-serif", 17))
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(chart_err(title))?;
        for (i, (_, pts)) in series.iter().enumerate() {
            let color = series_color(i);
            let line = pts
                .iter()
                .map(|&(q, us)| (quantile_x(q), (us.max(1) as f64 / 1000.0).log10()));
            chart
                .draw_series(LineSeries::new(line, color.stroke_width(2)))
                .map_err(chart_err(title))?;
        }
        draw_legend(&legend_area, &legend, size.0, title)?;
        root.present().map_err(chart_err(title))?;
    }
    Ok(svg)
}

/// One bar of the fault timeline.
#[derive(Clone, Debug)]
pub struct TimelineBar {
    pub lane: String,
    pub kind: String,
    pub start_s: f64,
    /// `None`: an instantaneous event, drawn as a narrow bar.
    pub end_s: Option<f64>,
}

/// Where the timeline's bars go: lane i (top = 0) spans y in [n - i - 1, n - i]; within a lane,
/// each kind present gets its own sub-row so overlapping faults stay visible.
struct TimelineLayout<'a> {
    /// Lanes drawn (at least 1).
    n: usize,
    lane_index: BTreeMap<&'a str, usize>,
    /// Per lane, its kinds in order of first appearance (one sub-row each).
    lane_kinds: BTreeMap<usize, Vec<&'a str>>,
}

impl<'a> TimelineLayout<'a> {
    fn new(lanes: &'a [String], bars: &'a [TimelineBar]) -> Self {
        let lane_index: BTreeMap<&str, usize> = lanes
            .iter()
            .enumerate()
            .map(|(i, l)| (l.as_str(), i))
            .collect();
        let mut lane_kinds: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for b in bars {
            if let Some(&i) = lane_index.get(b.lane.as_str()) {
                let ks = lane_kinds.entry(i).or_default();
                if !ks.contains(&b.kind.as_str()) {
                    ks.push(b.kind.as_str());
                }
            }
        }
        Self {
            n: lanes.len().max(1),
            lane_index,
            lane_kinds,
        }
    }

    /// The corners of bar `b` (of `kind`), at least `instant_w` wide; `None` when its lane is
    /// not drawn.
    fn rect(&self, b: &TimelineBar, kind: &str, instant_w: f64) -> Option<[(f64, f64); 2]> {
        let n = self.n;
        let i = *self.lane_index.get(b.lane.as_str())?;
        let ks = &self.lane_kinds[&i];
        let sub = ks.iter().position(|k| *k == kind)? as f64;
        let rows = ks.len() as f64;
        let top = (n - i) as f64 - 0.15 - sub * 0.7 / rows;
        let bottom = top - 0.7 / rows + 0.04;
        let end = b
            .end_s
            .unwrap_or(b.start_s + instant_w)
            .max(b.start_s + instant_w);
        Some([(b.start_s, bottom), (end, top)])
    }
}

/// Shades the timeline's phases across every lane, each labelled at its top left.
fn draw_phases<DB: DrawingBackend, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    shades: &[Shade],
    (n, end_s): (usize, f64),
    title: &str,
) -> Result<(), ChartError> {
    for s in shades {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(s.start, 0.0), (s.end, n as f64)],
                RGBColor(44, 160, 44).mix(0.07).filled(),
            )))
            .map_err(chart_err(title))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{} phase", s.label),
                (s.start + end_s / 200.0, n as f64 - 0.02),
                ("sans-serif", 15).into_font().color(&BLACK.mix(0.6)),
            )))
            .map_err(chart_err(title))?;
    }
    Ok(())
}

/// The fault kinds of the bars, sorted: one colour each.
fn timeline_kinds(bars: &[TimelineBar]) -> Vec<&str> {
    bars.iter()
        .map(|b| b.kind.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The colour of fault kind `kind`: its place among the sorted `kinds`.
fn kind_color(kinds: &[&str], kind: &str) -> RGBColor {
    series_color(kinds.iter().position(|k| *k == kind).unwrap_or(0))
}

/// Draws the bars of each kind in turn, in the kind's colour.
fn draw_fault_bars<DB: DrawingBackend, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    layout: &TimelineLayout<'_>,
    (bars, kinds): (&[TimelineBar], &[&str]),
    instant_w: f64,
    title: &str,
) -> Result<(), ChartError> {
    for kind in kinds {
        let color = kind_color(kinds, kind);
        let rects: Vec<_> = bars
            .iter()
            .filter(|b| b.kind == *kind)
            .filter_map(|b| {
                let corners = layout.rect(b, kind, instant_w)?;
                Some(Rectangle::new(corners, color.mix(0.85).filled()))
            })
            .collect();
        chart.draw_series(rects).map_err(chart_err(title))?;
    }
    Ok(())
}

/// The fault timeline: one lane per node (top to bottom in `lanes` order), a bar per fault,
/// coloured by kind, over `0..end_s` seconds of the clock `x_desc` names (simulated time, or
/// wall-clock time since a real run began); `shades` marks phases.
pub fn timeline_chart(
    title: &str,
    x_desc: &str,
    lanes: &[String],
    bars: &[TimelineBar],
    shades: &[Shade],
    end_s: f64,
    width: u32,
) -> Result<String, ChartError> {
    let layout = TimelineLayout::new(lanes, bars);
    let n = layout.n;
    let height = 110 + 34 * n as u32;
    let end_s = bars
        .iter()
        .map(|b| b.end_s.unwrap_or(b.start_s))
        .fold(end_s, f64::max)
        .max(1e-3);
    let instant_w = end_s / 150.0;
    let kinds = timeline_kinds(bars);
    let centers: Vec<f64> = (0..n).map(|i| (n - i) as f64 - 0.5).collect();
    let lane_names: Vec<String> = lanes.to_vec();
    let mut svg = String::new();
    {
        let legend: Vec<(String, Swatch)> = kinds
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    Swatch::Block(kind_color(&kinds, k).mix(0.85)),
                )
            })
            .collect();
        let legend_h = legend_height(&legend, width);
        let root =
            SVGBackend::with_string(&mut svg, (width, height + legend_h)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err(title))?;
        let (plot_area, legend_area) = root.split_vertically(height);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(90)
            .build_cartesian_2d(0.0..end_s, KeyedAxis::new(0.0, n as f64, centers))
            .map_err(chart_err(title))?;
        let label_of = move |y: &f64| {
            let i = n as f64 - y - 0.5;
            lane_names
                .get(i.round().max(0.0) as usize)
                .cloned()
                .unwrap_or_default()
        };
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .x_label_formatter(&|v| short_number(*v))
            .y_label_formatter(&label_of)
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.08))
            .axis_desc_style(("sans-serif", 17))
            .label_style(("sans-serif", 16))
            .draw()
            .map_err(chart_err(title))?;
        draw_phases(&mut chart, shades, (n, end_s), title)?;
        draw_fault_bars(&mut chart, &layout, (bars, &kinds), instant_w, title)?;
        draw_legend(&legend_area, &legend, width, title)?;
        root.present().map_err(chart_err(title))?;
    }
    Ok(svg)
}

/// One parsed line of a counterexample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeqLine {
    /// `from -> to: message`.
    Message {
        from: String,
        to: String,
        message: String,
    },
    /// Anything else (a state note, a timeout, a crash), shown across the chart.
    Note(String),
}

/// Parses `a -> b: msg` lines; other lines become notes.
pub fn parse_sequence(lines: &[String]) -> Vec<SeqLine> {
    lines
        .iter()
        .map(|line| {
            let parsed = line.split_once("->").and_then(|(from, rest)| {
                let (to, message) = rest.split_once(':')?;
                let (from, to) = (from.trim(), to.trim());
                let plain = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
                (plain(from) && plain(to)).then(|| SeqLine::Message {
                    from: from.to_owned(),
                    to: to.to_owned(),
                    message: message.trim().to_owned(),
                })
            });
            parsed.unwrap_or_else(|| SeqLine::Note(line.trim().to_owned()))
        })
        .collect()
}

/// Escapes text for SVG/XML content and attribute values.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Longest message label drawn in full; longer ones are cut (the full text is in `<title>`).
const SEQ_LABEL_CHARS_MAX: usize = 64;

/// Most counterexample steps drawn; the rest are summarized in a final note.
pub const SEQ_STEPS_MAX: usize = 200;

/// The sequence chart's geometry: one column per actor, one row per step.
struct SeqLayout<'a> {
    actors: Vec<&'a str>,
    col_w: f64,
    left: f64,
    head_h: f64,
    row_h: f64,
    width: f64,
    height: f64,
}

impl<'a> SeqLayout<'a> {
    /// The actors in order of first appearance, and the chart's size for `parsed`.
    fn new(parsed: &'a [SeqLine]) -> Self {
        let mut actors: Vec<&str> = Vec::new();
        for l in parsed {
            if let SeqLine::Message { from, to, .. } = l {
                for a in [from, to] {
                    if !actors.contains(&a.as_str()) {
                        actors.push(a);
                    }
                }
            }
        }
        let col_w = 220.0;
        let left = 30.0;
        let head_h = 44.0;
        let row_h = 30.0;
        let width = left * 2.0 + col_w * actors.len().max(1) as f64;
        let height = head_h + 20.0 + row_h * parsed.len() as f64 + 20.0;
        Self {
            actors,
            col_w,
            left,
            head_h,
            row_h,
            width,
            height,
        }
    }

    /// The x of actor `a`'s lifeline.
    fn x_of(&self, a: &str) -> f64 {
        self.left
            + self.col_w * (self.actors.iter().position(|b| *b == a).unwrap_or(0) as f64 + 0.5)
    }

    /// The y of step `i`'s row.
    fn y_of(&self, i: usize) -> f64 {
        self.head_h + 20.0 + self.row_h * i as f64 + self.row_h / 2.0
    }

    /// Each actor's dashed lifeline under its name box.
    fn write_lifelines(&self, s: &mut String) {
        let (col_w, head_h, height) = (self.col_w, self.head_h, self.height);
        for a in &self.actors {
            let x = self.x_of(a);
            let _ = write!(
                s,
                r##"<line class="lifeline" x1="{x}" y1="{y1}" x2="{x}" y2="{y2}" stroke="#888" stroke-dasharray="4 3"/><rect x="{rx}" y="6" width="{rw}" height="28" rx="4" fill="#e8eef7" stroke="#1f77b4"/><text x="{x}" y="25" text-anchor="middle" font-size="13" font-weight="bold">{name}</text>"##,
                y1 = head_h - 10.0,
                y2 = height - 10.0,
                rx = x - col_w / 2.0 + 12.0,
                rw = col_w - 24.0,
                name = xml_escape(a),
            );
        }
    }

    /// Step `i`, a message: an arrow (a loop for a message to oneself), numbered and labelled.
    fn write_message(&self, s: &mut String, i: usize, (from, to): (&str, &str), message: &str) {
        let y = self.y_of(i);
        let (x1, x2) = (self.x_of(from), self.x_of(to));
        let short: String = if message.chars().count() > SEQ_LABEL_CHARS_MAX {
            message
                .chars()
                .take(SEQ_LABEL_CHARS_MAX - 1)
                .chain(std::iter::once('…'))
                .collect()
        } else {
            message.to_owned()
        };
        let label = format!("{}. {}", i + 1, short);
        let _ = write!(
            s,
            r#"<g class="msg"><title>{}</title>"#,
            xml_escape(&format!("{from} -> {to}: {message}"))
        );
        if from == to {
            let _ = write!(
                s,
                r##"<path d="M {x1} {y0} h 28 v 12 h -24" fill="none" stroke="#333" stroke-width="1.5"/><polygon points="{x1},{y1} {xa},{ya} {xa},{yb}" fill="#333"/><text x="{tx}" y="{ty}" font-size="12" text-anchor="start" stroke="white" stroke-width="4" paint-order="stroke">{label}</text>"##,
                y0 = y - 6.0,
                y1 = y + 6.0,
                xa = x1 + 7.0,
                ya = y + 2.0,
                yb = y + 10.0,
                tx = x1 + 34.0,
                ty = y + 2.0,
                label = xml_escape(&label),
            );
        } else {
            let dir = if x2 > x1 { 1.0 } else { -1.0 };
            let _ = write!(
                s,
                r##"<line x1="{x1}" y1="{y}" x2="{xl}" y2="{y}" stroke="#333" stroke-width="1.5"/><polygon points="{x2},{y} {xa},{ya} {xa},{yb}" fill="#333"/><text x="{tx}" y="{ty}" font-size="12" text-anchor="middle" stroke="white" stroke-width="4" paint-order="stroke">{label}</text>"##,
                xl = x2 - dir * 8.0,
                xa = x2 - dir * 9.0,
                ya = y - 4.5,
                yb = y + 4.5,
                tx = (x1 + x2) / 2.0,
                ty = y - 5.0,
                label = xml_escape(&label),
            );
        }
        s.push_str("</g>");
    }

    /// Step `i`, a note across the chart.
    fn write_note(&self, s: &mut String, i: usize, text: &str) {
        let y = self.y_of(i);
        let _ = write!(
            s,
            r##"<g class="note"><rect x="{x}" y="{ry}" width="{w}" height="20" fill="#fff7d6" stroke="#d4b106"/><text x="{tx}" y="{ty}" font-size="12" font-style="italic" text-anchor="middle">{i1}. {t}</text></g>"##,
            x = self.left,
            ry = y - 12.0,
            w = self.width - 2.0 * self.left,
            tx = self.width / 2.0,
            ty = y + 2.0,
            i1 = i + 1,
            t = xml_escape(text),
        );
    }
}

/// A message sequence chart: one vertical lifeline per actor (in order of first appearance),
/// one arrow per message, numbered in order; notes span the chart.
pub fn sequence_chart(lines: &[String]) -> String {
    let mut parsed = parse_sequence(&lines[..lines.len().min(SEQ_STEPS_MAX)]);
    if lines.len() > SEQ_STEPS_MAX {
        parsed.push(SeqLine::Note(format!(
            "… {} more step(s), see the text below",
            lines.len() - SEQ_STEPS_MAX
        )));
    }
    let layout = SeqLayout::new(&parsed);
    let (width, height) = (layout.width, layout.height);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="seq" width="{width}" height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">"#
    );
    s.push_str(r#"<rect x="0" y="0" width="100%" height="100%" fill="white"/>"#);
    layout.write_lifelines(&mut s);
    for (i, l) in parsed.iter().enumerate() {
        match l {
            SeqLine::Message { from, to, message } => {
                layout.write_message(&mut s, i, (from, to), message);
            }
            SeqLine::Note(text) => layout.write_note(&mut s, i, text),
        }
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_axis_positions_and_labels() {
        assert!((quantile_x(0.9) - 1.0).abs() < 1e-9);
        assert!((quantile_x(0.999) - 3.0).abs() < 1e-9);
        assert_eq!(quantile_label(2f64.log10()), "50%");
        assert_eq!(quantile_label(1.0), "90%");
        assert_eq!(quantile_label(2.0), "99%");
        assert_eq!(quantile_label(3.0), "99.9%");
        assert_eq!(quantile_label(4.0), "99.99%");
        // q = 1 must not produce an infinite position.
        assert!(quantile_x(1.0).is_finite());
    }

    #[test]
    fn log_key_points_are_within_range_and_sorted() {
        let pts = log_key_points(-1.0, 2.0);
        assert!(pts.windows(2).all(|w| w[0] < w[1]));
        assert!(pts.iter().all(|p| (-1.0..=2.0).contains(p)));
        assert!(pts.contains(&0.0));
        assert!(pts.len() >= 4);
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short_number(1500.0), "1500");
        assert_eq!(short_number(15000.0), "15k");
        assert_eq!(short_number(2_500_000.0), "2.5M");
        assert_eq!(short_number(0.25), "0.25");
        assert_eq!(short_number(-3.0), "-3");
    }

    #[test]
    fn parse_sequence_lines() {
        let lines = vec![
            "alloc-1 -> store: Allocate{v=0}".to_owned(),
            "crash alloc-1".to_owned(),
            "a->b:x:y".to_owned(),
        ];
        let parsed = parse_sequence(&lines);
        assert_eq!(
            parsed[0],
            SeqLine::Message {
                from: "alloc-1".into(),
                to: "store".into(),
                message: "Allocate{v=0}".into()
            }
        );
        assert_eq!(parsed[1], SeqLine::Note("crash alloc-1".into()));
        assert_eq!(
            parsed[2],
            SeqLine::Message {
                from: "a".into(),
                to: "b".into(),
                message: "x:y".into()
            }
        );
    }

    #[test]
    fn sequence_chart_has_a_lifeline_per_actor_and_an_arrow_per_message() {
        let lines: Vec<String> = [
            "a -> b: Hello<1>",
            "b -> c: Fwd",
            "c -> a: Ack & done",
            "timeout a",
            "a -> a: Retry",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let svg = sequence_chart(&lines);
        assert_eq!(svg.matches(r#"class="lifeline""#).count(), 3);
        assert_eq!(svg.matches(r#"<g class="msg">"#).count(), 4);
        assert_eq!(svg.matches(r#"<g class="note">"#).count(), 1);
        assert!(svg.contains("Hello&lt;1&gt;"));
        assert!(svg.contains("Ack &amp; done"));
    }

    #[test]
    fn sequence_chart_is_bounded() {
        let lines: Vec<String> = (0..SEQ_STEPS_MAX + 50)
            .map(|i| format!("a -> b: M{i}"))
            .collect();
        let svg = sequence_chart(&lines);
        assert_eq!(svg.matches(r#"<g class="msg">"#).count(), SEQ_STEPS_MAX);
        assert!(svg.contains("… 50 more step(s)"));
    }

    #[test]
    fn line_chart_draws_one_polyline_per_series_and_shades_windows() {
        let chart = LineChart {
            title: "t".into(),
            x_desc: "x".into(),
            y_desc: "y".into(),
            y_scale: Scale::Log10,
            series: vec![
                Series {
                    label: "p50".into(),
                    points: vec![(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)],
                },
                Series {
                    label: "p99".into(),
                    points: vec![(0.0, 10.0), (1.0, 200.0), (2.0, 30.0)],
                },
            ],
            shades: vec![Shade {
                start: 0.5,
                end: 1.5,
                label: "kill".into(),
            }],
            size: (600, 300),
            x_range: None,
        };
        let svg = line_chart(&chart).expect("chart");
        // Per series: one polyline for the data and one for its legend sample, in its colour.
        for i in 0..2 {
            let c = series_color(i);
            let stroke = format!(
                r##"stroke="#{:02X}{:02X}{:02X}" stroke-width="2""##,
                c.0, c.1, c.2
            );
            let lines = svg
                .lines()
                .filter(|l| l.starts_with("<polyline") && l.contains(&stroke))
                .count();
            assert_eq!(lines, 2, "series {i} ({stroke}) in {svg}");
        }
        // The shaded window is a translucent filled rectangle.
        assert!(svg.contains(r##"fill="#D62728""##), "{svg}");
        for label in ["p50", "p99", "kill"] {
            assert!(
                svg.contains(&format!("\n{label}\n</text>")),
                "legend label {label} in {svg}"
            );
        }
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn charts_survive_empty_and_degenerate_data() {
        let chart = LineChart {
            title: "empty".into(),
            x_desc: "x".into(),
            y_desc: "y".into(),
            y_scale: Scale::Log10,
            series: vec![Series {
                label: "flat".into(),
                points: vec![(3.0, 0.0)],
            }],
            shades: vec![],
            size: (400, 200),
            x_range: None,
        };
        assert!(line_chart(&chart).is_ok());
        assert!(percentile_chart("p", &[], (400, 200)).is_ok());
        assert!(timeline_chart("tl", "simulated time (s)", &[], &[], &[], 0.0, 400).is_ok());
        assert!(sequence_chart(&[]).starts_with("<svg"));
    }
}
