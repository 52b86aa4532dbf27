//! Rules that change while the service runs: the handle that replaces a running layer's policies,
//! and the documents it reads.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use futures::{Stream, StreamExt};
use tower_outlier_core::dialect::Dialect;
use tower_outlier_core::{DynOutlierPolicy, Lock, Notifier, OutlierPolicy};

use crate::controls::Controls;
use crate::monitor::Registry;

/// The policies a layer runs, in its order, and the version they were published as.
pub(crate) struct Rules {
    pub(crate) version: u64,
    pub(crate) policies: Arc<[Arc<dyn DynOutlierPolicy>]>,
}

/// What a layer, its [`RulesHandle`]s and its adaptors share.
pub(crate) struct RulesCell {
    // Read by every adaptor on every poll: the version alone, without the lock.
    version: AtomicU64,
    // The same for the operator's controls, which change without new rules.
    controls_version: AtomicU64,
    state: Lock<CellState>,
    registry: Arc<Registry>,
}

struct CellState {
    rules: Arc<Rules>,
    controls: Arc<Controls>,
    // The adaptors to wake when the rules change (dropped adaptors are pruned).
    subscribers: Vec<Weak<Notifier>>,
}

impl RulesCell {
    pub(crate) fn new(
        policies: Vec<Arc<dyn DynOutlierPolicy>>,
        registry: Arc<Registry>,
    ) -> Arc<Self> {
        Arc::new(RulesCell {
            version: AtomicU64::new(0),
            controls_version: AtomicU64::new(0),
            state: Lock::new(CellState {
                controls: Arc::default(),
                rules: Arc::new(Rules {
                    version: 0,
                    policies: policies.into(),
                }),
                subscribers: Vec::new(),
            }),
            registry,
        })
    }

    /// The version of the newest rules.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The newest rules.
    pub(crate) fn current(&self) -> Arc<Rules> {
        self.state.lock().rules.clone()
    }

    /// The version of the newest controls.
    pub(crate) fn controls_version(&self) -> u64 {
        self.controls_version.load(Ordering::Acquire)
    }

    /// The newest controls, and their version.
    pub(crate) fn controls(&self) -> (Arc<Controls>, u64) {
        let state = self.state.lock();
        (state.controls.clone(), self.controls_version())
    }

    /// Publishes controls changed by `change` and wakes every adaptor; what `change` returns.
    pub(crate) fn control<T>(&self, change: impl FnOnce(&mut Controls) -> T) -> T {
        let mut state = self.state.lock();
        let out = change(Arc::make_mut(&mut state.controls));
        self.controls_version.fetch_add(1, Ordering::AcqRel);
        state
            .subscribers
            .retain(|subscriber| match subscriber.upgrade() {
                Some(notifier) => {
                    notifier.notify();
                    true
                }
                None => false,
            });
        out
    }

    /// Registers an adaptor to wake when the rules change.
    pub(crate) fn subscribe(&self, notifier: &Arc<Notifier>) {
        let mut state = self.state.lock();
        // Adaptors come and go; forget the dropped ones here too, not only on a publish.
        state.subscribers.retain(|s| s.strong_count() > 0);
        state.subscribers.push(Arc::downgrade(notifier));
    }

    fn publish(
        &self,
        slot: usize,
        policy: Arc<dyn DynOutlierPolicy>,
    ) -> Result<u64, ReconfigureError> {
        let mut state = self.state.lock();
        let current = &state.rules.policies;
        let Some(previous) = current.get(slot) else {
            return Err(ReconfigureError::new(Kind::NoSlot {
                slot,
                slots: current.len(),
            }));
        };
        if previous.name() != policy.name() {
            return Err(ReconfigureError::new(Kind::Mismatch {
                slot,
                expected: previous.name(),
                given: policy.name(),
            }));
        }
        let mut policies = current.to_vec();
        policies[slot] = policy;
        let version = state.rules.version + 1;
        state.rules = Arc::new(Rules {
            version,
            policies: policies.into(),
        });
        self.version.store(version, Ordering::Release);
        state
            .subscribers
            .retain(|subscriber| match subscriber.upgrade() {
                Some(notifier) => {
                    notifier.notify();
                    true
                }
                None => false,
            });
        drop(state);
        self.registry.rules_error(None);
        Ok(version)
    }

    /// A source's trouble that is not a refused document (an etcd key deleted), shown as the
    /// rules' error until it is cleared or rules are applied.
    #[cfg(any(feature = "etcd", feature = "file-source"))]
    fn source_trouble(&self, trouble: Option<String>) {
        self.registry.source_trouble(trouble);
    }

