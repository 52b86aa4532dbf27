//! The detector's timed work: fleet evaluations, recovery checks (passive trials and active
//! probes), trial ends and probe results.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;
use tower_outlier_core::{EndpointPolicy, FleetMember};

use super::{later, DiscoverKey, Engine, ProbeStart, Standing};
use crate::event::{Event, Readmission};
use crate::probe::ProbeFuture;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    pub(crate) fn advance(
        &mut self,
        now: Instant,
        probe: &mut dyn FnMut(&K, &S) -> Option<ProbeFuture>,
    ) {
        let evaluated = self.evaluate_fleet(now);
        let due = self
            .deadlines
            .pop_due(now, deadline_is_current(&self.entries));
        for key in due {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            // An earlier endpoint's check may have changed this one (a re-admission freed the
            // budget and it was ejected anew): only a deadline still due counts.
            let status = entry.standing();
            if status.deadline().is_none_or(|at| at > now) {
                continue;
            }
            match status {
                Standing::Trial { .. } => self.trial_ended(&key, now),
                Standing::Ejected { .. } => self.check(key, now, probe),
                Standing::Available
                | Standing::Probing
                | Standing::HeldForHost
                | Standing::HeldByOperator
                | Standing::HeldNotServing => {}
            }
        }
        self.check_avoided(now, probe);
        // After the re-admissions that were due, so the endpoints an evaluation condemned
        // compete for the budget those freed (Envoy un-ejects before it detects, too).
        if evaluated {
            self.signalled(now);
        }
    }

    /// A passive trial's time is up. It passes only on evidence: no policy judges the endpoint an
    /// outlier, and the window of the policy that ejected it held, added up over the trial's
    /// periods, at least that policy's [`trial_calls`](tower_outlier_core::CallsNeeded::trial_calls);
    /// with fewer calls the trial goes on for another period. An endpoint still judged an outlier
    /// has failed this check (counted once per re-admission, even when the budget or the
    /// last-endpoint rule keeps it in); it stays on trial and is ejected, with the longer
    /// interval, as soon as the rules allow.
    fn trial_ended(&mut self, key: &K, now: Instant) {
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        let judged = self.judged(entry).is_some();
        let Some(episode) = entry.episode() else {
            return;
        };
        let (id, shadow) = (entry.id, episode.shadow);
        let until = later(now, self.trial);
        if judged {
            let breached = self.restand(key, |s| {
                let failed = s.episode().and_then(|e| e.breach_trial());
                s.set_stage(Standing::Trial { until });
                failed
            });
            if let Some(failed_checks) = breached.flatten() {
                self.emit_for(id, shadow, |key| Event::TrialFailed { key, failed_checks });
            }
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                failed_checks = self.entries.get(key).map_or(0, |e| e.failed_checks()),
                "trial failed: the endpoint is still an outlier"
            );
            self.publish(key, Some(until), None);
            self.consider(key, now);
            return;
        }
        let record = entry.record();
        let recorded_now = record.clock().now();
        let (seen, needed) = episode
            .ejected_by
            .policy()
            .and_then(|index| record.policies().get(index))
            .map_or((0, 0), |policy| {
                (
                    policy.describe(recorded_now).counts.calls,
                    policy.calls_needed().map_or(0, |needs| needs.trial_calls()),
                )
            });
        let calls = episode.trial_calls.saturating_add(seen);
        if calls < needed {
            self.restand(key, |s| {
                if let Some(episode) = s.episode() {
                    episode.trial_calls = calls;
                }
                s.set_stage(Standing::Trial { until });
            });
            tracing::debug!(
                target: "tower_outlier",
                endpoint = ?key,
                calls,
                needed,
                "trial extended: too few calls to judge"
            );
            self.publish(key, Some(until), None);
        } else {
            // Recovered: the episode ends, and its failed checks with it.
            self.restand(key, |s| s.end_episode());
            tracing::info!(target: "tower_outlier", endpoint = ?key, dry_run = shadow, "endpoint recovered: trial passed");
            self.emit_for(id, shadow, |key| Event::Recovered { key });
            self.publish(key, None, None);
        }
    }

    /// Runs the fleet-wide evaluations that are due (policies judging endpoints against each
    /// other, such as weight degradation against the service average). Whether any ran.
    fn evaluate_fleet(&mut self, now: Instant) -> bool {
        let mut evaluated = false;
        for index in 0..self.fleet.len() {
            let schedule = self.fleet[index];
            if schedule.next > now {
                continue;
            }
            // From now, not from the missed deadline: an idle stretch is one long window, not a
            // burst of empty ones.
            self.fleet[index].next = later(now, schedule.every);
            if self.entries.is_empty() {
                continue;
            }
            let fleet = &self.settings.policies[schedule.policy];
            // In discovery order, so a policy that draws random numbers per member (enforcement)
            // draws them the same way on every run.
            let mut in_order: Vec<_> = self.entries.iter().collect();
            in_order.sort_unstable_by_key(|(_, entry)| entry.id);
            let counts_in_flight = fleet.fleet_counts_in_flight();
            let recorded_now = self.settings.clock.now();
            let members: Vec<FleetMember<'_, dyn EndpointPolicy>> = in_order
                .into_iter()
                .map(|(key, entry)| {
                    let record = entry.record();
                    let (in_flight, waited) = if counts_in_flight {
                        entry.shared.pending(recorded_now)
                    } else {
                        (0, 0)
                    };
                    FleetMember {
                        key: key as &dyn fmt::Debug,
                        state: &*record.policies()[schedule.policy],
                        record,
                        available: entry.standing().is_available(),
                        in_flight,
                        waited,
                    }
                })
                .collect();
            if fleet.evaluate_fleet(&members, self.settings.clock.now()) {
                evaluated = true;
            }
        }
        if evaluated {
            self.report_weights();
        }
        evaluated
    }

    /// Reports the weights a fleet evaluation changed (in discovery order).
    fn report_weights(&mut self) {
        for key in self.keys_where(|e| e.record().weight() != e.reported_weight()) {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            let (from, to) = (entry.reported_weight(), entry.record().weight());
            entry.set_reported(&self.usual_report, |reported| reported.weight = to);
            self.registry
                .emit_about(self.roster, entry.id, |key| Event::WeightChanged {
                    key,
                    from,
                    to,
                });
        }
    }

    /// A recovery check is due: probe actively, or re-admit for a passive trial.
    fn check(
        &mut self,
        key: K,
        now: Instant,
        probe: &mut dyn FnMut(&K, &S) -> Option<ProbeFuture>,
    ) {
        let Some(episode) = self.entries.get(&key).and_then(|e| e.episode()) else {
            return;
        };
        if episode.ejected_by == super::Ejector::Pushback {
            // The time its server asked for is up: back without a check of its own.
            self.readmit(&key, None, Readmission::PushbackOver, now);
            return;
        }
        // The probe runs on the service the endpoint will come back with; in dry run it never
        // left, and keeps the one it has (no factory runs for what dry run only reports).
        if !episode.shadow {
            self.rebuild_if_due(&key, now);
        }
        let Some(entry) = self.entries.get(&key) else {
            return;
        };
        let Some(episode) = entry.episode() else {
            return;
        };
        match probe(&key, &entry.service) {
            Some(probe) => {
                // A probe that hangs longer than the cadence's timeout, or one recovery unit,
                // is a failed check.
                let timeout = self.settings.cadence.timeout.unwrap_or_else(|| {
                    if episode.ejected_by == super::Ejector::ActiveCheck {
                        return super::avoided::CHECK_TIMEOUT;
                    }
                    episode
                        .schedule
                        .map_or(Duration::from_secs(10), |s| s.unit())
                });
                let (id, shadow, failed_checks) = (entry.id, episode.shadow, episode.failed_checks);
                self.restand(&key, |s| s.set_stage(Standing::Probing));
                self.probes.push_back(ProbeStart {
                    key: key.clone(),
                    id,
                    probe,
                    timeout,
                });
                tracing::info!(target: "tower_outlier", endpoint = ?key, failed_checks, dry_run = shadow, "probing ejected endpoint");
                self.emit_for(id, shadow, |key| Event::ProbeStarted { key });
                self.publish(&key, None, None);
            }
            None => {
                let until = later(now, self.trial);
                self.readmit(&key, Some(until), Readmission::PassiveTrial, now);
            }
        }
    }

    /// When an endpoint just taken out is first checked: the cadence's first check, or its
    /// interval after failed checks, when the layer sends checks and the cadence sets them;
    /// otherwise `policy_delay` (the delay, and whether the policy jittered it already); then
    /// jittered as the cadence says.
    pub(super) fn first_check_after(
        &self,
        (delay, own_jitter): (Duration, bool),
        failed_checks: u32,
    ) -> Duration {
        let cadence = &self.settings.cadence;
        let set = if failed_checks == 0 {
            cadence.first_check
        } else {
            cadence.interval
        };
        match set.filter(|_| self.checks_sent) {
            Some(base) => self.cadenced(base, false, failed_checks == 0),
            None => self.cadenced(delay, own_jitter, failed_checks == 0),
        }
    }

    /// When an endpoint that failed a check (or passed one short of the healthy threshold) is
    /// checked next: the cadence's interval, or `policy_delay`, jittered.
    fn next_check_after(&self, (delay, own_jitter): (Duration, bool)) -> Duration {
        match self.settings.cadence.interval.filter(|_| self.checks_sent) {
            Some(base) => self.cadenced(base, false, false),
            None => self.cadenced(delay, own_jitter, false),
        }
    }

    pub(crate) fn probe_done(&mut self, key: K, id: u64, healthy: bool, now: Instant) {
        if id & super::avoided::CHECK_TAG != 0 {
            self.avoided_checked(&key, id & !super::avoided::CHECK_TAG, healthy, now);
            return;
        }

        let Some(entry) = self.entries.get(&key) else {
            return;
        };
        if entry.id != id {
            return;
        }
        let Some(episode) = entry.episode() else {
            return;
        };
        if !matches!(episode.stage(), Standing::Probing) {
            return;
        }
        // An endpoint that has failed a check comes back after the cadence's healthy threshold
        // of passes in a row (Envoy's `healthy_threshold`); one that has failed none, at its
        // first pass.
        let passes = episode.passed_checks.saturating_add(1);
        // One taken out by its checks failed them already.
        let failed_before =
            episode.failed_checks > 0 || episode.ejected_by == super::Ejector::ActiveCheck;
        let needed = if failed_before && self.checks_sent {
            self.settings.cadence.healthy_threshold
        } else {
            1
        };
        if healthy && passes < needed {
            let unit = episode
                .schedule
                .map_or(Duration::from_secs(1), |s| s.unit());
            let delay = self.next_check_after((unit, false));
            let next_check = later(now, delay);
            self.restand(&key, |s| {
                if let Some(episode) = s.episode() {
                    episode.passed_checks = passes;
                }
                s.set_stage(Standing::Ejected { next_check });
            });
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                passes,
                needed,
                next_check_in = ?delay,
                "probe passed: endpoint stays out until it passes enough in a row"
            );
            self.publish(&key, Some(next_check), None);
        } else if healthy {
            // Available without condition: the episode ends, and its failed checks with it.
            self.readmit(&key, None, Readmission::ProbeSucceeded, now);
        } else {
            let failed_checks = episode.failed_checks.saturating_add(1);
            // The ejecting state's own timing, when it has one (a composition's members, an
            // equal-jitter back-off); otherwise the policy's recovery schedule.
            let record = &entry.shared.record;
            let recorded_now = record.clock().now();
            let timing = match episode.ejected_by {
                super::Ejector::Policy(index) => {
                    record.policies().get(index).and_then(|p| p.own_timing())
                }
                _ => None,
            };
            let own = timing.and_then(|t| t.check_after_failed_probe(failed_checks, recorded_now));
            // A policy that times its own ejections (the detectors, Finagle's) has its own
            // jitter settings: the cadence adds none by default to its schedule either.
            let policy_delay = match own {
                Some(at) => (Duration::from_nanos(at.saturating_sub(recorded_now)), true),
                None => (
                    episode
                        .schedule
                        .map_or(Duration::from_secs(10), |s| s.delay(failed_checks)),
                    timing.is_some(),
                ),
            };
            let delay = self.next_check_after(policy_delay);
            let shadow = episode.shadow;
            let next_check = later(now, delay);
            self.restand(&key, |s| {
                if let Some(episode) = s.episode() {
                    episode.failed_checks = failed_checks;
                    episode.passed_checks = 0;
                }
                s.set_stage(Standing::Ejected { next_check });
            });
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                failed_checks,
                next_check_in = ?delay,
                "probe failed: endpoint stays ejected"
            );
            self.emit_for(id, shadow, |key| Event::ProbeFailed {
                key,
                next_check_in: delay,
            });
            self.publish(&key, Some(next_check), None);
        }
    }
}

/// Whether the deadline `at` popped for entry `id` under `key` is still that entry's deadline
/// (the heap keeps deadlines its entries have since moved past, or of entries since removed).
pub(super) fn deadline_is_current<K: Hash + Eq, S>(
    entries: &super::entries::Entries<K, S>,
) -> impl Fn(&K, u64, Instant) -> bool + '_ {
    move |key, id, at| {
        entries
            .get(key)
            .is_some_and(|e| e.id == id && e.standing().deadline() == Some(at))
    }
}
