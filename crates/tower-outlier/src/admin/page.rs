//! The admin page: one row per endpoint with its status, since when it is out, its next check and
//! why, and a timeline of the last minutes — its error rate and its share of the traffic, with the
//! spans it spent out of rotation drawn behind them. Rendered on the server (the picture needs
//! no script); the page reloads itself.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use super::history::{History, Sample};
use crate::monitor::{EndpointStatus, Snapshot};

/// The timeline's size, in CSS pixels.
const WIDTH: f64 = 480.0;
const HEIGHT: f64 = 40.0;

/// The fill of a span out of rotation: opaque, so that a screenshot can find it.
pub(crate) const SPAN_FILL: &str = "#f4a6a6";
const ERROR_STROKE: &str = "#b2182b";
const SHARE_STROKE: &str = "#2166ac";

pub(super) fn render(
    snapshot: &Snapshot,
    history: &History,
    now: SystemTime,
    refresh: u64,
) -> String {
    let limits = history.limits();
    let span = limits.every * limits.ticks as u32;
    let mut html = String::with_capacity(4096 + snapshot.endpoints.len() * 2048);
    let _ = write!(
        html,
        concat!(
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
            "<meta http-equiv=\"refresh\" content=\"{refresh}\">\n",
            "<title>Outlier detection</title>\n<style>\n",
            "body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}\n",
            "table {{ border-collapse: collapse; }}\n",
            "th, td {{ border-bottom: 1px solid #ddd; padding: .3em .6em; text-align: left; vertical-align: middle; }}\n",
            "td.num {{ text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }}\n",
            "tr.out td.status {{ color: #b00; font-weight: bold; }}\n",
            "tr.trial td.status, tr.unready td.status {{ color: #a60; }}\n",
            "svg.timeline {{ background: #fff; border: 1px solid #ccc; display: block; }}\n",
            ".legend span {{ display: inline-block; width: 1em; height: .7em; margin: 0 .3em 0 1em; }}\n",
            "</style>\n</head>\n<body>\n<h1>Outlier detection</h1>\n"
        ),
        refresh = refresh,
    );
    let _ = writeln!(
        html,
        "<p>{} endpoints, {} out of rotation. Rules version {}{}.{}{}</p>",
        snapshot.endpoints.len(),
        snapshot.ejected(),
        snapshot.rules_version,
        if snapshot.dry_run {
            " <strong>Dry run: nothing is ejected; the status column says what would be.</strong>"
                .to_owned()
        } else if !snapshot.dry_run_policies.is_empty() {
            format!(
                " Dry run for {}.",
                escape(&snapshot.dry_run_policies.join(", "))
            )
        } else {
            String::new()
        },
        snapshot
            .rules_error
            .as_deref()
            .map(|e| format!("; {}", escape(e)))
            .unwrap_or_default(),
        if history.untracked > 0 {
            format!(
                " {} endpoints beyond the first {} have no timeline.",
                history.untracked,
                history.keys.len()
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        html,
        "<p class=\"legend\">The last {}:<span style=\"background:{SPAN_FILL}\"></span>out of \
         rotation<span style=\"background:{ERROR_STROKE}\"></span>error rate\
         <span style=\"background:{SHARE_STROKE}\"></span>share of the traffic</p>",
        minutes(span)
    );
    html.push_str(concat!(
        "<table>\n<thead><tr><th>endpoint</th><th>status</th><th>since</th><th>next check</th>",
        "<th>judged on</th><th>share</th><th>timeline</th><th>reason</th></tr></thead>\n<tbody>\n",
    ));
    let total_calls: u64 = snapshot
        .endpoints
        .iter()
        .map(|e| e.windows.first().map_or(0, |w| w.counts.calls))
        .sum();
    // The endpoints that need attention first, then the others, up to the timeline's limit.
    let mut shown: Vec<&crate::EndpointSnapshot> = snapshot.endpoints.iter().collect();
    shown.sort_by_key(|e| {
        e.status == EndpointStatus::Available && e.would_be.is_none() && e.forced.is_none()
    });
    let hidden = shown.len().saturating_sub(limits.endpoints);
    shown.truncate(limits.endpoints);
    let grid = Grid::new(history);
    for endpoint in shown {
        let key = endpoint.key.as_str();
        let class = match endpoint.status {
            EndpointStatus::Available => "in",
            EndpointStatus::Trial => "trial",
            EndpointStatus::Unready => "unready",
            _ => "out",
        };
        let since = history
            .ejected_since
            .get(key)
            .filter(|_| !endpoint.status.is_available())
            .map_or_else(
                || "-".to_owned(),
                |at| format!("{} ago", ago(now.duration_since(*at).unwrap_or_default())),
            );
        let next = endpoint.next_check_in.map_or_else(
            || "-".to_owned(),
            |d| format!("in {:.1} s", d.as_secs_f64()),
        );
        let calls = endpoint.windows.first().map_or(0, |w| w.counts.calls);
        // What the first policy compares with its threshold: a streak where it judges one (the
        // window's failure rate read "1.0 %" for an endpoint that had failed its last three
        // calls), else the failure rate.
        let judged = endpoint.windows.first().and_then(|w| w.judged).map_or_else(
            || format!("{:.1} %", endpoint.error_rate * 100.0),
            |judged| escape(&judged.to_string()),
        );
        let share = if total_calls == 0 {
            0.0
        } else {
            calls as f64 / total_calls as f64
        };
        let reason = endpoint
            .last_reason
            .as_ref()
            .map_or_else(|| "-".to_owned(), |r| escape(&format!("{}: {r}", r.policy)));
        // What dry run would do, and an operator's override, beside where it really is.
        let mut status = status_name(endpoint.status).to_owned();
        if let Some(would_be) = endpoint.would_be {
            let _ = write!(status, " (dry run: would be {})", status_name(would_be));
        }
        if let Some(forced) = endpoint.forced {
            let _ = write!(status, " ({forced} by an operator)");
        }
        let _ = write!(
            html,
            "<tr class=\"{class}\" data-endpoint=\"{}\"><td><code>{}</code></td>\
             <td class=\"status\">{}</td><td class=\"num\">{since}</td><td class=\"num\">{next}</td>\
             <td class=\"num\">{judged}</td><td class=\"num\">{:.1} %</td><td>",
            escape(key),
            escape(key),
            status,
            share * 100.0,
        );
        timeline(&mut html, &grid, key, now, span);
        let _ = writeln!(html, "</td><td>{reason}</td></tr>");
    }
    if hidden > 0 {
        let _ = writeln!(
            html,
            "<p>{hidden} more available endpoints not shown; <a href=\"snapshot\">the snapshot</a> has them all.</p>"
        );
    }
    // The links are relative to where the component is mounted: right as they are under a URL
    // ending in `/`, and made so by the script under one that does not (`/outliers`).
    html.push_str(concat!(
        "</tbody>\n</table>\n<p class=\"links\"><a href=\"snapshot\">snapshot (JSON)</a> · ",
        "<a href=\"history\">history (JSON)</a> · <a href=\"events\">events (JSON)</a> · ",
        "<a href=\"events/stream\">events (live)</a> · <a href=\"metrics\">metrics</a></p>\n",
        "<script>if (!location.pathname.endsWith('/')) { for (const a of document.querySelectorAll('p.links a')) ",
        "{ a.href = location.pathname + '/' + a.getAttribute('href'); } }</script>\n",
        "</body>\n</html>\n",
    ));
    html
}

/// The history laid out for drawing: each tick's samples by endpoint, and its total calls, so
/// that a row reads its own samples without searching every tick.
struct Grid<'a> {
    history: &'a History,
    /// `cells[tick][endpoint]`: the sample, if the endpoint was sampled at that tick.
    cells: Vec<Vec<Option<Sample>>>,
    totals: Vec<u64>,
}

impl<'a> Grid<'a> {
    fn new(history: &'a History) -> Self {
        let width = history.keys.len();
        let mut cells = Vec::with_capacity(history.ticks.len());
        let mut totals = Vec::with_capacity(history.ticks.len());
        for tick in &history.ticks {
            let mut row = vec![None; width];
            for sample in &tick.samples {
                if let Some(cell) = row.get_mut(sample.endpoint as usize) {
                    *cell = Some(*sample);
                }
            }
            totals.push(tick.samples.iter().map(|s| u64::from(s.calls)).sum());
            cells.push(row);
        }
        Grid {
            history,
            cells,
            totals,
        }
    }
}

/// One endpoint's timeline: spans out of rotation behind, error rate and share as lines.
fn timeline(html: &mut String, grid: &Grid<'_>, key: &str, now: SystemTime, span: Duration) {
    let _ = write!(
        html,
        "<svg class=\"timeline\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         role=\"img\" aria-label=\"{}\">",
        escape(&format!("timeline of {key}"))
    );
    let Some(index) = grid.history.keys.iter().position(|k| k == key) else {
        html.push_str("</svg>");
        return;
    };
    let start = now.checked_sub(span).unwrap_or(SystemTime::UNIX_EPOCH);
    let x = |at: SystemTime| -> f64 {
        let offset = at.duration_since(start).unwrap_or_default().as_secs_f64();
        (offset / span.as_secs_f64() * WIDTH).clamp(0.0, WIDTH)
    };
    let samples = || {
        grid.history
            .ticks
            .iter()
            .zip(&grid.cells)
            .zip(&grid.totals)
            .filter_map(move |((tick, row), total)| row[index].map(|s| (tick.at, s, *total)))
    };
    // Out-of-rotation spans: runs of ticks with the endpoint out, each drawn to the next tick
    // (the last one to now).
    let mut span_of = |from: SystemTime, to: SystemTime| {
        let (x0, x1) = (x(from), x(to));
        let _ = write!(
            html,
            "<rect class=\"ejection-span\" x=\"{x0:.1}\" y=\"0\" width=\"{:.1}\" height=\"{HEIGHT}\" \
             fill=\"{SPAN_FILL}\"><title>out of rotation for {}</title></rect>",
            (x1 - x0).max(1.0),
            ago(to.duration_since(from).unwrap_or_default())
        );
    };
    let mut run: Option<SystemTime> = None;
    for (tick, row) in grid.history.ticks.iter().zip(&grid.cells) {
        let out = row[index].is_some_and(|s| s.out);
        match (run, out) {
            (None, true) => run = Some(tick.at),
            (Some(from), false) => {
                span_of(from, tick.at);
                run = None;
            }
            _ => {}
        }
    }
    if let Some(from) = run {
        span_of(from, now);
    }
    // Lines: the error rate and the share of the traffic, each 0..1 over the height.
    let y = |v: f64| HEIGHT - 1.0 - v.clamp(0.0, 1.0) * (HEIGHT - 2.0);
    let mut errors = String::new();
    let mut shares = String::new();
    for (at, sample, total) in samples() {
        let share = if total == 0 {
            0.0
        } else {
            f64::from(sample.calls) / total as f64
        };
        let px = x(at);
        let _ = write!(errors, "{px:.1},{:.1} ", y(f64::from(sample.error_rate)));
        let _ = write!(shares, "{px:.1},{:.1} ", y(share));
    }
    for (class, stroke, points) in [
        ("error-rate", ERROR_STROKE, errors),
        ("share", SHARE_STROKE, shares),
    ] {
        if !points.is_empty() {
            let _ = write!(
                html,
                "<polyline class=\"{class}\" fill=\"none\" stroke=\"{stroke}\" stroke-width=\"1.5\" points=\"{}\"/>",
                points.trim_end()
            );
        }
    }
    html.push_str("</svg>");
}

pub(super) fn status_name(status: EndpointStatus) -> &'static str {
    match status {
        EndpointStatus::Available => "available",
        EndpointStatus::Trial => "trial",
        EndpointStatus::Ejected => "ejected",
        EndpointStatus::Probing => "probing",
        EndpointStatus::Unready => "unready",
    }
}

fn ago(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 120 {
        format!("{:.0} s", d.as_secs_f64())
    } else if secs < 7200 {
        format!("{} min", secs / 60)
    } else {
        format!("{} h", secs / 3600)
    }
}

fn minutes(d: Duration) -> String {
    let secs = d.as_secs();
    if secs.is_multiple_of(60) && secs >= 60 {
        format!("{} minutes", secs / 60)
    } else {
        format!("{secs} seconds")
    }
}

/// Escapes text for HTML element content and quoted attribute values.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
