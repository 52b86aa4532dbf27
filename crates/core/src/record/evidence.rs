//! The episodes of calls sent on purpose to an endpoint failing fast (the rest of a streak, a
//! window's minimum, the follow-up of a fast failure), as the record keeps them: rationed per
//! endpoint, so that an upstream inserting the key again (a new service, so a new handle for the
//! balancer) does not start the doubling over; a re-admission does.

use std::sync::atomic::{AtomicU64, Ordering};

use super::EndpointRecord;
use crate::clock::Nanos;

/// How long after one evidence episode began (the calls a policy wants for a judgement, sent on
/// purpose) the next may begin: 10 s after the first, twice as long after each one more, up to
/// [`MAX_EVIDENCE_EPISODE_GAP`] (anew once the endpoint is ejected and back). One episode
/// completes a hard-down endpoint's streak; a gray one whose streaks keep breaking would
/// otherwise be sent calls after each pair of failures, more than p2c alone sends it, and deliver
/// more failures to callers than no detection.
pub(crate) const EVIDENCE_EPISODE_GAP: Nanos = 10_000_000_000;

/// The longest gap between two evidence episodes of one endpoint.
pub(crate) const MAX_EVIDENCE_EPISODE_GAP: Nanos = 320_000_000_000;

/// The episode under way, since when (`Nanos::MAX`: none), and the earliest the next may begin.
pub(super) struct Evidence {
    since: AtomicU64,
    next_at: AtomicU64,
    gap: AtomicU64,
}

impl Default for Evidence {
    fn default() -> Self {
        Evidence {
            since: AtomicU64::new(Nanos::MAX),
            next_at: AtomicU64::new(0),
            gap: AtomicU64::new(EVIDENCE_EPISODE_GAP),
        }
    }
}

impl Evidence {
    /// Takes on `other`'s state (a record's successor).
    pub(super) fn copy_from(&self, other: &Evidence) {
        for (to, from) in [
            (&self.since, &other.since),
            (&self.next_at, &other.next_at),
            (&self.gap, &other.gap),
        ] {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    fn under_way(&self) -> bool {
        self.since.load(Ordering::Relaxed) != Nanos::MAX
    }
}

impl EndpointRecord {
    /// `wanted` calls within the evidence episodes: one under way goes on; a new one begins only
    /// 10 s after the first began, twice that after the second, and so on (at most 320 s).
    /// Read by the balancer's load (the first episode of an endpoint allocates the record's
    /// options).
    pub fn evidence_episode(&self, wanted: u64, now: Nanos) -> u64 {
        if wanted == 0 {
            self.end_evidence_episode();
            return 0;
        }
        let evidence = &self.options_or_new().evidence;
        if evidence.under_way() {
            return wanted;
        }
        if now < evidence.next_at.load(Ordering::Relaxed) {
            return 0;
        }
        evidence.since.store(now, Ordering::Relaxed);
        let gap = evidence.gap.load(Ordering::Relaxed);
        evidence
            .next_at
            .store(now.saturating_add(gap), Ordering::Relaxed);
        evidence.gap.store(
            gap.saturating_mul(2).min(MAX_EVIDENCE_EPISODE_GAP),
            Ordering::Relaxed,
        );
        wanted
    }

    /// Whether an evidence episode is under way.
    #[inline]
    pub fn evidence_episode_under_way(&self) -> bool {
        self.options
            .get()
            .is_some_and(|options| options.evidence.under_way())
    }

    /// Ends the evidence episode under way, if any.
    #[inline]
    pub fn end_evidence_episode(&self) {
        if let Some(options) = self.options.get() {
            if options.evidence.under_way() {
                options.evidence.since.store(Nanos::MAX, Ordering::Relaxed);
            }
        }
    }

    /// Starts the evidence episodes over: the endpoint is back from an ejection.
    pub fn reset_evidence(&self) {
        if let Some(options) = self.options.get() {
            let evidence = &options.evidence;
            evidence.since.store(Nanos::MAX, Ordering::Relaxed);
            evidence.next_at.store(0, Ordering::Relaxed);
            evidence.gap.store(EVIDENCE_EPISODE_GAP, Ordering::Relaxed);
        }
    }
}
