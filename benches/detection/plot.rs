//! The incident picture: each endpoint's share of the requests over time, through one fault,
//! its ejection, a failed recovery check, and the re-admission that sticks.

use std::time::Duration;

use plotters::prelude::*;

use crate::sim::{Event, Fault, Log, Scenario, Schedule, BIN};

/// Endpoint #0 refuses connections from 10 s to 60 s; the recommended configuration ejects it at
/// its third failure, probes it every 1 to 5 s while it is down (no caller's request), and
/// re-admits it at the first probe after it healed.
pub fn incident_scenario() -> Scenario {
    Scenario {
        name: "incident",
        endpoints: 5,
        rate: 200.0,
        duration: 150.0,
        bad: vec![0],
        fault: Fault::Down,
        schedule: Schedule::Window {
            start: 10.0,
            end: Some(60.0),
        },
        noise: 0.0,
        latency: Duration::from_millis(10),
        one_slow_call: None,
        warm_up: 0.0,
        tail: 0.0,
    }
}

pub fn draw(scenario: &Scenario, log: &Log, path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Share of requests per endpoint, recommended + active probe: #0 refuses connections from 10 s to 60 s",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..scenario.duration, 0f64..50f64)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("share of requests (%), 1 s bins")
        .light_line_style(WHITE)
        .draw()?;

    if let Schedule::Window { start, end } = scenario.schedule {
        let end = end.unwrap_or(scenario.duration);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(start, 0.0), (end, 50.0)],
            RGBColor(220, 40, 40).mix(0.08).filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            "fault: #0 refuses connections",
            (start + 1.0, 2.5),
            ("sans-serif", 13).into_font().color(&RGBColor(160, 30, 30)),
        )))?;
    }

    let bins = log.bins[0].len().min((scenario.duration / BIN) as usize);
    for endpoint in 0..scenario.endpoints {
        let color = Palette99::pick(endpoint).to_rgba();
        let points = (0..bins).map(|bin| {
            let total: u32 = log.bins.iter().map(|b| b[bin]).sum();
            let share = 100.0 * f64::from(log.bins[endpoint][bin]) / f64::from(total.max(1));
            ((bin as f64 + 0.5) * BIN, share)
        });
        let width = if scenario.is_bad(endpoint) { 3 } else { 1 };
        let label = if scenario.is_bad(endpoint) {
            format!("endpoint #{endpoint} (faulty)")
        } else {
            format!("endpoint #{endpoint}")
        };
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(width)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
    }

    let mut labels = Vec::new();
    let mut ejections = 0;
    for &(t, endpoint, event) in &log.events {
        if !scenario.is_bad(endpoint) {
            continue;
        }
        let text = match event {
            Event::Ejected => {
                ejections += 1;
                if ejections == 1 {
                    "ejected"
                } else {
                    "trial failed: ejected again"
                }
            }
            Event::Readmitted => "recovery check: re-admitted on trial",
            Event::Recovered => "trial passed: recovered",
        };
        labels.push((t, text, event == Event::Ejected));
    }
    for (i, &(t, text, ejected)) in labels.iter().enumerate() {
        let color = if ejected { RED } else { RGBColor(30, 120, 30) };
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(t, 0.0), (t, 50.0)],
            color.stroke_width(1),
        )))?;
        let y = 47.0 - 3.0 * (i % 3) as f64;
        chart.draw_series(std::iter::once(Text::new(
            format!("{t:.1} s {text}"),
            (t + 1.0, y),
            ("sans-serif", 13).into_font().color(&color),
        )))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
