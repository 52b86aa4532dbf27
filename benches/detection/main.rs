//! Detection quality: how many failed requests reach callers, how fast a bad endpoint is taken
//! out, how often a healthy one is taken out by noise, how much goodput the balancer keeps.
//!
//! Simulated endpoints sit behind a per-endpoint `Timeout`, the real `OutlierDetectionLayer` and
//! the real `tower::balance::p2c::Balance`, on tokio's paused clock with seeded randomness, so
//! every number below is reproducible to the request. Prints one markdown table per scenario, the
//! fairness check, and writes the incident picture (`benches/detection/incident.svg`).
//!
//! ```sh
//! cargo bench -p tower-outlier-benches --bench detection
//! ```

mod plot;
mod sim;

use std::fmt::Write as _;
use std::time::Duration;

use futures::TryStreamExt;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PeakEwmaDiscover};
use tower::timeout::Timeout;
use tower_layer::Layer;
use tower_outlier::detectors::DetectorBuilder;
use tower_outlier::finagle::finagle_seeded;
use tower_outlier::latency::{LatencyConfig, LatencyPolicy};
use tower_outlier::probe::{request_probe, Probe, ProbeCadence};
use tower_outlier::slow_call::{BreakerConfig, SlowCallPolicy};
use tower_outlier::weight::{WeightConfig, WeightPolicy};
use tower_outlier::{
    DetectorConfig, DetectorPolicy, ErrorRateConfig, ErrorRatePolicy, NetworkErrors,
    OutlierDetectionLayer, SlowStart, WhenAllOut,
};

use sim::{Backend, Event, Fault, Log, Request, Scenario, Schedule, World, BIN};

const SEED: u64 = 0x5EED_0F0D_7EC7;
/// When the fault starts in every scenario (seconds): the fleet has a measured history by then.
const FAULT_AT: f64 = 10.0;
const NORMAL_RATE: f64 = 200.0;
const LOW_RATE: f64 = 5.0;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Config {
    /// What a user would otherwise pick: tower's peak-EWMA load and p2c, no detection.
    Baseline,
    Edas,
    /// The EDAS preset with an active probe instead of passive trials.
    EdasProbe,
    Hsf,
    Sentinel,
    Sofa,
    All,
    /// Envoy's defaults: consecutive 5xx 5, success rate, at most 10 % ejected.
    Envoy,
    /// Envoy's defaults but `max_ejection_percent` 50, what a small fleet would deploy: 10 % of
    /// five endpoints is no ejection at all under Envoy's rule.
    EnvoyMax50,
    /// gRPC's (A50) defaults: success rate only, at most 10 % ejected (checked before each
    /// ejection, so one of five may go).
    Grpc,
    /// linkerd's defaults: 7 consecutive failures, back-off from 1 s to 60 s, one probe request.
    Linkerd,
    /// linkerd's defaults failing fast when the rules would leave no endpoint, as linkerd does
    /// (the preset keeps the last).
    LinkerdFailFast,
    /// `DetectorConfig::recommended()` with an active probe, as the README recommends.
    Recommended,
    /// `DetectorConfig::recommended()` recovering by probation (one real request) instead.
    RecommendedPassive,
    /// `DetectorConfig::recommended()` with an active probe and a 10 s slow start.
    RecommendedSlowStart,
    /// `DetectorConfig::recommended()` with an active probe and D2's relative latency rule as D2
    /// states it (means, against the call-weighted mean).
    RecommendedLatency,
    /// `DetectorConfig::recommended()` with an active probe and the latency rule's own
    /// recommendation (`LatencyConfig::recommended()`).
    RecommendedOwnLatency,
    /// `DetectorConfig::recommended()` with an active probe and the recommended latency rule,
    /// down-weighting rather than ejecting.
    RecommendedLatencyWeighted,
    /// Finagle's default failure accrual: a success rate below 0.8 over 30 s OR 5 consecutive
    /// failures, equal-jitter back-off from 5 s; back by passive trial (Finagle's one probe
    /// request).
    Finagle,
}

