//! Random histories of operator controls, upstream changes, failures, readiness errors, probes,
//! reconfiguration and time, with the invariants checked after each step.

use crate::support;

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use support::{Backend, Harness, SeededRng, Seen};
use tower_outlier::probe::{probe_fn, Probe, ProbeFuture};
use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};

fn policy(rng: &mut SeededRng, strict: bool) -> ErrorRatePolicy {
    let b = ErrorRateConfig::hsf()
        .window(Duration::from_secs(2 + rng.below(4)))
        .min_calls(if strict { 10 } else { 3 + rng.below(4) })
        .error_rate_threshold(if strict { 0.9 } else { 0.5 })
        .recovery_unit(Duration::from_secs(1 + rng.below(8)))
        .max_recovery_multiple(3)
        .max_ejection_ratio(rng.below(11) as f64 / 10.0)
        .enabled(rng.below(6) != 0);
    ErrorRatePolicy::new(b.build().unwrap())
}

#[derive(Default)]
struct Model {
    upstream: BTreeSet<usize>,
    dry: bool,
    dry_policy: [bool; 2],
    forced_out: HashSet<usize>,
    forced_in: HashSet<usize>,
}

fn pickable<P: Probe<usize, Backend> + Clone>(h: &Harness<P>, except: Option<usize>) -> Vec<usize> {
    h.live
        .iter()
        .filter(|(id, e)| {
            Some(**id) != except && !h.backend(**id).is_broken() && !e.record().is_unready()
        })
        .map(|(id, _)| *id)
        .collect::<BTreeSet<usize>>()
        .into_iter()
        .collect()
}

fn poll_sorted<P: Probe<usize, Backend> + Clone>(h: &mut Harness<P>) {
    let mut ids: Vec<usize> = h.live.keys().copied().collect();
    ids.sort();
    for id in ids {
        let (task, live) = (&mut h.task, &mut h.live);
        let endpoint = live.get_mut(&id).unwrap();
        let _ = task.enter(|cx, _| tower::Service::poll_ready(endpoint, cx));
    }
    h.sync();
}

struct Side<P: Probe<usize, Backend> + Clone> {
    rules: tower_outlier::RulesHandle,
    monitor: tower_outlier::Monitor,
    h: Harness<P>,
    m: Model,
    next_id: usize,
    removed: Vec<usize>,
    seen_at: usize,
    model_live: HashSet<usize>,
    log: Vec<String>,
}

impl<P: Probe<usize, Backend> + Clone> Side<P> {
    fn new(layer: &OutlierDetectionLayer<tower_outlier::NetworkErrors, P>) -> Self {
        let h = Harness::new(layer, 4);
        Side {
            rules: layer.rules(),
            monitor: layer.monitor(),
            model_live: h.live.keys().copied().collect(),
            seen_at: h.seen.len(),
            h,
            m: Model {
                upstream: (0..4).collect(),
                ..Model::default()
            },
            next_id: 4,
            removed: Vec::new(),
            log: Vec::new(),
        }
    }

