//! What operators decide above the rules: a dry run (layer-wide or per policy), in which the
//! policies judge and nothing is ejected, and overrides of single endpoints. Set through the
//! [`RulesHandle`](crate::RulesHandle); shown in snapshots, events and metrics.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

/// An operator's standing override of the rules for one endpoint, until released
/// ([`RulesHandle::release`](crate::RulesHandle::release)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum Override {
    /// Out of the balancer's set until released, with no recovery check. It counts as an
    /// ejected endpoint in the budget (the policies can eject that many fewer), but the budget
    /// never refuses it; the last endpoint the balancer can pick is kept in all the same, until
    /// another is available.
    ForcedOut,
    /// Exempt from ejection until released: an ejected endpoint comes back at once, and a
    /// policy's judgement of it is refused (shown as refused, with this reason).
    ForcedIn,
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Override::ForcedOut => "forced out",
            Override::ForcedIn => "forced in",
        })
    }
}

/// What an operator did to one endpoint, as [`Event::Operator`](crate::events::Event) reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum OperatorAction {
    /// [`RulesHandle::force_out`](crate::RulesHandle::force_out).
    ForceOut,
    /// [`RulesHandle::force_in`](crate::RulesHandle::force_in).
    ForceIn,
    /// [`RulesHandle::release`](crate::RulesHandle::release).
    Release,
    /// [`RulesHandle::reset_backoff`](crate::RulesHandle::reset_backoff).
    ResetBackoff,
}

impl OperatorAction {
    /// The action's name in metrics and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            OperatorAction::ForceOut => "force_out",
            OperatorAction::ForceIn => "force_in",
            OperatorAction::Release => "release",
            OperatorAction::ResetBackoff => "reset_backoff",
        }
    }
}

impl fmt::Display for OperatorAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operator's controls of one layer, as published: each change is a new value.
#[derive(Clone, Default, Debug)]
pub(crate) struct Controls {
    /// Every policy in dry run.
    pub(crate) dry_run: bool,
    /// The slots of the policies in dry run on their own.
    pub(crate) dry_policies: Vec<usize>,
    /// Standing overrides, by the key's `Debug` text (the text snapshots and events show).
    pub(crate) overrides: HashMap<Box<str>, Override>,
    /// Back-off resets asked for (each adaptor applies the ones it has not yet).
    pub(crate) resets: Resets,
}

/// How many back-off resets the log keeps: an adaptor that has not been polled while more were
/// asked for misses the oldest (it is polled before every pick its balancer makes).
pub(crate) const KEPT_RESETS: usize = 1024;

/// The back-off resets asked for, as a log each adaptor reads on from where it stopped: bounded,
/// so that resets of keys no adaptor holds (or holds no longer) cost nothing for long, and an
/// operator's next action reads only what is new (kept by key and walked in full at every action,
/// 100 000 stale resets made the poll applying a force-out take 40-86 ms).
#[derive(Clone, Default, Debug)]
pub(crate) struct Resets {
    /// How many were ever asked for: the sequence number of the newest.
    pub(crate) asked: u64,
    /// The newest, up to [`KEPT_RESETS`], with their sequence numbers; shared by every copy of
    /// the controls until one more is asked for.
    recent: Arc<VecDeque<(u64, Box<str>)>>,
}

impl Resets {
    /// One more reset, of the endpoint whose key reads `text`.
    pub(crate) fn ask(&mut self, text: Box<str>) {
        self.asked += 1;
        let recent = Arc::make_mut(&mut self.recent);
        if recent.len() == KEPT_RESETS {
            recent.pop_front();
        }
        recent.push_back((self.asked, text));
    }

    /// The key texts of the resets asked for after the `seen`th, oldest first.
    pub(crate) fn after(&self, seen: u64) -> impl Iterator<Item = &str> {
        self.recent
            .iter()
            .filter(move |(at, _)| *at > seen)
            .map(|(_, text)| &**text)
    }
}

impl Controls {
    /// Whether the policy in `slot` only reports what it would eject.
    pub(crate) fn is_dry(&self, slot: usize) -> bool {
        self.dry_run || self.dry_policies.contains(&slot)
    }

    /// Whether any policy is in dry run.
    pub(crate) fn any_dry(&self) -> bool {
        self.dry_run || !self.dry_policies.is_empty()
    }
}