    /// The number of policies the layer runs.
    pub(crate) fn slots(&self) -> usize {
        self.state.lock().rules.policies.len()
    }

    /// Refuses a slot the layer does not have.
    pub(crate) fn check_slot(&self, slot: usize) -> Result<(), ReconfigureError> {
        let slots = self.slots();
        if slot < slots {
            Ok(())
        } else {
            Err(ReconfigureError::new(Kind::NoSlot { slot, slots }))
        }
    }

    fn reject(&self, error: &ReconfigureError) {
        self.registry.rules_error(Some(error.to_string()));
        tracing::warn!(
            target: "tower_outlier",
            error = %error,
            version_in_force = self.version(),
            "reconfiguration rejected: the rules in force stay"
        );
    }
}

/// Replaces the policies of a running layer, from typed configuration or from documents in the
/// dialects of the systems this library follows ([`dialect`](crate::dialect)). Take one from
/// [`OutlierDetectionLayer::rules`](crate::OutlierDetectionLayer::rules); clones share it, and it
/// reaches every adaptor the layer built or will build.
///
/// A new configuration is checked here, and an invalid one is refused with its error while the
/// rules in force stay. A valid one is published at once and applied by each adaptor on its own
/// task, the next time the balancer polls it (behind `Buffer`: the next request), without pausing
/// traffic. Every endpoint keeps what the new rules can use of its history: see
/// [`rules`](crate::rules), section 12, setting by setting.
///
#[cfg_attr(feature = "error-rate", doc = "```")]
#[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
/// let rules = layer.rules();
/// // Later, while the service runs: eject above 20 % errors instead of 50 %.
/// let version = rules.replace(0, ErrorRatePolicy::new(
///     ErrorRateConfig::hsf().error_rate_threshold(0.2).build()?,
/// ))?;
/// assert_eq!(version, 1);
/// // A policy of another kind cannot take the slot of the error-rate policy.
/// # #[cfg(feature = "weight")] {
/// use tower_outlier::weight::{WeightConfig, WeightPolicy};
/// assert!(rules.replace(0, WeightPolicy::new(WeightConfig::sofarpc().build()?)).is_err());
/// assert_eq!(rules.version(), 1);
/// # }
/// # Ok::<(), tower::BoxError>(())
/// ```
#[derive(Clone)]
pub struct RulesHandle {
    cell: Arc<RulesCell>,
}

impl RulesHandle {
    pub(crate) fn new(cell: Arc<RulesCell>) -> Self {
        RulesHandle { cell }
    }

    /// Shows (or, with `None`, clears) a configuration source's trouble in
    /// `Snapshot::rules_error`.
    #[cfg(any(feature = "etcd", feature = "file-source"))]
    pub(crate) fn source_trouble(&self, trouble: Option<String>) {
        self.cell.source_trouble(trouble);
    }

    pub(crate) fn cell(&self) -> &Arc<RulesCell> {
        &self.cell
    }

    /// The version of the newest rules: 0 as built, one more for each accepted change.
    pub fn version(&self) -> u64 {
        self.cell.version()
    }

    /// The policies in force, in the layer's order.
    pub fn policies(&self) -> Vec<Arc<dyn DynOutlierPolicy>> {
        self.cell.current().policies.to_vec()
    }