    async fn step(
        &mut self,
        rng: &mut SeededRng,
        seed: u64,
        step: usize,
        name: &str,
    ) -> Result<(), String> {
        let (h, m, rules, _monitor) = (&mut self.h, &mut self.m, &self.rules, &self.monitor);
        let next_id = &mut self.next_id;
        let removed = &mut self.removed;
        let op = rng.below(20);
        let pick = |rng: &mut SeededRng, n: usize| rng.below(n as u64 + 2) as usize;
        let desc;
        match op {
            0 => {
                h.insert(*next_id);
                m.upstream.insert(*next_id);
                desc = format!("insert {next_id}");
                *next_id += 1;
            }
            1 if m.upstream.len() > 1 => {
                let v = *m
                    .upstream
                    .iter()
                    .nth(rng.below(m.upstream.len() as u64) as usize)
                    .unwrap();
                h.remove(v);
                m.upstream.remove(&v);
                removed.push(v);
                desc = format!("remove {v}");
            }
            2 => {
                if let Some(v) = removed.pop() {
                    h.insert(v);
                    m.upstream.insert(v);
                    desc = format!("re-insert {v}");
                } else {
                    let v = *m.upstream.iter().next().unwrap();
                    h.insert(v);
                    desc = format!("replace {v}");
                }
            }
            3..=5 => {
                let live: Vec<usize> = pickable(h, None);
                if live.is_empty() {
                    desc = "no call".into();
                } else {
                    let id = live[rng.below(live.len() as u64) as usize];
                    let n = rng.below(12) as usize;
                    h.calls_while_live(id, n, 0).await;
                    desc = format!("fail {id} x{n}");
                }
            }
            6 | 7 => {
                let live: Vec<usize> = pickable(h, None);
                if live.is_empty() {
                    desc = "no call".into();
                } else {
                    let id = live[rng.below(live.len() as u64) as usize];
                    let n = rng.below(12) as usize;
                    h.calls_while_live(id, 0, n).await;
                    desc = format!("succeed {id} x{n}");
                }
            }
            8 | 9 => {
                let d = Duration::from_millis(rng.below(20_000));
                h.advance(d).await;
                desc = format!("advance {d:?}");
            }
            10 => {
                m.dry = !m.dry;
                rules.set_dry_run(m.dry);
                desc = format!("dry run {}", m.dry);
            }
            11 => {
                let slot = rng.below(2) as usize;
                m.dry_policy[slot] = !m.dry_policy[slot];
                rules.set_policy_dry_run(slot, m.dry_policy[slot]).unwrap();
                desc = format!("policy {slot} dry run {}", m.dry_policy[slot]);
            }
            12 => {
                let k = pick(rng, *next_id);
                rules.force_out(&k);
                m.forced_in.remove(&k);
                m.forced_out.insert(k);
                desc = format!("force_out {k}");
            }
            13 => {
                let k = pick(rng, *next_id);
                rules.force_in(&k);
                m.forced_out.remove(&k);
                m.forced_in.insert(k);
                desc = format!("force_in {k}");
            }
            14 => {
                let k = if rng.below(2) == 0 && !m.forced_out.is_empty() {
                    *m.forced_out.iter().min().unwrap()
                } else {
                    pick(rng, *next_id)
                };
                rules.release(&k);
                m.forced_out.remove(&k);
                m.forced_in.remove(&k);
                desc = format!("release {k}");
            }
            15 => {
                let k = pick(rng, *next_id);
                rules.reset_backoff(&k);
                desc = format!("reset {k}");
            }
            16 => {
                let k = pick(rng, *next_id);
                if h.backends.contains_key(&k) {
                    let b = !h.backend(k).is_broken();
                    h.backend(k).set_broken(b);
                    desc = format!("broken {k} {b}");
                } else {
                    desc = "noop".into();
                }
            }
            17 => {
                let slot = rng.below(2) as usize;
                let p = policy(rng, slot == 1);
                let _ = rules.replace(slot, p);
                desc = format!("replace rules {slot}");
            }
            _ => {
                poll_sorted(h);
                desc = "poll_ready_all".into();
            }
        }
        self.log.push(format!("{name} {step}: {desc}"));
        self.check(seed, step).await
    }

