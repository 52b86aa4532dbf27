//! The detector's timed work: fleet evaluations, recovery checks (passive trials and active
//! probes), trial ends, probe results and re-admissions.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;
use tower::discover::Change;
use tower_outlier_core::{EndpointPolicy, FleetMember};

use super::{deadline_is_current, later, Engine, ProbeStart, Status};
use crate::events::{Event, Readmission};
use crate::probe::ProbeFuture;

impl<K, S, C> Engine<K, S, C>
where
    K: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    S: Clone,
    C: Clone + Send + Sync + 'static,
{
    pub(crate) fn advance(
        &mut self,
        now: Instant,
        probe: &mut dyn FnMut(&K, &S) -> Option<ProbeFuture>,
    ) {
        let evaluated = self.evaluate_fleet(now);
        let current = deadline_is_current(&self.entries, &self.keys);
        let due: Vec<K> = self
            .deadlines
            .pop_due(now, current)
            .into_iter()
            .filter_map(|id| self.keys.get(&id).cloned())
            .collect();
        for key in due {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            // An earlier endpoint's check may have changed this one (a re-admission freed the
            // budget and it was ejected anew): only a deadline still due counts.
            if entry.status.deadline().is_none_or(|at| at > now) {
                continue;
            }
            match entry.status {
                Status::Trial { .. } => self.trial_ended(&key, now),
                Status::Ejected { .. } => self.check(key, now, probe),
                Status::Available | Status::Probing => {}
            }
        }
        // After the re-admissions that were due, so the endpoints an evaluation condemned
        // compete for the budget those freed (Envoy un-ejects before it detects, too).
        if evaluated {
            self.signalled(now);
        }
    }

    /// A passive trial's time is up. It passes only on evidence: no policy judges the endpoint an
    /// outlier, and the window of the policy that ejected it held, added up over the trial's
    /// periods, at least that policy's [`trial_calls`](tower_outlier_core::EndpointPolicy::trial_calls);
    /// with fewer calls the trial goes on for another period. An endpoint still judged an outlier
    /// has failed this check (counted once per re-admission, even when the budget or the
    /// last-endpoint rule keeps it in); it stays on trial and is ejected, with the longer
    /// interval, as soon as the rules allow.
    fn trial_ended(&mut self, key: &K, now: Instant) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let record = entry.endpoint.record();
        let recorded_now = record.clock().now();
        let until = later(now, self.trial);
        if record.judge(recorded_now).is_some() {
            if !entry.trial_breached {
                entry.failed_checks = entry.failed_checks.saturating_add(1);
                entry.trial_breached = true;
                let (name, failed_checks) = (entry.name.clone(), entry.failed_checks);
                self.registry.events.emit(|| Event::TrialFailed {
                    key: name,
                    failed_checks,
                });
            }
            entry.set_status(Status::Trial { until }, &mut self.deadlines);
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                failed_checks = entry.failed_checks,
                "trial failed: the endpoint is still an outlier"
            );
            self.publish(key, Some(until), None);
            self.consider(key, now);
            return;
        }
        let (seen, needed) = entry
            .ejected_by
            .policy()
            .and_then(|index| record.policies().get(index))
            .map_or((0, 0), |policy| {
                (policy.counts(recorded_now).calls, policy.trial_calls())
            });
        entry.trial_calls = entry.trial_calls.saturating_add(seen);
        if entry.trial_calls < needed {
            entry.set_status(Status::Trial { until }, &mut self.deadlines);
            tracing::debug!(
                target: "tower_outlier",
                endpoint = ?key,
                calls = entry.trial_calls,
                needed,
                "trial extended: too few calls to judge"
            );
            self.publish(key, Some(until), None);
        } else {
            entry.set_status(Status::Available, &mut self.deadlines);
            entry.failed_checks = 0;
            tracing::info!(target: "tower_outlier", endpoint = ?key, "endpoint recovered: trial passed");
            let name = entry.name.clone();
            self.registry.events.emit(|| Event::Recovered { key: name });
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
            let Some(fleet) = self.settings.policies[schedule.policy].fleet() else {
                continue;
            };
            // In discovery order, so a policy that draws random numbers per member (enforcement)
            // draws them the same way on every run.
            let mut in_order: Vec<_> = self.entries.iter().collect();
            in_order.sort_unstable_by_key(|(_, entry)| entry.id);
            let members: Vec<FleetMember<'_, dyn EndpointPolicy>> = in_order
                .into_iter()
                .map(|(key, entry)| {
                    let record = entry.endpoint.record();
                    FleetMember {
                        key: key as &dyn fmt::Debug,
                        state: &*record.policies()[schedule.policy],
                        record,
                        available: entry.status.is_available(),
                    }
                })
                .collect();
            fleet.evaluate(&members, self.settings.clock.now());
            evaluated = true;
        }
        if evaluated {
            self.report_weights();
        }
        evaluated
    }

    /// Reports the weights a fleet evaluation changed (in discovery order).
    fn report_weights(&mut self) {
        for key in self.keys_where(|e| e.endpoint.record().weight() != e.weight) {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            let (from, to) = (entry.weight, entry.endpoint.record().weight());
            entry.weight = to;
            let name = entry.name.clone();
            self.registry.events.emit(|| Event::WeightChanged {
                key: name,
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
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        match probe(&key, entry.endpoint.get_ref()) {
            Some(probe) => {
                // A probe that hangs longer than one recovery unit is a failed check.
                let timeout = entry.schedule.map_or(Duration::from_secs(10), |s| s.unit());
                entry.set_status(Status::Probing, &mut self.deadlines);
                self.probes.push_back(ProbeStart {
                    key: key.clone(),
                    id: entry.id,
                    probe,
                    timeout,
                });
                tracing::info!(target: "tower_outlier", endpoint = ?key, failed_checks = entry.failed_checks, "probing ejected endpoint");
                let name = entry.name.clone();
                self.registry
                    .events
                    .emit(|| Event::ProbeStarted { key: name });
                self.publish(&key, None, None);
            }
            None => {
                let until = later(now, self.trial);
                self.readmit(
                    &key,
                    Status::Trial { until },
                    Readmission::PassiveTrial,
                    now,
                );
            }
        }
    }

    pub(crate) fn probe_done(&mut self, key: K, id: u64, healthy: bool, now: Instant) {
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        if entry.id != id || !matches!(entry.status, Status::Probing) {
            return;
        }
        if healthy {
            entry.failed_checks = 0;
            self.readmit(&key, Status::Available, Readmission::ProbeSucceeded, now);
        } else {
            entry.failed_checks = entry.failed_checks.saturating_add(1);
            let delay = entry
                .schedule
                .map_or(Duration::from_secs(10), |s| s.delay(entry.failed_checks));
            let next_check = later(now, delay);
            entry.set_status(Status::Ejected { next_check }, &mut self.deadlines);
            tracing::info!(
                target: "tower_outlier",
                endpoint = ?key,
                failed_checks = entry.failed_checks,
                next_check_in = ?delay,
                "probe failed: endpoint stays ejected"
            );
            let name = entry.name.clone();
            self.registry.events.emit(|| Event::ProbeFailed {
                key: name,
                next_check_in: delay,
            });
            self.publish(&key, Some(next_check), None);
        }
    }

    pub(super) fn readmit(&mut self, key: &K, status: Status, cause: Readmission, now: Instant) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if entry.status.is_available() {
            return;
        }
        entry.endpoint.record().reset();
        if entry.ejected_by != super::Ejector::Host {
            let host = entry.host.clone();
            self.share_host(host.as_deref(), false);
        }
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        self.refused -= usize::from(entry.refused);
        entry.refused = false;
        entry.trial_breached = false;
        entry.trial_calls = 0;
        let endpoint = entry.endpoint.clone();
        self.seed_rtt(&endpoint);
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let next = status.deadline();
        entry.set_status(status, &mut self.deadlines);
        self.ejected -= 1;
        tracing::info!(
            target: "tower_outlier",
            endpoint = ?key,
            cause = %cause,
            failed_checks = entry.failed_checks,
            trial_until = ?next.map(|at| at.saturating_duration_since(now)),
            "endpoint re-admitted"
        );
        let name = entry.name.clone();
        let trial = next.map(|at| at.saturating_duration_since(now));
        self.registry.events.emit(|| Event::Readmitted {
            key: name,
            cause,
            trial,
        });
        self.queue
            .push_back(Change::Insert(key.clone(), entry.endpoint.clone()));
        self.publish(key, next, None);
        self.report_states(key);
        self.retry_refused(now);
    }

    /// Re-admits ejected endpoints while more are ejected than the budget allows, or none is
    /// available; the ones due soonest go first.
    pub(super) fn enforce_budget(&mut self, now: Instant) {
        loop {
            let max = self.settings.budget.max_ejected(self.entries.len());
            let cause = if self.ejected > 0 && self.available() == 0 {
                Readmission::LastEndpoint
            } else if self.ejected > max {
                Readmission::BudgetShrank
            } else {
                return;
            };
            let soonest = self
                .entries
                .iter()
                .filter(|(_, e)| !e.status.is_available())
                .min_by_key(|(_, e)| (e.status.deadline(), e.id))
                .map(|(k, _)| k.clone());
            let Some(key) = soonest else { return };
            if let Some(entry) = self.entries.get(&key) {
                if matches!(entry.status, Status::Probing) {
                    self.cancelled.push(entry.id);
                }
            }
            let until = later(now, self.trial);
            self.readmit(&key, Status::Trial { until }, cause, now);
        }
    }
}