    /// The first policy in force of type `P`, as its own type.
    ///
    #[cfg_attr(feature = "error-rate", doc = "```")]
    #[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
    /// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    ///
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?));
    /// let in_force = layer.rules().policy::<ErrorRatePolicy>().expect("the layer's policy");
    /// assert_eq!(in_force.config().error_rate_threshold(), 0.5);
    /// # Ok::<(), tower::BoxError>(())
    /// ```
    pub fn policy<P: OutlierPolicy>(&self) -> Option<Arc<P>> {
        self.cell
            .current()
            .policies
            .iter()
            .find_map(|policy| policy.downcast_arc::<P>())
    }

    /// Replaces the policy in `slot` (its position in the layer: the first policy is 0) by
    /// `policy`, which must be of the same kind (the same [`OutlierPolicy::name`]). Returns the new
    /// version.
    pub fn replace(
        &self,
        slot: usize,
        policy: impl OutlierPolicy,
    ) -> Result<u64, ReconfigureError> {
        self.replace_arc(slot, <dyn DynOutlierPolicy>::from_policy(policy))
    }

    /// [`replace`](Self::replace) with a policy already shared: one of [`policies`](Self::policies),
    /// or any policy through [`DynOutlierPolicy::from_shared`](tower_outlier_core::DynOutlierPolicy).
    pub fn replace_arc(
        &self,
        slot: usize,
        policy: Arc<dyn DynOutlierPolicy>,
    ) -> Result<u64, ReconfigureError> {
        let result = self.cell.publish(slot, policy.clone());
        self.log(&result, policy.name(), "typed configuration");
        result
    }

    /// Reads `text` in `dialect` and replaces the layer's policy of the kind the dialect
    /// configures: the first slot whose policy has the dialect's policy name and type. Returns
    /// the new version; on any error the rules in force stay, and a layer with policies of that
    /// name but none of that type refuses the document.
    ///
    /// What an operator should know of an accepted document (keys that were ignored, detection
    /// switched off by it) is logged at WARN and shown in
    /// [`Snapshot::rules_notes`](crate::Snapshot).
    pub fn apply<D: Dialect + ?Sized>(
        &self,
        dialect: &D,
        text: &str,
    ) -> Result<u64, ReconfigureError> {
        let rules = self.cell.current();
        let kind = dialect.policy_name();
        let mut notes = Vec::new();
        let named = |p: &Arc<dyn DynOutlierPolicy>| p.name() == kind;
        let typed = rules.policies.iter().enumerate().find_map(|(slot, p)| {
            let current = p.downcast_ref::<D::Policy>().filter(|_| named(p))?;
            Some((slot, current))
        });
        let result = match typed {
            None if rules.policies.iter().any(named) => {
                Err(ReconfigureError::new(Kind::OtherType {
                    policy: kind,
                    dialect: dialect.name(),
                }))
            }
            None => Err(ReconfigureError::new(Kind::NoPolicy {
                policy: kind,
                running: rules.policies.iter().map(|p| p.name()).collect(),
            })),
            Some((slot, current)) => match dialect.parse(text, current, &mut notes) {
                Ok(policy) => self
                    .cell
                    .publish(slot, <dyn DynOutlierPolicy>::from_policy(policy)),
                Err(source) => Err(ReconfigureError::new(Kind::Document {
                    dialect: dialect.name(),
                    source,
                })),
            },
        };
        self.log(&result, kind, dialect.name());
        if let Ok(version) = result {
            for note in &notes {
                tracing::warn!(
                    target: "tower_outlier",
                    version,
                    source = dialect.name(),
                    note = note.as_str(),
                    "reconfiguration accepted with a note"
                );
            }
            self.cell.registry.rules_notes(notes);
        }
        result
    }

    /// Applies every document `documents` yields (skipping one identical to the last), in
    /// `dialect`, until the stream ends: the
    /// generic source for any registry client (etcd, Consul, Nacos, an xDS client) or a
    /// `tokio::sync::watch` channel turned into a stream. A rejected document is logged and shows
    /// in the monitor; the next one is read all the same. Run it on a task of its own.
    pub async fn follow<D, S>(self, dialect: D, documents: S)
    where
        D: Dialect,
        S: Stream,
        S::Item: AsRef<str>,
    {
        let mut documents = std::pin::pin!(documents);
        let mut last: Option<String> = None;
        while let Some(text) = documents.next().await {
            // Registries re-deliver; an identical document would only re-key every endpoint.
            if last.as_deref() == Some(text.as_ref()) {
                continue;
            }
            let _ = self.apply(&dialect, text.as_ref());
            last = Some(text.as_ref().to_owned());
        }
    }

    /// Applies the document a `tokio::sync::watch` channel holds now, then each new one, until
    /// every sender is gone. Run it on a task of its own.
    pub async fn follow_watch<D: Dialect>(
        self,
        dialect: D,
        mut documents: tokio::sync::watch::Receiver<String>,
    ) {
        let mut last: Option<String> = None;
        loop {
            let text = documents.borrow_and_update().clone();
            if last.as_deref() != Some(text.as_str()) {
                let _ = self.apply(&dialect, &text);
                last = Some(text);
            }
            if documents.changed().await.is_err() {
                return;
            }
        }
    }

    fn log(&self, result: &Result<u64, ReconfigureError>, policy: &'static str, source: &str) {
        match result {
            Ok(version) => tracing::info!(
                target: "tower_outlier",
                version,
                policy,
                source,
                "reconfiguration accepted: adaptors apply it on their next poll"
            ),
            Err(error) => self.cell.reject(error),
        }
    }
}

impl fmt::Debug for RulesHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RulesHandle")
            .field("version", &self.version())
            .finish()
    }
}

mod error;
mod operator;
use error::Kind;
pub use error::ReconfigureError;