    async fn check(&mut self, seed: u64, step: usize) -> Result<(), String> {
        let (h, m, monitor) = (&mut self.h, &self.m, &self.monitor);
        let log = &self.log;
        h.sync();
        for _ in 0..(m.upstream.len() + 2) {
            poll_sorted(h);
        }
        let ctx = || {
            format!(
                "seed {seed} step {step}; last ops: {:?}",
                &log[log.len().saturating_sub(14)..]
            )
        };
        for (_, s) in &h.seen[self.seen_at..] {
            match s {
                Seen::Insert(k) => {
                    self.model_live.insert(*k);
                }
                Seen::Remove(k) => {
                    if !self.model_live.remove(k) {
                        return Err(format!(
                            "Remove({k}) of an endpoint not in the set; seen tail {:?}; {}",
                            &h.seen[h.seen.len().saturating_sub(12)..]
                                .iter()
                                .map(|(_, s)| s.clone())
                                .collect::<Vec<_>>(),
                            ctx()
                        ));
                    }
                }
            }
        }
        self.seen_at = h.seen.len();
        let ejected = h.adaptor.ejected();
        if h.adaptor.tracked() != m.upstream.len() || monitor.tracked() != m.upstream.len() {
            return Err(format!(
                "tracked {} / {} of {}; {}",
                h.adaptor.tracked(),
                monitor.tracked(),
                m.upstream.len(),
                ctx()
            ));
        }
        for id in h.live_ids() {
            if !m.upstream.contains(&id) {
                return Err(format!("{id} live, not upstream; {}", ctx()));
            }
        }
        if h.live.is_empty() {
            return Err(format!("no endpoint live; {}", ctx()));
        }
        if ejected + h.live.len() != m.upstream.len() {
            return Err(format!(
                "ejected {ejected} + live {} != upstream {}; {}",
                h.live.len(),
                m.upstream.len(),
                ctx()
            ));
        }
        let snapshot = monitor.snapshot();
        for e in &snapshot.endpoints {
            let id: usize = e.key.parse().unwrap();
            if (e.status.is_available() || e.status == tower_outlier::EndpointStatus::Unready)
                != h.is_live(id)
            {
                return Err(format!(
                    "{id} is {:?}/{:?}/{:?}, live {}; seen tail {:?}; {}",
                    e.status,
                    e.would_be,
                    e.last_reason,
                    h.is_live(id),
                    &h.seen[h.seen.len().saturating_sub(12)..]
                        .iter()
                        .map(|(_, s)| s.clone())
                        .collect::<Vec<_>>(),
                    ctx()
                ));
            }
        }
        if m.dry {
            for id in &m.upstream {
                if !h.is_live(*id) && !m.forced_out.contains(id) {
                    return Err(format!(
                        "dry run: {id} out of the set; {:?}; {}",
                        snapshot.get(&id.to_string()),
                        ctx()
                    ));
                }
            }
        }
        for id in &m.forced_in {
            let for_host = snapshot
                .get(&id.to_string())
                .and_then(|e| e.last_reason.as_ref())
                .is_some_and(|r| r.policy == "hosts");
            if m.upstream.contains(id) && !h.is_live(*id) && !for_host {
                return Err(format!("forced in {id} not live; {}", ctx()));
            }
        }
        if ejected > 0 && pickable(h, None).is_empty() {
            let anything_ready = m.upstream.iter().any(|id| !h.backend(*id).is_broken());
            if anything_ready {
                let summary: Vec<String> = snapshot
                    .endpoints
                    .iter()
                    .map(|e| {
                        format!(
                            "{}:{:?}/{:?}/{:?}/refused {:?}/broken {}",
                            e.key,
                            e.status,
                            e.would_be,
                            e.forced,
                            e.refused,
                            h.backend(e.key.parse().unwrap()).is_broken()
                        )
                    })
                    .collect();
                return Err(format!(
                    "nothing pickable, {ejected} out; live {:?}; {summary:?} {}",
                    h.live_ids(),
                    ctx()
                ));
            }
        }
        for id in &m.forced_out {
            if h.is_live(*id)
                && !h.live[id].record().is_unready()
                && !pickable(h, Some(*id)).is_empty()
            {
                return Err(format!(
                    "forced out {id} live beside pickable {:?}; {:?}; {}",
                    pickable(h, Some(*id)),
                    snapshot.get(&id.to_string()),
                    ctx()
                ));
            }
        }
        Ok(())
    }
}

async fn run<P: Probe<usize, Backend> + Clone>(
    seed: u64,
    layer: OutlierDetectionLayer<tower_outlier::NetworkErrors, P>,
) -> Result<(), String> {
    let mut rng = SeededRng(seed);
    let mut side = Side::new(&layer);
    for step in 0..300 {
        side.step(&mut rng, seed, step, "a").await?;
    }
    Ok(())
}

