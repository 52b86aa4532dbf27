//! The weights as a fleet policy: each endpoint's state keeps its last report's weight; every
//! update period the policy turns the weights into shares of the balancer's draws.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::{
    duration_to_nanos, Description, EndpointPolicy, FleetMember, FleetPolicy, Judgement, Nanos,
    Observation, OutlierPolicy, RecoverySchedule, ServerSignal, Signal, Weighting,
};

use crate::config::OrcaConfig;
use crate::report::LoadReport;

/// No time yet.
const NEVER: Nanos = Nanos::MAX;

/// Weights endpoints by their servers' load reports, as gRPC's weighted round robin does (gRFC
/// A58). It never ejects; add it to a layer with `with_policy`, beside a policy that does.
///
/// Every [`weight_update_period`](OrcaConfig::weight_update_period) it takes each endpoint in the
/// balancer's set with a weight in force (reported for the blackout period, not expired), gives
/// the others the mean of those weights, and sets how many of the balancer's draws each takes
/// part in so that p2c gives it its weight's share of the calls: with target shares `t_i`,
/// endpoint `i` takes part in `1 − (n − 1)(max t − t_i)` of its draws, the largest in all of
/// them. While the weights are in force they stand for the servers' load, as in A58: within a
/// draw, the layer's load compares two endpoints taking part by their calls in flight (and the
/// age of those calls), not by their measured latency, so that serial traffic splits exactly as
/// the weights say and concurrent traffic still avoids an endpoint holding calls. With fewer than
/// two weights in force, every endpoint takes part in all of its draws and is compared by its
/// latency again. A weight policy's (SOFARPC's) relative weight divides the cost within the draws;
/// both apply.
///
/// ```
/// use tower_outlier_orca::{OrcaConfig, OrcaPolicy};
///
/// let policy = OrcaPolicy::new(OrcaConfig::a58().build()?);
/// assert_eq!(policy.config().blackout_period(), std::time::Duration::from_secs(10));
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct OrcaPolicy {
    config: Arc<OrcaConfig>,
}

impl OrcaPolicy {
    /// The policy's name in logs and snapshots.
    pub const NAME: &'static str = "orca";