const CONFIGS: [Config; 19] = [
    Config::Baseline,
    Config::Edas,
    Config::EdasProbe,
    Config::Hsf,
    Config::Sentinel,
    Config::Sofa,
    Config::All,
    Config::Envoy,
    Config::EnvoyMax50,
    Config::Grpc,
    Config::Linkerd,
    Config::LinkerdFailFast,
    Config::Recommended,
    Config::RecommendedPassive,
    Config::RecommendedSlowStart,
    Config::RecommendedLatency,
    Config::RecommendedOwnLatency,
    Config::RecommendedLatencyWeighted,
    Config::Finagle,
];

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Baseline => "no detection (PeakEwma + p2c)",
            Config::Edas => "EDAS preset",
            Config::EdasProbe => "EDAS preset + active probe",
            Config::Hsf => "HSF preset",
            Config::Sentinel => "Sentinel slow-call",
            Config::Sofa => "SOFA weights",
            Config::All => "EDAS + Sentinel + SOFA",
            Config::Envoy => "Envoy preset",
            Config::EnvoyMax50 => "Envoy preset, max_ejection_percent 50",
            Config::Grpc => "gRPC preset",
            Config::Linkerd => "linkerd preset",
            Config::LinkerdFailFast => "linkerd preset, failing fast as linkerd does",
            Config::Recommended => "recommended + active probe",
            Config::RecommendedPassive => "recommended, passive",
            Config::RecommendedSlowStart => "recommended + active probe + slow start 10 s",
            Config::RecommendedLatency => "recommended + active probe + D2 latency",
            Config::RecommendedOwnLatency => "recommended + active probe + latency (recommended)",
            Config::RecommendedLatencyWeighted => {
                "recommended + active probe + latency (recommended), down-weighting"
            }
            Config::Finagle => "Finagle preset (success rate or 5 in a row)",
        }
    }

    fn layer(self) -> Option<OutlierDetectionLayer> {
        let edas = || ErrorRatePolicy::new(ErrorRateConfig::edas_spring_cloud().build().unwrap());
        // Slow is five times the fleet's mean latency; Sentinel's defaults otherwise (ratio 1.0,
        // 5 requests in a 1 s interval), open for 10 s.
        let sentinel = || {
            SlowCallPolicy::new(
                BreakerConfig::slow_ratio(Duration::from_millis(50))
                    .open_duration(Duration::from_secs(10))
                    .build()
                    .unwrap(),
            )
        };
        let sofa = || WeightPolicy::new(WeightConfig::sofarpc().build().unwrap());
        // The presets' defaults; the seed makes enforcement and jitter draws repeat.
        let detectors = |config: DetectorBuilder| {
            OutlierDetectionLayer::new(DetectorPolicy::seeded(config.build().unwrap(), SEED))
        };
        Some(match self {
            Config::Baseline => return None,
            Config::Edas | Config::EdasProbe => OutlierDetectionLayer::new(edas()),
            Config::Hsf => OutlierDetectionLayer::new(ErrorRatePolicy::new(
                ErrorRateConfig::hsf().build().unwrap(),
            )),
            Config::Sentinel => OutlierDetectionLayer::new(sentinel()),
            Config::Sofa => OutlierDetectionLayer::new(sofa()),
            Config::All => OutlierDetectionLayer::new(edas())
                .with_policy(sentinel())
                .with_policy(sofa()),
            Config::Envoy => detectors(DetectorConfig::envoy()),
            Config::EnvoyMax50 => detectors(DetectorConfig::envoy().max_ejection_percent(50)),
            Config::Grpc => detectors(DetectorConfig::grpc()),
            Config::Linkerd => detectors(DetectorConfig::linkerd()),
            Config::LinkerdFailFast => {
                detectors(DetectorConfig::linkerd()).when_all_out(WhenAllOut::FailFast)
            }
            Config::Recommended | Config::RecommendedPassive => {
                detectors(DetectorConfig::recommended())
            }
            Config::RecommendedSlowStart => detectors(DetectorConfig::recommended())
                .slow_start(SlowStart::new(Duration::from_secs(10)).build().unwrap()),
            Config::RecommendedLatency => detectors(DetectorConfig::recommended())
                .with_policy(LatencyPolicy::new(LatencyConfig::d2().build().unwrap())),
            Config::RecommendedOwnLatency => detectors(DetectorConfig::recommended()).with_policy(
                LatencyPolicy::new(LatencyConfig::recommended().build().unwrap()),
            ),
            Config::RecommendedLatencyWeighted => detectors(DetectorConfig::recommended())
                .with_policy(LatencyPolicy::new(
                    LatencyConfig::recommended()
                        .down_weight(true)
                        .build()
                        .unwrap(),
                )),
            Config::Finagle => OutlierDetectionLayer::new(finagle_seeded(SEED)),
        })
    }
}