async fn run_hosts(seed: u64) -> Result<(), String> {
    use tower_outlier::hosts::{HostOf, HostRegistry};
    let hosts = HostRegistry::new();
    let host_of = || HostOf::new(|key: &usize| Some(format!("10.0.0.{}", key % 5)));
    let a = layer(seed).share_hosts(hosts.clone(), host_of());
    let b = layer(seed + 7).share_hosts(hosts.clone(), host_of());
    let mut rng = SeededRng(seed);
    let mut sa = Side::new(&a);
    let mut sb = Side::new(&b);
    for step in 0..300 {
        if rng.below(2) == 0 {
            sa.step(&mut rng, seed, step, "a").await?;
            sb.check(seed, step).await.map_err(|e| {
                format!(
                    "(b) {e}; a's ops {:?}",
                    &sa.log[sa.log.len().saturating_sub(8)..]
                )
            })?;
        } else {
            sb.step(&mut rng, seed, step, "b").await?;
            sa.check(seed, step).await.map_err(|e| {
                format!(
                    "(a) {e}; b's ops {:?}",
                    &sb.log[sb.log.len().saturating_sub(8)..]
                )
            })?;
        }
    }
    Ok(())
}

fn layer(seed: u64) -> OutlierDetectionLayer {
    let mut rng = SeededRng(seed ^ 0xabcdef);
    OutlierDetectionLayer::new(ErrorRatePolicy::new(
        ErrorRateConfig::hsf()
            .window(Duration::from_secs(2))
            .min_calls(5)
            .recovery_unit(Duration::from_secs(5))
            .max_ejection_ratio(0.5)
            .build()
            .unwrap(),
    ))
    .with_policy(policy(&mut rng, true))
}

fn seeds(default: u64) -> u64 {
    std::env::var("OPERATOR_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

async fn many<F, Fut>(n: u64, first: u64, one: F)
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut failures: Vec<String> = Vec::new();
    let only: Option<u64> = std::env::var("OPERATOR_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    for seed in first..first + n {
        if only.is_some_and(|o| o != seed) {
            continue;
        }
        let result = std::panic::AssertUnwindSafe(one(seed)).catch_unwind().await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("seed {seed}: PANIC {msg}"));
            }
        }
    }
    for f in &failures {
        eprintln!("FAIL: {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {n} seeds failed",
        failures.len()
    );
}

#[tokio::test(start_paused = true)]
async fn fuzz_passive() {
    many(seeds(60), 1, |seed| run(seed, layer(seed))).await;
}

#[tokio::test(start_paused = true)]
async fn fuzz_probes() {
    many(seeds(60), 10_000, |seed| {
        let coin = Arc::new(AtomicU64::new(seed));
        let probe = probe_fn(move |_: &usize, _: Backend| -> ProbeFuture {
            let draw = coin
                .fetch_add(0x9E37_79B9, Ordering::Relaxed)
                .wrapping_mul(2862933555777941757);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(draw % 7000)).await;
                draw.is_multiple_of(3)
            })
        });
        run(seed, layer(seed).probe(probe))
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn fuzz_hosts() {
    many(seeds(40), 50_000, run_hosts).await;
}

#[tokio::test(start_paused = true)]
async fn fuzz_envoy_detector() {
    use tower_outlier::{DetectorConfig, DetectorPolicy};
    many(seeds(60), 70_000, |seed| {
        let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(
            ErrorRateConfig::hsf()
                .window(Duration::from_secs(2))
                .min_calls(5)
                .recovery_unit(Duration::from_secs(5))
                .max_ejection_ratio(0.5)
                .build()
                .unwrap(),
        ))
        .with_policy(DetectorPolicy::seeded(
            DetectorConfig::envoy()
                .consecutive_5xx(3)
                .base_ejection_time(Duration::from_secs(2))
                .max_ejection_percent(60)
                .build()
                .unwrap(),
            seed,
        ))
        // The invariants checked are those of a layer that keeps the last endpoint.
        .when_all_out(tower_outlier::WhenAllOut::KeepLast);
        run(seed, layer)
    })
    .await;
}
