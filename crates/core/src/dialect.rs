//! Configuration documents: how a document's text becomes the policy that replaces the one in
//! force. Each policy crate implements [`Dialect`] for the formats of the system it follows.

use crate::policy::OutlierPolicy;
use crate::BoxError;

/// A configuration document's language: how its text becomes a policy of a layer.
///
/// The policy crates implement it for HSF, Sentinel, SOFARPC, Envoy and gRPC; implement it for
/// your own format. A layer's rules handle finds the first policy in force with the dialect's
/// [`policy_name`](Self::policy_name) and of its [`Policy`](Self::Policy) type, and
/// [`parse`](Self::parse) reads the document into its successor.
///
/// ```
/// use tower_outlier_core::dialect::Dialect;
/// use tower_outlier_core::{BoxError, OutlierPolicy};
/// # use tower_outlier_core::{Description, EndpointPolicy, Judgement, Nanos, Observation, RecoverySchedule, Signal};
/// # use std::time::Duration;
/// # #[derive(Debug)] struct Healthy;
/// # impl EndpointPolicy for Healthy {
/// #     fn record(&self, _: &Observation, _: Nanos) -> Signal { Signal::None }
/// #     fn judge(&self, _: Nanos) -> Judgement { Judgement::Healthy }
/// #     fn describe(&self, _: Nanos) -> Description { Description::default() }
/// #     fn reset(&self) {}
/// # }
/// # impl OutlierPolicy for Patience {
/// #     type Endpoint = Healthy;
/// #     fn name(&self) -> &'static str { "patience" }
/// #     fn new_endpoint(&self) -> Healthy { Healthy }
/// #     fn recovery(&self) -> RecoverySchedule { RecoverySchedule::fixed(self.0) }
/// #     fn trial_period(&self) -> Duration { self.0 }
/// # }
/// /// A policy whose one setting is a number of seconds.
/// #[derive(Debug)]
/// struct Patience(Duration);
///
/// /// Its documents: the number alone.
/// struct Seconds;
///
/// impl Dialect for Seconds {
///     type Policy = Patience;
///     fn name(&self) -> &'static str {
///         "seconds"
///     }
///     fn policy_name(&self) -> &'static str {
///         "patience"
///     }
///     fn parse(&self, text: &str, _: &Patience, _: &mut Vec<String>) -> Result<Patience, BoxError> {
///         Ok(Patience(Duration::from_secs(text.trim().parse()?)))
///     }
/// }
///
/// let next = Seconds.parse("30", &Patience(Duration::from_secs(5)), &mut Vec::new())?;
/// assert_eq!(next.0, Duration::from_secs(30));
/// assert!(Seconds.parse("soon", &next, &mut Vec::new()).is_err());
/// # Ok::<(), BoxError>(())
/// ```
pub trait Dialect: Send + Sync {
    /// The policy its documents configure.
    type Policy: OutlierPolicy;

    /// The dialect's name, for errors and logs (`"HSF JSON"`).
    fn name(&self) -> &'static str;

    /// The [`OutlierPolicy::name`] of the policies it configures: the slot it replaces.
    fn policy_name(&self) -> &'static str;

    /// Reads `text` into the policy that replaces `current` (the policy in force in that slot,
    /// whose callbacks or counters the new one may keep), adding to `notes` what an operator
    /// should know of a document that is accepted: keys that were ignored (a misspelling, with
    /// the key it likely meant), detection switched off by it.
    fn parse(
        &self,
        text: &str,
        current: &Self::Policy,
        notes: &mut Vec<String>,
    ) -> Result<Self::Policy, BoxError>;
}

/// Adds the notes of a document's ignored keys to `notes`, or, for a strict dialect, refuses the
/// document with them.
///
/// ```
/// use tower_outlier_core::dialect::note_or_refuse;
///
/// let mut notes = Vec::new();
/// note_or_refuse(false, vec!["unknown key `x`".into()], &mut notes)?;
/// assert_eq!(notes, ["unknown key `x`"]);
/// assert!(note_or_refuse(true, vec!["unknown key `x`".into()], &mut notes).is_err());
/// # Ok::<(), tower_outlier_core::BoxError>(())
/// ```
pub fn note_or_refuse(
    strict: bool,
    ignored: Vec<String>,
    notes: &mut Vec<String>,
) -> Result<(), BoxError> {
    if strict && !ignored.is_empty() {
        return Err(format!("refused as strict: {}", ignored.join("; ")).into());
    }
    notes.extend(ignored);
    Ok(())
}