fn scenario(name: &'static str, bad: &[usize], fault: Fault) -> Scenario {
    Scenario {
        name,
        endpoints: 5,
        rate: NORMAL_RATE,
        duration: 130.0,
        bad: bad.to_vec(),
        fault,
        schedule: Schedule::Window {
            start: FAULT_AT,
            end: None,
        },
        noise: 0.0,
        latency: Duration::from_millis(10),
        one_slow_call: None,
        warm_up: 0.0,
        tail: 0.0,
    }
}

fn scenarios() -> Vec<Scenario> {
    let low = |name, fault| Scenario {
        rate: LOW_RATE,
        ..scenario(name, &[0], fault)
    };
    vec![
        scenario("hard down", &[0], Fault::Down),
        scenario("black hole", &[0], Fault::BlackHole),
        scenario("gray failure 10 %", &[0], Fault::Gray(0.1)),
        scenario("gray failure 30 %", &[0], Fault::Gray(0.3)),
        scenario("slow (10× latency)", &[0], Fault::Slow(10.0)),
        // Latency outliers with no errors, and what must not be judged one.
        scenario("slow (3× latency)", &[0], Fault::Slow(3.0)),
        scenario(
            "GC pauses (200 ms every 5 s)",
            &[0],
            Fault::Pauses {
                every: 5.0,
                pause: 0.2,
            },
        ),
        scenario(
            "whole fleet 3× slower together",
            &[0, 1, 2, 3, 4],
            Fault::Slow(3.0),
        ),
        Scenario {
            tail: 0.05,
            ..scenario(
                "latency tail (5 % of calls 10× slower everywhere)",
                &[],
                Fault::Down,
            )
        },
        Scenario {
            schedule: Schedule::Flapping {
                start: FAULT_AT,
                down: 5.0,
                up: 5.0,
            },
            ..scenario("flapping (down 5 s, up 5 s)", &[0], Fault::Down)
        },
        // Recovery units of 30 s and 60 s are multiples of the 10 s period above, so every check
        // lands in a down phase; a 13 s period lets some land in an up phase.
        Scenario {
            schedule: Schedule::Flapping {
                start: FAULT_AT,
                down: 7.0,
                up: 6.0,
            },
            ..scenario("flapping (down 7 s, up 6 s)", &[0], Fault::Down)
        },
        Scenario {
            schedule: Schedule::Window {
                start: FAULT_AT,
                end: Some(FAULT_AT + 20.0),
            },
            ..scenario("recovery (down 20 s, then healthy)", &[0], Fault::Down)
        },
        Scenario {
            schedule: Schedule::Window {
                start: FAULT_AT,
                end: Some(FAULT_AT + 20.0),
            },
            ..scenario(
                "recovery from a black hole (20 s, then healthy)",
                &[0],
                Fault::BlackHole,
            )
        },
        // A server back from an outage that is not warm yet: its failures fall from all to
        // none over 20 s. What a slow start is for.
        Scenario {
            schedule: Schedule::Window {
                start: FAULT_AT,
                end: Some(FAULT_AT + 20.0),
            },
            warm_up: 20.0,
            ..scenario(
                "recovery while warming up (down 20 s, then failing 100 % → 0 % over 20 s)",
                &[0],
                Fault::Down,
            )
        },
        scenario("two of five down", &[0, 1], Fault::Down),
        // Every endpoint down at once (a bad deploy, a shared dependency), then healed: what
        // each layer does when its rules would leave no endpoint (`WhenAllOut`).
        Scenario {
            schedule: Schedule::Window {
                start: FAULT_AT,
                end: Some(FAULT_AT + 20.0),
            },
            ..scenario(
                "whole fleet down 20 s, then healthy",
                &[0, 1, 2, 3, 4],
                Fault::Down,
            )
        },
        // Every endpoint down 5 s in 10 at once (a shared dependency flapping): whether failing
        // fast when the rules would leave none costs callers more than no detection.
        Scenario {
            schedule: Schedule::Flapping {
                start: FAULT_AT,
                down: 5.0,
                up: 5.0,
            },
            ..scenario(
                "whole fleet flapping together (down 5 s, up 5 s)",
                &[0, 1, 2, 3, 4],
                Fault::Down,
            )
        },
        scenario("two of five black holes", &[0, 1], Fault::BlackHole),
        Scenario {
            noise: 0.01,
            ..scenario("healthy noise (1 % failures everywhere)", &[], Fault::Down)
        },
        low("low traffic (5 req/s): hard down", Fault::Down),
        low("low traffic (5 req/s): black hole", Fault::BlackHole),
        Scenario {
            rate: LOW_RATE,
            ..scenario(
                "low traffic (5 req/s): two of five black holes",
                &[0, 1],
                Fault::BlackHole,
            )
        },
        // Few calls per window: a rule that judges on a handful of calls meets noise here.
        Scenario {
            rate: LOW_RATE,
            noise: 0.02,
            ..scenario(
                "low traffic (5 req/s): healthy noise (2 % failures everywhere)",
                &[],
                Fault::Down,
            )
        },
        // Slow 20 s, then healed: p2c never picks the costliest endpoint, so how soon a healed
        // slow endpoint is fed again is up to its latency estimate, at high traffic and at low.
        Scenario {
            schedule: Schedule::Window {
                start: FAULT_AT,
                end: Some(FAULT_AT + 20.0),
            },
            ..scenario(
                "recovery from slow (10× latency 20 s, then healthy)",
                &[0],
                Fault::Slow(10.0),
            )
        },
        Scenario {
            schedule: Schedule::Window {
                start: FAULT_AT,
                end: Some(FAULT_AT + 20.0),
            },
            ..low(
                "low traffic (5 req/s): recovery from slow (10× latency 20 s, then healthy)",
                Fault::Slow(10.0),
            )
        },
    ]
}

