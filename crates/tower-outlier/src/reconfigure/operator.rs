//! The operator's controls on the rules' handle: dry run, overrides of single endpoints, back-off
//! resets ([`controls`](crate::controls) has what they are).

use std::fmt;

use super::{ReconfigureError, RulesHandle};
use crate::controls::Override;

/// The operator's controls, on the handle that also replaces the rules. Each change is published
/// at once and applied by every adaptor of the layer on its next poll, as new rules are; none of
/// them changes the rules' version.
impl RulesHandle {
    /// Turns the layer-wide dry run on or off. In dry run every policy judges as before, and every
    /// decision the layer would make about an ejection — the ejection, a refusal, the recovery
    /// checks and re-admissions after it — is made in full, with the budget and the last-endpoint
    /// rule, and reported as [`Event::DryRun`](crate::events::Event::DryRun) (snapshots show it in
    /// [`EndpointSnapshot::would_be`](crate::EndpointSnapshot)), but no endpoint leaves the
    /// balancer's set.
    ///
    /// Turned on, endpoints ejected before come back into the balancer's set at once, and the
    /// rest of their ejections is reported as what would happen. Turned off, what dry run would
    /// have ejected is forgotten, and every endpoint is judged afresh by the rules: an endpoint
    /// still judged an outlier is then ejected, within the budget, and none is ejected on a
    /// verdict it may have outgrown.
    ///
    #[cfg_attr(feature = "error-rate", doc = "```")]
    #[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
    /// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    ///
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
    /// let rules = layer.rules();
    /// rules.set_dry_run(true);
    /// assert!(rules.dry_run());
    /// // The rules can change while in dry run: trial a lower threshold without ejecting.
    /// rules.replace(0, ErrorRatePolicy::new(
    ///     ErrorRateConfig::hsf().error_rate_threshold(0.2).build()?,
    /// ))?;
    /// assert!(rules.dry_run());
    /// # Ok::<(), tower::BoxError>(())
    /// ```
    pub fn set_dry_run(&self, on: bool) {
        self.cell().control(|controls| controls.dry_run = on);
        tracing::info!(target: "tower_outlier", on, "dry run set: adaptors apply it on their next poll");
    }

    /// Whether the layer-wide dry run is on.
    pub fn dry_run(&self) -> bool {
        self.cell().controls().0.dry_run
    }

    /// Turns dry run on or off for the policy in `slot` alone (the layer's first policy is 0), as
    /// [`set_dry_run`](Self::set_dry_run) does for all: its verdicts are reported as what would
    /// happen, and the other policies keep ejecting. The policies that enforce are asked first,
    /// so a dry-run policy never keeps an enforcing one from ejecting an endpoint both judge; and
    /// an endpoint the dry-run policy would have ejected is still ejected by an enforcing policy
    /// that judges it.
    ///
    #[cfg_attr(feature = "error-rate", doc = "```")]
    #[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
    /// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    ///
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
    /// let rules = layer.rules();
    /// rules.set_policy_dry_run(0, true)?;
    /// assert!(rules.policy_dry_run(0));
    /// assert!(rules.set_policy_dry_run(1, true).is_err(), "the layer has one policy");
    /// # Ok::<(), tower::BoxError>(())
    /// ```
    pub fn set_policy_dry_run(&self, slot: usize, on: bool) -> Result<(), ReconfigureError> {
        self.cell().check_slot(slot)?;
        self.cell().control(|controls| {
            controls.dry_policies.retain(|&s| s != slot);
            if on {
                controls.dry_policies.push(slot);
            }
        });
        tracing::info!(target: "tower_outlier", slot, on, "policy dry run set: adaptors apply it on their next poll");
        Ok(())
    }

    /// Whether the policy in `slot` is in dry run (on its own or layer-wide).
    pub fn policy_dry_run(&self, slot: usize) -> bool {
        self.cell().controls().0.is_dry(slot)
    }

    /// Forces the endpoint whose discover key is `key` out of the balancer's set until
    /// [`release`](Self::release)d ([`Override::ForcedOut`]): for maintenance, or an endpoint the
    /// policies cannot see is bad. The key is matched by its `Debug` text, so a typed key
    /// (a `SocketAddr`) and the [`EndpointKey`](crate::events::EndpointKey) of a snapshot both
    /// name it. An override of a key the layer does not hold yet applies when the key appears.
    ///
    #[cfg_attr(feature = "error-rate", doc = "```")]
    #[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
    /// use std::net::SocketAddr;
    /// use tower_outlier::controls::Override;
    /// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    ///
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
    /// let rules = layer.rules();
    /// let addr: SocketAddr = "10.0.0.7:8080".parse()?;
    /// rules.force_out(&addr);
    /// assert_eq!(rules.override_of(&addr), Some(Override::ForcedOut));
    /// rules.release(&addr);
    /// assert_eq!(rules.override_of(&addr), None);
    /// # Ok::<(), tower::BoxError>(())
    /// ```
    pub fn force_out<K: fmt::Debug + ?Sized>(&self, key: &K) {
        self.set_override(key, Some(Override::ForcedOut));
    }

    /// Exempts the endpoint whose discover key is `key` from ejection until
    /// [`release`](Self::release)d ([`Override::ForcedIn`]); it comes back at once if it is out.
    /// Matched as [`force_out`](Self::force_out) matches.
    pub fn force_in<K: fmt::Debug + ?Sized>(&self, key: &K) {
        self.set_override(key, Some(Override::ForcedIn));
    }

    /// Ends the override of `key`'s endpoint. One forced out comes back into the balancer's set
    /// at once, with a clean history, and is judged by the rules from there; one forced in is
    /// judged by the rules again.
    pub fn release<K: fmt::Debug + ?Sized>(&self, key: &K) {
        self.set_override(key, None);
    }

    /// The override in force for `key`, if any.
    pub fn override_of<K: fmt::Debug + ?Sized>(&self, key: &K) -> Option<Override> {
        let text = format!("{key:?}");
        self.cell()
            .controls()
            .0
            .overrides
            .get(text.as_str())
            .copied()
    }

    /// Resets the back-off of `key`'s endpoint: its failed recovery checks and its policies'
    /// ejection multipliers (Envoy's and gRPC's ejection count, linkerd's back-off) go back to
    /// zero, so its next ejection lasts the base time. An ejection in progress keeps its check;
    /// release or force it in to bring it back now. Applies to the endpoint the layer holds
    /// under `key` now.
    pub fn reset_backoff<K: fmt::Debug + ?Sized>(&self, key: &K) {
        let text: Box<str> = format!("{key:?}").into();
        tracing::info!(target: "tower_outlier", endpoint = &*text, "back-off reset asked for");
        self.cell().control(|controls| {
            controls.resets.ask(text);
        });
    }

    fn set_override<K: fmt::Debug + ?Sized>(&self, key: &K, value: Option<Override>) {
        let text: Box<str> = format!("{key:?}").into();
        tracing::info!(
            target: "tower_outlier",
            endpoint = &*text,
            over = ?value,
            "endpoint override set: adaptors apply it on their next poll"
        );
        self.cell().control(|controls| match value {
            Some(value) => {
                controls.overrides.insert(text, value);
            }
            None => {
                controls.overrides.remove(&text);
            }
        });
    }
}
