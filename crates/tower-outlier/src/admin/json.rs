//! The admin component's JSON: events with their fields, and the sampled history.

use std::time::SystemTime;

use serde_json::{json, Value};

use super::history::{History, Kept};
use super::page::status_name;
use super::query::TickPage;
use crate::envoy_log::Rfc3339;
use crate::event::{Event, Refusal};
use tower_outlier_core::Reason;

fn at(time: SystemTime) -> String {
    Rfc3339(time).to_string()
}

fn reason(reason: &Reason) -> Value {
    json!({
        "policy": reason.policy,
        "measure": reason.measure,
        "value": reason.value,
        "threshold": reason.threshold,
        "calls": reason.counts.calls,
        "failures": reason.counts.failures,
        "slow": reason.counts.slow,
    })
}

/// An event as a JSON object: `at`, `kind`, `key` (null for rules events) and the event's own
/// fields.
pub(super) fn event(kept: &Kept) -> Value {
    let mut object = json!({ "at": at(kept.at) });
    let fields = fields(&kept.event);
    if let (Value::Object(object), Value::Object(fields)) = (&mut object, fields) {
        object.extend(fields);
    }
    object
}

/// An event's `kind`, `key` and own fields; dry run's as `kind` "dry_run" with the event it
/// would have been under `would`.
fn fields(event: &Event) -> Value {
    match event {
        Event::Ejected {
            key,
            reason: why,
            next_check_in,
        } => json!({
            "kind": "ejected", "key": key.as_str(), "reason": reason(why),
            "next_check_in_seconds": next_check_in.map(|d| d.as_secs_f64()),
        }),
        Event::EjectionRefused {
            key,
            reason: why,
            refusal,
        } => json!({
            "kind": "ejection_refused", "key": key.as_str(), "reason": reason(why),
            "refusal": match refusal {
                Refusal::Budget => "budget",
                Refusal::LastEndpoint => "last_endpoint",
                Refusal::ForcedIn => "forced_in",
            },
        }),
        Event::Readmitted { key, cause, trial } => json!({
            "kind": "readmitted", "key": key.as_str(), "cause": cause.to_string(),
            "trial_seconds": trial.map(|d| d.as_secs_f64()),
        }),
        Event::Recovered { key } => json!({ "kind": "recovered", "key": key.as_str() }),
        Event::TrialFailed { key, failed_checks } => json!({
            "kind": "trial_failed", "key": key.as_str(), "failed_checks": failed_checks,
        }),
        Event::ProbeStarted { key } => json!({ "kind": "probe_started", "key": key.as_str() }),
        Event::ProbeFailed { key, next_check_in } => json!({
            "kind": "probe_failed", "key": key.as_str(),
            "next_check_in_seconds": next_check_in.as_secs_f64(),
        }),
        Event::WeightChanged { key, from, to } => json!({
            "kind": "weight_changed", "key": key.as_str(), "from": from, "to": to,
        }),
        Event::Removed { key, status } => json!({
            "kind": "removed", "key": key.as_str(), "status": status_name(*status),
        }),
        Event::PolicyStateChanged {
            key,
            policy,
            from,
            to,
        } => json!({
            "kind": "policy_state_changed", "key": key.as_str(), "policy": policy,
            "from": from, "to": to,
        }),
        Event::RulesApplied { version } => json!({
            "kind": "rules_applied", "key": null, "version": version,
        }),
        Event::RulesRejected { error } => json!({
            "kind": "rules_rejected", "key": null, "error": error,
        }),
        Event::DryRun(inner) => json!({
            "kind": "dry_run", "key": inner.key().map(|key| key.as_str()), "would": fields(inner),
        }),
        Event::Operator { key, action } => json!({
            "kind": "operator", "key": key.as_str(), "action": action.as_str(),
        }),
    }
}

/// The kept events, oldest first.
pub(super) fn events(history: &History) -> Value {
    Value::Array(history.events.iter().map(|kept| event(kept)).collect())
}

/// The page of the sampled history a reader asked for: each of its ticks with every sampled
/// endpoint, and where the next page starts.
pub(super) fn history(history: &History, page: TickPage) -> Value {
    let limits = history.limits();
    // A reader whose place is past the newest tick read an earlier run of this component (its
    // process restarted, numbering from 1 again): it starts over from the oldest kept.
    let newest = history.ticks.last().map_or(0, |tick| tick.seq);
    let restarted = page.since > newest && newest > 0;
    let since = if restarted { 0 } else { page.since };
    // Ticks are kept in the order of their numbers.
    let first = history.ticks.partition_point(|tick| tick.seq <= since);
    let after = &history.ticks[first..];
    let shown = &after[..page
        .limit
        .map_or(after.len(), |limit| limit.min(after.len()))];
    let ticks: Vec<Value> = shown
        .iter()
        .map(|tick| {
            let endpoints: Vec<Value> = tick
                .samples
                .iter()
                .map(|s| {
                    json!({
                        "key": history.keys[s.endpoint as usize],
                        "out_of_rotation": s.out,
                        "error_rate": s.error_rate,
                        "window_calls": s.calls,
                    })
                })
                .collect();
            json!({ "seq": tick.seq, "at": at(tick.at), "endpoints": endpoints })
        })
        .collect();
    json!({
        "sample_every_seconds": limits.every.as_secs_f64(),
        "kept_ticks": limits.ticks,
        "untracked_endpoints": history.untracked,
        "oldest_seq": history.ticks.first().map(|tick| tick.seq),
        "newest_seq": history.ticks.last().map(|tick| tick.seq),
        "next_since": shown.last().map_or(since, |tick| tick.seq),
        "more": shown.len() < after.len(),
        "restarted": restarted,
        "ticks": ticks,
    })
}
