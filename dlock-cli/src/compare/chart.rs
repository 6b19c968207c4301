//! The report's charts, as inline SVG drawn here (no script, no external asset).
//!
//! Every chart has one row per backend, in the report's order, and each row is one mark: a
//! `<g class="mark" data-backend="…">` whose `data-*` attributes carry the figures it draws, the
//! same numbers as `report.json` (a backend without the figure gets a mark that says so, with
//! empty values), so a reader of the SVG, or a test, can check the picture against the data.

use std::fmt::Write as _;

use super::model::{BackendReport, min_token_of};

const WIDTH: f64 = 760.0;
const LABEL: f64 = 130.0;
const RIGHT: f64 = 150.0;
const ROW: f64 = 26.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 30.0;

/// Escapes text for XML.
pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A figure for a `data-*` attribute: as JSON would print it, or empty when missing.
fn data(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| format!("{v}"))
}

/// A horizontal axis from 0 (or `lo` on a log axis) to `hi`, mapping values to x.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn linear(max: f64) -> Self {
        Axis {
            lo: 0.0,
            hi: nice(max.max(1.0) * 1.05),
            log: false,
        }
    }

    /// A log axis over whole decades around `min..=max`; 1..1000 when there is no figure
    /// (`min` infinite).
    fn log(min: f64, max: f64) -> Self {
        if !min.is_finite() || !max.is_finite() {
            return Axis {
                lo: 1.0,
                hi: 1000.0,
                log: true,
            };
        }
        let lo = 10f64.powf(min.max(1.0).log10().floor());
        let hi = 10f64.powf(max.max(lo * 10.0).log10().ceil());
        Axis { lo, hi, log: true }
    }

    fn x(&self, v: f64) -> f64 {
        let span = WIDTH - LABEL - RIGHT;
        let f = if self.log {
            (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            v / self.hi
        };
        LABEL + span * f.clamp(0.0, 1.0)
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let mut t = self.lo;
            let mut out = Vec::new();
            while t <= self.hi * 1.001 {
                out.push(t);
                t *= 10.0;
            }
            out
        } else {
            // `hi` is 1, 2 or 5 times a power of ten: steps of a fifth, a quarter, a fifth.
            let lead = self.hi / 10f64.powf(self.hi.log10().floor());
            let steps = if (lead - 2.0).abs() < 1e-9 { 4 } else { 5 };
            (0..=steps)
                .map(|i| self.hi * f64::from(i) / f64::from(steps))
                .collect()
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `v`.
fn nice(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|n| *n >= v)
        .unwrap_or(10.0 * p)
}

/// Short numbers for ticks and labels: 1200 → 1.2k.
fn short(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{:.1}M", v / 1_000_000.0)
    } else if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The frame: title, axis ticks with their unit, one label per row.
fn frame(title: &str, unit: &str, axis: &Axis, rows: &[&BackendReport], out: &mut String) {
    let height = TOP + ROW * rows.len() as f64 + BOTTOM;
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" aria-label="{t}" font-family="sans-serif" font-size="12"><title>{t}</title><rect width="100%" height="100%" fill="white"/><text x="8" y="18" font-weight="bold" font-size="14">{t}</text>"#,
        t = escape(title)
    );
    let bottom = TOP + ROW * rows.len() as f64;
    for t in axis.ticks() {
        let x = axis.x(t);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{bottom}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            bottom + 14.0,
            short(t)
        );
    }
    let _ = write!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{}</text>"##,
        WIDTH - 8.0,
        bottom + 26.0,
        escape(unit)
    );
    for (i, b) in rows.iter().enumerate() {
        let y = TOP + ROW * i as f64 + ROW / 2.0 + 4.0;
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{y:.1}" text-anchor="end">{}</text>"#,
            LABEL - 8.0,
            escape(&b.name)
        );
    }
}