    /// Weights by `config`.
    pub fn new(config: OrcaConfig) -> Self {
        OrcaPolicy {
            config: Arc::new(config),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OrcaConfig {
        &self.config
    }
}

/// One endpoint's reports, as [`OrcaPolicy`] keeps them.
#[derive(Debug)]
pub struct OrcaEndpoint {
    penalty: f64,
    // f64 bits of the last report's weight.
    weight: AtomicU64,
    last_updated: AtomicU64,
    non_empty_since: AtomicU64,
    // f64 bits of the share of draws the last evaluation gave it.
    draws: AtomicU64,
}

impl OrcaEndpoint {
    fn new(penalty: f64) -> Self {
        OrcaEndpoint {
            penalty,
            weight: AtomicU64::new(0f64.to_bits()),
            last_updated: AtomicU64::new(NEVER),
            non_empty_since: AtomicU64::new(NEVER),
            draws: AtomicU64::new(1f64.to_bits()),
        }
    }

    /// A call's load report, received at `now`: a report that says nothing (no utilization or
    /// no queries) is ignored, as gRPC ignores it. No lock, no allocation.
    pub fn report(&self, report: &LoadReport, now: Nanos) {
        let Some(weight) = report.weight(self.penalty) else {
            return;
        };
        if self.weight.load(Ordering::Relaxed) != weight.to_bits() {
            self.weight.store(weight.to_bits(), Ordering::Relaxed);
        }
        self.last_updated.store(now, Ordering::Relaxed);
        if self.non_empty_since.load(Ordering::Relaxed) == NEVER {
            self.non_empty_since.store(now, Ordering::Relaxed);
        }
    }

    /// The weight in force at `now`: reported for the blackout period and not expired. An
    /// expired weight restarts the blackout for the next report.
    pub fn weight(&self, config: &OrcaConfig, now: Nanos) -> Option<f64> {
        let updated = self.last_updated.load(Ordering::Relaxed);
        if updated == NEVER {
            return None;
        }
        if now.saturating_sub(updated) >= duration_to_nanos(config.weight_expiration_period) {
            self.non_empty_since.store(NEVER, Ordering::Relaxed);
            return None;
        }
        let since = self.non_empty_since.load(Ordering::Relaxed);
        let blackout = duration_to_nanos(config.blackout_period);
        if blackout != 0 && (since == NEVER || now.saturating_sub(since) < blackout) {
            return None;
        }
        Some(f64::from_bits(self.weight.load(Ordering::Relaxed)))
    }

    /// The share of the balancer's draws the last evaluation gave the endpoint.
    pub fn draws(&self) -> f64 {
        f64::from_bits(self.draws.load(Ordering::Relaxed))
    }
}

impl EndpointPolicy for OrcaEndpoint {
    #[inline]
    fn record(&self, _: &Observation, _: Nanos) -> Signal {
        Signal::None
    }

    fn judge(&self, _: Nanos) -> Judgement {
        Judgement::Healthy
    }

    fn describe(&self, _: Nanos) -> Description {
        Description {
            counts: Default::default(),
            state: None,
            weight: Some(Weighting {
                weight: f64::from_bits(self.weight.load(Ordering::Relaxed)),
                degraded: false,
            }),
            judged: None,
        }
    }

    fn reset(&self) {
        // Reports outlive ejections by other policies: the server said them.
    }

    fn hears(&self) -> bool {
        true
    }

    /// A load report the layer read from a response: decoded on the stack, without a lock.
    #[inline]
    fn hear(&self, signal: &ServerSignal<'_>, now: Nanos) {
        if let ServerSignal::LoadReport(value) = signal {
            if let Some(report) = LoadReport::from_header(value) {
                self.report(&report, now);
            }
        }
    }
}

impl OutlierPolicy for OrcaPolicy {
    type Endpoint = OrcaEndpoint;

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn new_endpoint(&self) -> OrcaEndpoint {
        OrcaEndpoint::new(self.config.error_utilization_penalty)
    }

    fn new_endpoint_from(&self, previous: &OrcaEndpoint, _: Nanos) -> OrcaEndpoint {
        let next = self.new_endpoint();
        for (to, from) in [
            (&next.weight, &previous.weight),
            (&next.last_updated, &previous.last_updated),
            (&next.non_empty_since, &previous.non_empty_since),
            (&next.draws, &previous.draws),
        ] {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        next
    }

    fn recovery(&self) -> RecoverySchedule {
        // Never used: this policy never ejects.
        RecoverySchedule::fixed(self.config.weight_update_period)
    }

    fn trial_period(&self) -> Duration {
        // No trial of its own: the layer's is the longest of its policies'.
        Duration::ZERO
    }

    fn fleet(&self) -> Option<&dyn FleetPolicy<State = OrcaEndpoint>> {
        Some(self)
    }
}

impl FleetPolicy for OrcaPolicy {
    type State = OrcaEndpoint;

    fn interval(&self) -> Duration {
        self.config.weight_update_period
    }

    fn evaluate(&self, fleet: &[FleetMember<'_, OrcaEndpoint>], now: Nanos) {
        let in_set: Vec<&FleetMember<'_, OrcaEndpoint>> =
            fleet.iter().filter(|member| member.available).collect();
        let weights: Vec<Option<f64>> = in_set
            .iter()
            .map(|member| member.state.weight(&self.config, now))
            .collect();
        let known: Vec<f64> = weights.iter().flatten().copied().collect();
        let shares = draw_shares(&weights, &known);
        for (member, share) in in_set.iter().zip(shares) {
            match share {
                Some(share) => member.record.set_draw_share(share),
                None => member.record.clear_draw_share(),
            }
            let share = share.unwrap_or(1.0);
            member.state.draws.store(share.to_bits(), Ordering::Relaxed);
        }
        for member in fleet.iter().filter(|member| !member.available) {
            member.record.clear_draw_share();
            member.state.draws.store(1f64.to_bits(), Ordering::Relaxed);
        }
    }
}

/// The share of draws of each endpoint of the set for its weight (`None`: not in force, the mean
/// of the `known` ones), so that p2c gives it its weight's share of the calls; `None` for every
/// endpoint while too few weights are known for any to apply.
fn draw_shares(weights: &[Option<f64>], known: &[f64]) -> Vec<Option<f64>> {
    let n = weights.len();
    if known.len() < 2 || n < 2 {
        return vec![None; n];
    }
    let mean = known.iter().sum::<f64>() / known.len() as f64;
    let weights: Vec<f64> = weights.iter().map(|w| w.unwrap_or(mean)).collect();
    let total: f64 = weights.iter().sum();
    let max = weights.iter().copied().fold(0.0, f64::max);
    let spread = (n - 1) as f64;
    weights
        .iter()
        .map(|w| Some((1.0 - spread * (max - w) / total).clamp(0.0, 1.0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls p2c gives endpoint `i` of `n` taking part in `p` of their draws, even costs.
    fn calls_share(p: &[f64], i: usize) -> f64 {
        let n = p.len() as f64;
        let sum: f64 = p.iter().sum();
        1.0 / n + (n * p[i] - sum) / (n * (n - 1.0))
    }

    #[test]
    fn shares_of_draws_give_shares_of_calls_in_proportion() {
        let weights = [Some(500.0), Some(250.0), Some(125.0)];
        let known = [500.0, 250.0, 125.0];
        let p: Vec<f64> = draw_shares(&weights, &known)
            .into_iter()
            .flatten()
            .collect();
        for (i, w) in known.iter().enumerate() {
            let target = w / 875.0;
            assert!((calls_share(&p, i) - target).abs() < 1e-12, "{p:?}");
        }
        assert_eq!(p[0], 1.0);
    }

    #[test]
    fn unknown_weights_take_the_mean_and_too_few_take_nothing() {
        assert_eq!(
            draw_shares(&[Some(10.0), None, None], &[10.0]),
            vec![None; 3]
        );
        let p: Vec<f64> = draw_shares(&[Some(300.0), Some(100.0), None], &[300.0, 100.0])
            .into_iter()
            .flatten()
            .collect();
        let target = [300.0 / 600.0, 100.0 / 600.0, 200.0 / 600.0];
        for (i, t) in target.iter().enumerate() {
            assert!((calls_share(&p, i) - t).abs() < 1e-12, "{p:?}");
        }
        // Too uneven for p2c: the lightest takes part in none of its draws.
        let p = draw_shares(&[Some(1000.0), Some(1.0), Some(1.0)], &[1000.0, 1.0, 1.0]);
        assert_eq!(p[1], Some(0.0));
    }

    #[test]
    fn blackout_and_expiry_follow_a58() {
        let config = OrcaConfig::a58().build().unwrap();
        let state = OrcaPolicy::new(config).new_endpoint();
        let s = 1_000_000_000;
        let report = LoadReport {
            rps_fractional: 100.0,
            cpu_utilization: 0.5,
            ..Default::default()
        };
        assert_eq!(state.weight(&config, 0), None);
        state.report(&report, s);
        assert_eq!(state.weight(&config, 5 * s), None, "in the blackout");
        state.report(&report, 10 * s);
        assert_eq!(state.weight(&config, 11 * s), Some(200.0));
        // Three minutes without a report: expired, and the blackout starts again.
        assert_eq!(state.weight(&config, 190 * s), None);
        state.report(&report, 191 * s);
        assert_eq!(state.weight(&config, 192 * s), None);
        assert_eq!(state.weight(&config, 201 * s), Some(200.0));
        // A report that says nothing changes nothing.
        state.report(&LoadReport::default(), 202 * s);
        assert_eq!(state.weight(&config, 202 * s), Some(200.0));
    }
}