/// Runs one scenario under one configuration on a fresh paused runtime. With `watch`, passed
/// trials are logged too (from the monitor, sampled every 100 ms).
fn run(scenario: &Scenario, config: Config, watch: bool) -> Log {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let world = World::new(scenario.clone(), SEED);
        let services = (0..scenario.endpoints).map(|id| {
            Timeout::new(
                Backend {
                    id,
                    world: world.clone(),
                },
                sim::TIMEOUT,
            )
        });
        let discover = ServiceList::new(services.collect::<Vec<_>>());
        match config.layer() {
            None => {
                let discover = PeakEwmaDiscover::new(
                    discover,
                    scenario.latency,
                    Duration::from_secs(10),
                    CompleteOnResponse::default(),
                );
                sim::drive(
                    world.clone(),
                    Balance::from_rng(discover, sim::Rng::new(!SEED)),
                )
                .await;
            }
            Some(layer)
                if matches!(
                    config,
                    Config::EdasProbe
                        | Config::Recommended
                        | Config::RecommendedSlowStart
                        | Config::RecommendedLatency
                        | Config::RecommendedOwnLatency
                        | Config::RecommendedLatencyWeighted
                ) =>
            {
                // The check is one request of the caller's kind, sent through a clone of the
                // ejected endpoint's service; no caller's request is risked on it.
                // The checks' jitter drawn from the run's seed, as every other draw.
                let layer = layer
                    .probe(request_probe(Request::probe, NetworkErrors))
                    .probe_cadence(ProbeCadence::new().seed(SEED));
                detect(&world, layer, discover, watch).await;
            }
            Some(layer) => detect(&world, layer, discover, watch).await,
        }
        std::sync::Arc::try_unwrap(world)
            .ok()
            .expect("the world outlives every endpoint")
            .log
            .into_inner()
            .unwrap()
    })
}