/// A row without the figure: the mark says why, and carries empty values.
fn missing(out: &mut String, b: &BackendReport, i: usize, attrs: &[&str]) {
    let y = TOP + ROW * i as f64 + ROW / 2.0 + 4.0;
    let empty: String = attrs.iter().map(|a| format!(r#" data-{a}="""#)).collect();
    let _ = write!(
        out,
        r##"<g class="mark" data-backend="{}"{empty}><text x="{:.1}" y="{y:.1}" fill="#888">no figure</text></g>"##,
        escape(&b.name),
        LABEL + 4.0
    );
}

/// Uncontended acquire+release pairs per second, each beside its raw floor (the backend's own
/// commands with the same guarantees, measured in the same run), drawn as a grey bar behind.
pub(crate) fn throughput(rows: &[&BackendReport]) -> String {
    let figures: Vec<Option<(f64, Option<f64>)>> = rows
        .iter()
        .map(|b| {
            let u = b.bench.uncontended.as_ref()?;
            Some((u.pairs_per_sec, min_token_of(u).map(|f| f.pairs_per_sec)))
        })
        .collect();
    against(
        rows,
        &figures,
        Against {
            title: "Uncontended throughput against each backend's floor",
            unit: "acquire+release pairs/s (grey: the floor, fenced where there is one)",
            reference: "floor",
            colour: "#3b6ea8",
            as_bar: true,
            share: |v, floor| format!(" ({:.2} × floor)", v / floor),
        },
    )
}

/// The latency of one uncontended acquire+release pair: a bar from p50 to p99, a thin line on
/// to p99.9, a tick at the median; log scale.
pub(crate) fn latency(rows: &[&BackendReport]) -> String {
    let figures: Vec<Option<[f64; 3]>> = rows
        .iter()
        .map(|b| {
            b.bench
                .uncontended
                .as_ref()
                .filter(|u| u.latency.count > 0)
                .map(|u| [u.latency.p50_us, u.latency.p99_us, u.latency.p999_us])
        })
        .collect();
    let all: Vec<f64> = figures.iter().flatten().flatten().copied().collect();
    let axis = Axis::log(
        all.iter().copied().fold(f64::INFINITY, f64::min),
        all.iter().copied().fold(0.0, f64::max),
    );
    let mut out = String::new();
    frame(
        "Uncontended latency per acquire+release pair",
        "µs, log scale (bar p50–p99, line to p99.9)",
        &axis,
        rows,
        &mut out,
    );
    for (i, (b, fig)) in rows.iter().zip(&figures).enumerate() {
        let Some([p50, p99, p999]) = fig else {
            missing(&mut out, b, i, &["p50", "p99", "p999"]);
            continue;
        };
        let mid = TOP + ROW * i as f64 + ROW / 2.0;
        let (x50, x99, x999) = (axis.x(*p50), axis.x(*p99), axis.x(*p999));
        let _ = write!(
            out,
            r##"<g class="mark" data-backend="{}" data-p50="{}" data-p99="{}" data-p999="{}"><line x1="{x99:.1}" y1="{mid:.1}" x2="{x999:.1}" y2="{mid:.1}" stroke="#3b6ea8"/><rect x="{x50:.1}" y="{:.1}" width="{:.1}" height="12" fill="#9bbbe0" stroke="#3b6ea8"/><line x1="{x50:.1}" y1="{:.1}" x2="{x50:.1}" y2="{:.1}" stroke="#1d3b5e" stroke-width="2"/><text x="{:.1}" y="{:.1}">p50 {} · p99 {}</text></g>"##,
            escape(&b.name),
            data(Some(*p50)),
            data(Some(*p99)),
            data(Some(*p999)),
            mid - 6.0,
            (x99 - x50).max(1.0),
            mid - 8.0,
            mid + 8.0,
            x999 + 4.0,
            mid + 4.0,
            short(*p50),
            short(*p99),
        );
    }
    out.push_str("</svg>");
    out
}

/// Contended acquisitions per second against the limit the hold time sets (clients of one
/// name can do no better than one hold after another), drawn as a tick.
pub(crate) fn contended(rows: &[&BackendReport]) -> String {
    let figures: Vec<Option<(f64, Option<f64>)>> = rows
        .iter()
        .map(|b| {
            let c = b.bench.contended.as_ref()?;
            Some((c.acquisitions_per_sec, c.limit_per_sec))
        })
        .collect();
    against(
        rows,
        &figures,
        Against {
            title: "Contended: 8 clients on one name, 1 ms holds",
            unit: "acquisitions/s (tick: the limit)",
            reference: "limit",
            colour: "#5a9e6f",
            as_bar: false,
            share: |v, limit| format!(" ({:.0}% of limit)", 100.0 * v / limit),
        },
    )
}

/// How a chart of values against a reference per backend looks.
struct Against {
    title: &'static str,
    unit: &'static str,
    /// The reference's `data-*` name.
    reference: &'static str,
    colour: &'static str,
    /// The reference as a grey bar behind the value (else a tick across it).
    as_bar: bool,
    /// The label's text after the value, from value and reference.
    share: fn(f64, f64) -> String,
}

/// A bar per backend for its value (`data-value`), with its reference (`data-<reference>`).
fn against(
    rows: &[&BackendReport],
    figures: &[Option<(f64, Option<f64>)>],
    how: Against,
) -> String {
    let max = figures
        .iter()
        .flatten()
        .map(|(v, r)| v.max(r.unwrap_or(0.0)))
        .fold(0.0, f64::max);
    let axis = Axis::linear(max);
    let mut out = String::new();
    frame(how.title, how.unit, &axis, rows, &mut out);
    for (i, (b, fig)) in rows.iter().zip(figures).enumerate() {
        let Some((value, reference)) = fig else {
            missing(&mut out, b, i, &["value", how.reference]);
            continue;
        };
        let y = TOP + ROW * i as f64;
        let _ = write!(
            out,
            r#"<g class="mark" data-backend="{}" data-value="{}" data-{}="{}">"#,
            escape(&b.name),
            data(Some(*value)),
            how.reference,
            data(*reference)
        );
        let bar = |out: &mut String, v: f64, inset: f64, fill: &str| {
            let _ = write!(
                out,
                r#"<rect x="{LABEL}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}"/>"#,
                y + inset,
                axis.x(v) - LABEL,
                ROW - 2.0 * inset
            );
        };
        match reference {
            Some(r) if how.as_bar => {
                bar(&mut out, *r, 3.0, "#ccc");
                bar(&mut out, *value, 8.0, how.colour);
            }
            Some(r) => {
                bar(&mut out, *value, 6.0, how.colour);
                let x = axis.x(*r);
                let _ = write!(
                    out,
                    r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#222" stroke-width="2"/>"##,
                    y + 2.0,
                    y + ROW - 2.0
                );
            }
            None => bar(&mut out, *value, 6.0, how.colour),
        }
        let share = reference.map_or_else(String::new, |r| (how.share)(*value, r));
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{}{}</text></g>"#,
            axis.x(value.max(reference.unwrap_or(0.0))) + 4.0,
            y + ROW / 2.0 + 4.0,
            short(*value),
            escape(&share)
        );
    }
    out.push_str("</svg>");
    out
}

/// Fairness: each contending client's acquisitions as a dot, relative to the busiest client
/// (1.0); a fair backend's dots sit together at the right.
pub(crate) fn fairness(rows: &[&BackendReport]) -> String {
    let axis = Axis {
        lo: 0.0,
        hi: 1.0,
        log: false,
    };
    let mut out = String::new();
    frame(
        "Fairness: acquisitions per contending client",
        "share of the busiest client's count (min/max at the right)",
        &axis,
        rows,
        &mut out,
    );
    for (i, b) in rows.iter().enumerate() {
        let Some(c) = b.bench.contended.as_ref().filter(|c| c.per_client_max > 0) else {
            missing(&mut out, b, i, &["min", "max", "fairness"]);
            continue;
        };
        let mid = TOP + ROW * i as f64 + ROW / 2.0;
        let _ = write!(
            out,
            r#"<g class="mark" data-backend="{}" data-min="{}" data-max="{}" data-fairness="{}">"#,
            escape(&b.name),
            c.per_client_min,
            c.per_client_max,
            c.fairness
        );
        for n in &c.per_client {
            let _ = write!(
                out,
                r##"<circle cx="{:.1}" cy="{mid:.1}" r="4" fill="#c46a2b" fill-opacity="0.6"/>"##,
                axis.x(*n as f64 / c.per_client_max as f64)
            );
        }
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{:.2}</text></g>"#,
            axis.x(1.0) + 10.0,
            mid + 4.0,
            c.fairness
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_rounds_up_to_one_two_or_five() {
        assert_eq!(nice(0.9), 1.0);
        assert_eq!(nice(1.5), 2.0);
        assert_eq!(nice(3100.0), 5000.0);
        assert_eq!(nice(7000.0), 10000.0);
    }

    #[test]
    fn a_log_axis_spans_whole_decades_and_keeps_order() {
        let axis = Axis::log(230.0, 4100.0);
        assert_eq!((axis.lo, axis.hi), (100.0, 10000.0));
        assert!(axis.x(230.0) < axis.x(4100.0));
        assert_eq!(axis.ticks(), vec![100.0, 1000.0, 10000.0]);
    }

    #[test]
    fn an_axis_without_figures_still_has_a_few_ticks() {
        // The latency chart of a report whose backends have no benchmark: no minimum.
        let axis = Axis::log(f64::INFINITY, 0.0);
        assert_eq!(axis.ticks().len(), 4);
        assert_eq!(Axis::linear(0.0).ticks(), vec![0.0, 0.5, 1.0, 1.5, 2.0]);
    }

    #[test]
    fn linear_ticks_fall_on_round_numbers() {
        assert_eq!(
            Axis::linear(4400.0).ticks(),
            vec![0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
        );
        assert_eq!(
            Axis::linear(1500.0).ticks(),
            vec![0.0, 500.0, 1000.0, 1500.0, 2000.0]
        );
        assert_eq!(short(0.0), "0");
        assert_eq!(short(1500.0), "1.5k");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape(r#"<a & "b">"#), "&lt;a &amp; &quot;b&quot;&gt;");
    }
}
