//! The fleet's mode when the rules leave too few endpoints to pick (Envoy's panic, the fail-fast
//! guard's "nothing to pick"), and the room to eject that the records read.

use super::*;

impl<K, S> Engine<K, S>
where
    K: DiscoverKey,
    S: Clone,
{
    /// Follows what the layer does when the rules leave too few endpoints to pick
    /// ([`WhenAllOut`](tower_outlier_core::WhenAllOut)): enters or leaves Envoy's panic, handing
    /// the balancer every endpoint or taking the ejected ones back out, and tells the registry
    /// whether the balancer has none to pick (for the fail-fast guard). Cheap when nothing
    /// changed: run before every `Pending`.
    pub(super) fn sync_all_out(&mut self) {
        let n = self.entries.len();
        let healthy = self.available();
        let panic = self.settings.all_out.panics(healthy, n);
        if panic != self.panicking {
            self.panicking = panic;
            if panic {
                tracing::warn!(
                    target: "tower_outlier",
                    healthy,
                    endpoints = n,
                    "panic: too few endpoints healthy; every endpoint gets traffic"
                );
            } else {
                tracing::info!(target: "tower_outlier", healthy, endpoints = n, "panic over");
            }
            let held: Vec<K> = self
                .keys_where(|e| e.is_out() && !matches!(e.standing(), Standing::HeldByOperator));
            for key in held {
                self.sync_member(&key);
            }
        }
        let nothing = n > 0 && healthy == 0 && !self.panicking;
        let why = if self.panicking {
            let threshold = match self.settings.all_out {
                tower_outlier_core::WhenAllOut::PanicBelow(t) => t * 100.0,
                _ => 0.0,
            };
            Some(format!(
                "panic: {healthy} of {n} endpoints healthy, below {threshold:.0} %: every endpoint gets traffic"
            ))
        } else if nothing {
            Some(
                "no endpoint to pick (every one ejected or unready): calls fail fast behind the fail-fast guard, or wait"
                    .to_owned(),
            )
        } else {
            None
        };
        if nothing != self.nothing_to_pick || why != self.all_out_shown {
            let counted = (nothing != self.nothing_to_pick).then_some(nothing);
            self.nothing_to_pick = nothing;
            self.all_out_shown.clone_from(&why);
            self.registry.all_out(self.roster, why, counted);
        }
    }

    /// Whether the policy at `index` is in dry run.
    pub(super) fn is_dry(&self, index: usize) -> bool {
        self.controls.is_dry(index)
    }

    /// Tells the endpoints whether one more ejection would be allowed, the same test
    /// [`consider`](Self::consider) applies, so none gathers evidence for an ejection that would
    /// be refused.
    pub(super) fn publish_room(&mut self) {
        let n = self.entries.len();
        let max = self.settings.budget.max_ejected(n);
        // In a layer-wide dry run, the room the rules would have.
        self.notifier
            .set_room_to_eject(self.room_for(self.controls.dry_run).is_ok());
        // A budget that rounds to none for this fleet is said once, in the log and the monitor,
        // and again whenever that changes.
        let none = (max == 0 && n > 1).then_some(n);
        if none != self.no_ejection {
            self.no_ejection = none;
            let why = none.map(|n| {
                let ratio = self.settings.budget.max_ratio() * 100.0;
                format!("ejection budget of 0 for {n} endpoints at {ratio:.0} %")
            });
            if let Some(why) = &why {
                tracing::info!(
                    target: "tower_outlier",
                    endpoints = n,
                    "no endpoint can be ejected: {why}"
                );
            }
            self.registry.no_ejection(self.roster, why);
        }
    }
}