/// Drives the scenario through `layer` and p2c, logging the balancer's set as it changes.
async fn detect<P>(
    world: &std::sync::Arc<World>,
    layer: OutlierDetectionLayer<NetworkErrors, P>,
    discover: ServiceList<Vec<Timeout<Backend>>>,
    watch: bool,
) where
    P: Probe<usize, Timeout<Backend>> + Clone,
{
    let watcher = watch.then(|| tokio::spawn(sim::watch_trials(world.clone(), layer.monitor())));
    let mut seen = vec![false; world.scenario.endpoints];
    let observer = world.clone();
    let detected = layer
        .layer(discover)
        .inspect_ok(move |change| observer.observe_change(change, &mut seen));
    // A layer whose rules may empty the set (linkerd's, gRPC's fail fast) fails calls at once
    // then, as those systems do; the guard does nothing while the balancer has an endpoint.
    let guarded = layer
        .fail_fast()
        .layer(Balance::from_rng(detected, sim::Rng::new(!SEED)));
    sim::drive(world.clone(), guarded).await;
    if let Some(watcher) = watcher {
        watcher.abort();
        let _ = watcher.await;
    }
}

/// One row of the table.
struct Row {
    failed: u64,
    failed_from_bad: u64,
    failed_before_ejection: String,
    time_to_eject: String,
    false_ejections: usize,
    false_out_secs: f64,
    goodput: f64,
    shares: String,
    back_after: String,
    p99_ms: f64,
}

fn measure(scenario: &Scenario, log: &Log) -> Row {
    let end = scenario.duration;
    let start = scenario.schedule.start();
    let mut time_to_eject = Vec::new();
    for &bad in &scenario.bad {
        let first = log
            .events
            .iter()
            .find(|&&(t, i, event)| event == Event::Ejected && i == bad && t >= start)
            .map(|&(t, ..)| t - start);
        time_to_eject.push(first);
    }
    // Failed requests that were sent to a bad endpoint before the first ejection of any bad
    // endpoint: what detecting it cost.
    let first_ejection = time_to_eject
        .iter()
        .flatten()
        .fold(f64::INFINITY, |a, &b| a.min(b));
    let failed_before_ejection = if first_ejection.is_finite() {
        let before = log
            .bad_failures_sent_at
            .iter()
            .filter(|&&sent| sent <= start + first_ejection)
            .count();
        before.to_string()
    } else {
        "—".to_string()
    };
    let time_to_eject = if scenario.bad.is_empty() {
        "—".to_string()
    } else if time_to_eject.iter().all(Option::is_some) {
        let worst = time_to_eject
            .iter()
            .flatten()
            .fold(0.0f64, |a, &b| a.max(b));
        format!("{worst:.2} s")
    } else {
        let ejected = time_to_eject.iter().flatten().count();
        format!("never ({ejected}/{} ejected)", scenario.bad.len())
    };
    let mut false_ejections = 0;
    let mut false_out_secs = 0.0;
    let mut out_since: Vec<Option<f64>> = vec![None; scenario.endpoints];
    for &(t, i, event) in &log.events {
        if scenario.is_bad(i) {
            continue;
        }
        match event {
            Event::Ejected => {
                false_ejections += 1;
                out_since[i] = Some(t);
            }
            Event::Readmitted => {
                if let Some(since) = out_since[i].take() {
                    false_out_secs += t - since;
                }
            }
            Event::Recovered => {}
        }
    }
    false_out_secs += out_since
        .iter()
        .flatten()
        .map(|since| end - since)
        .sum::<f64>();
    let total: usize = log.calls.iter().sum();
    let scheduled = (scenario.rate * scenario.duration) as u64;
    let shares = log
        .calls
        .iter()
        .map(|&c| format!("{:.1}", 100.0 * c as f64 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(" / ");
    // Half its share back: the first second after the fault ended in which the first bad
    // endpoint got at least half of a fair share of the calls sent in it.
    let back_after = match scenario.schedule {
        Schedule::Window { end: Some(end), .. } if !scenario.bad.is_empty() => {
            let bad = scenario.bad[0];
            let first = (end / BIN) as usize;
            (first..log.bins[bad].len())
                .find(|&bin| {
                    let all: u32 = log.bins.iter().map(|b| b[bin]).sum();
                    all > 0
                        && f64::from(log.bins[bad][bin])
                            >= 0.5 * f64::from(all) / scenario.endpoints as f64
                })
                .map_or_else(
                    || "never".to_string(),
                    |bin| format!("{:.0} s", (bin + 1) as f64 * BIN - end),
                )
        }
        _ => "—".to_string(),
    };
    let mut latencies = log.latencies.clone();
    latencies.sort_by(f64::total_cmp);
    let p99_ms = latencies
        .get((latencies.len().saturating_sub(1) as f64 * 0.99).round() as usize)
        .map_or(0.0, |l| l * 1e3);
    Row {
        failed: log.failed,
        failed_from_bad: log.failed_from_bad,
        failed_before_ejection,
        time_to_eject,
        false_ejections,
        false_out_secs,
        goodput: 100.0 * log.succeeded as f64 / scheduled as f64,
        shares,
        back_after,
        p99_ms,
    }
}

fn table(scenario: &Scenario, out: &mut String) {
    let bad = if scenario.bad.is_empty() {
        "none".to_string()
    } else {
        scenario
            .bad
            .iter()
            .map(|b| format!("#{b}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "\n### {} — {} endpoints, {} req/s, {} s, fault from {} s on {bad}\n",
        scenario.name, scenario.endpoints, scenario.rate, scenario.duration, FAULT_AT
    );
    let _ = writeln!(
        out,
        "| configuration | failed to callers | of them from bad | sent before 1st ejection | time to eject | false ejections (time out) | goodput | callers' p99 | half share back after heal | share per endpoint (%) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut baseline_failed = None;
    for config in CONFIGS {
        let log = run(scenario, config, false);
        let row = measure(scenario, &log);
        let change = match baseline_failed {
            None => {
                baseline_failed = Some(row.failed);
                String::new()
            }
            Some(0) => String::new(),
            Some(base) => format!(
                " ({:+.0} %)",
                100.0 * (row.failed as f64 - base as f64) / base as f64
            ),
        };
        let (time_to_eject, failed_before_ejection) = if config == Config::Baseline {
            ("—".to_string(), "—".to_string())
        } else {
            (row.time_to_eject, row.failed_before_ejection)
        };
        let _ = writeln!(
            out,
            "| {} | {}{change} | {} | {} | {} | {} ({:.0} s) | {:.2} % | {:.1} ms | {} | {} |",
            config.name(),
            row.failed,
            row.failed_from_bad,
            failed_before_ejection,
            time_to_eject,
            row.false_ejections,
            row.false_out_secs,
            row.goodput,
            row.p99_ms,
            row.back_after,
            row.shares
        );
    }
}

fn fairness(out: &mut String) {
    let scenario = Scenario {
        name: "fairness",
        endpoints: 10,
        rate: 1000.0,
        duration: 100.0,
        bad: vec![],
        fault: Fault::Down,
        schedule: Schedule::Window {
            start: f64::INFINITY,
            end: None,
        },
        noise: 0.0,
        latency: Duration::from_millis(1),
        one_slow_call: Some(3),
        warm_up: 0.0,
        tail: 0.0,
    };
    let _ = writeln!(
        out,
        "\n### Fairness — 10 identical endpoints (1 ms), 100 000 requests at 1 000 req/s; endpoint #0's 3rd call takes 1 s\n"
    );
    let _ = writeln!(
        out,
        "| configuration | calls to #0 | fewest of the others | most | #0 ÷ fair share |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    for config in CONFIGS {
        let log = run(&scenario, config, false);
        let total: usize = log.calls.iter().sum();
        let fair = total as f64 / scenario.endpoints as f64;
        let others = &log.calls[1..];
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.2} |",
            config.name(),
            log.calls[0],
            others.iter().min().unwrap(),
            others.iter().max().unwrap(),
            log.calls[0] as f64 / fair
        );
    }
}

fn main() {
    let started = std::time::Instant::now();
    let mut results = String::new();
    for scenario in scenarios() {
        let mut out = String::new();
        table(&scenario, &mut out);
        print!("{out}");
        results.push_str(&out);
    }
    let mut out = String::new();
    fairness(&mut out);
    print!("{out}");
    results.push_str(&out);
    // Committed beside the picture: CI runs the benchmark and checks both are what it produces.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/detection/results.md");
    std::fs::write(path, results.trim_start()).expect("the results are written");
    println!("\nwrote {path}");

    let incident = plot::incident_scenario();
    let log = run(&incident, Config::Recommended, true);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/detection/incident.svg");
    plot::draw(&incident, &log, path).expect("the picture is written");
    println!("\nwrote {path}");
    println!("ran in {:.1} s", started.elapsed().as_secs_f64());
}
