//! When active checks run: Envoy's health-check cadence, for the probes of this layer.

use std::sync::Arc;
use std::time::Duration;

use tower_outlier_core::Dice;

/// The default jitter of a check whose timing has none of its own: each interval is lengthened
/// by up to this share of itself, so that the clients of a fleet that ejected an endpoint at the
/// same moment do not probe it in step.
const DEFAULT_JITTER_PERCENT: u32 = 20;

/// When the active checks of a layer run, in the words of Envoy's health check
/// (`config.core.v3.HealthCheck`): the first check after an endpoint is taken out, the interval
/// between checks while it fails them, the jitter that keeps a fleet of clients from probing in
/// step, how long a check may take, and how many passes in a row bring back an endpoint that has
/// failed one. Given to [`OutlierDetectionLayer::probe_cadence`](crate::OutlierDetectionLayer::probe_cadence).
///
/// It times the checks of an active [`Probe`](super::Probe): of an ejected endpoint, of one
/// avoided after a timeout, and, with [`no_traffic_interval`](Self::no_traffic_interval), of
/// endpoints in service that get no traffic. A passive trial
/// ([`PassiveTrial`](super::PassiveTrial)) sends no check, and keeps its policy's ejection times.
///
/// What is left unset keeps the layer's default:
///
/// | Envoy | HAProxy | here | default |
/// |---|---|---|---|
/// | `unhealthy_edge_interval` | `fastinter` | [`first_check`](Self::first_check) | the ejecting policy's ejection time (1 s after a timeout) |
/// | `interval`, `unhealthy_interval` | `downinter` | [`interval`](Self::interval) | the ejecting policy's back-off (2 s after a timeout) |
/// | `interval_jitter_percent` | | [`interval_jitter_percent`](Self::interval_jitter_percent) | 20 %, where the policy's back-off has no jitter of its own |
/// | `interval_jitter` | | [`interval_jitter`](Self::interval_jitter) | none |
/// | `initial_jitter` | | [`initial_jitter`](Self::initial_jitter) | none |
/// | `timeout` | `timeout check` | [`timeout`](Self::timeout) | the policy's recovery unit (1 s after a timeout) |
/// | `healthy_threshold` | `rise` | [`healthy_threshold`](Self::healthy_threshold) | 1 |
/// | `no_traffic_interval` | `inter` | [`no_traffic_interval`](Self::no_traffic_interval) | none: an endpoint in service is judged by its calls only |
/// | `unhealthy_threshold` | `fall` | [`unhealthy_threshold`](Self::unhealthy_threshold) | 3 |
///
/// The jitter is drawn from the layer's own dice, seeded at random unless [`seed`](Self::seed)
/// fixes it (for repeatable tests and benchmarks).
///
#[cfg_attr(feature = "detectors", doc = "```")]
#[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
/// use std::time::Duration;
/// use tower_outlier::probe::{request_probe, ProbeCadence};
/// use tower_outlier::{DetectorConfig, DetectorPolicy, NetworkErrors, OutlierDetectionLayer};
///
/// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
///     DetectorConfig::recommended().build().unwrap(),
/// ))
/// .probe(request_probe(
///     || http::Request::get("http://ignored/healthz").body(String::new()).unwrap(),
///     NetworkErrors,
/// ))
/// .probe_cadence(
///     ProbeCadence::new()
///         .first_check(Duration::from_millis(500))
///         .interval(Duration::from_secs(3))
///         .interval_jitter_percent(10)
///         .timeout(Duration::from_millis(500))
///         .healthy_threshold(2),
/// );
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct ProbeCadence {
    pub(crate) first_check: Option<Duration>,
    pub(crate) interval: Option<Duration>,
    pub(crate) jitter_percent: Option<u32>,
    pub(crate) jitter: Duration,
    pub(crate) initial_jitter: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) healthy_threshold: u32,
    pub(crate) no_traffic_interval: Option<Duration>,
    pub(crate) unhealthy_threshold: u32,
    pub(crate) dice: Arc<Dice>,
}

/// The default [`ProbeCadence::unhealthy_threshold`]: HAProxy's default `fall`.
const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 3;

impl Default for ProbeCadence {
    fn default() -> Self {
        Self::new()
    }
}

impl ProbeCadence {
    /// The layer's default cadence: the policies' own timing, 20 % jitter where it has none, one
    /// pass to come back; the dice seeded at random.
    pub fn new() -> Self {
        use std::hash::BuildHasher;
        // std's hasher keys are random per process and per call: a seed without `rand`.
        let seed = std::collections::hash_map::RandomState::new().hash_one(0u8);
        ProbeCadence {
            first_check: None,
            interval: None,
            jitter_percent: None,
            jitter: Duration::ZERO,
            initial_jitter: Duration::ZERO,
            timeout: None,
            healthy_threshold: 1,
            no_traffic_interval: None,
            unhealthy_threshold: DEFAULT_UNHEALTHY_THRESHOLD,
            dice: Arc::new(Dice::new(seed)),
        }
    }

    /// The first check after an endpoint is taken out (Envoy's `unhealthy_edge_interval`,
    /// HAProxy's `fastinter`), instead of the ejecting policy's ejection time. Zero checks at
    /// once.
    pub fn first_check(mut self, after: Duration) -> Self {
        self.first_check = Some(after);
        self
    }

    /// The time between checks while the endpoint fails them (Envoy's `interval` and
    /// `unhealthy_interval`, HAProxy's `downinter`), instead of the ejecting policy's back-off.
    /// At least a millisecond.
    pub fn interval(mut self, every: Duration) -> Self {
        self.interval = Some(every.max(Duration::from_millis(1)));
        self
    }

    /// Each interval (and the first check) is lengthened by a random share of itself up to
    /// `percent` % (Envoy's `interval_jitter_percent`). The default is 20 where the ejecting
    /// policy's back-off has no jitter of its own (linkerd's and the recommended back-off do),
    /// none where it has; 0 turns it off.
    pub fn interval_jitter_percent(mut self, percent: u32) -> Self {
        self.jitter_percent = Some(percent);
        self
    }

    /// Each interval (and the first check) is lengthened by a random time up to `most` (Envoy's
    /// `interval_jitter`), beside the percentage.
    pub fn interval_jitter(mut self, most: Duration) -> Self {
        self.jitter = most;
        self
    }

    /// The first check after an endpoint is taken out is put off by a random time up to `most`
    /// more (Envoy's `initial_jitter`).
    pub fn initial_jitter(mut self, most: Duration) -> Self {
        self.initial_jitter = most;
        self
    }

    /// How long a check may take before it counts as failed (Envoy's `timeout`). At least a
    /// millisecond.
    pub fn timeout(mut self, longest: Duration) -> Self {
        self.timeout = Some(longest.max(Duration::from_millis(1)));
        self
    }

    /// After an endpoint failed a check, how many checks in a row it must pass to come back
    /// (Envoy's `healthy_threshold`, HAProxy's `rise`); the checks in between come an
    /// [`interval`](Self::interval) apart. An endpoint that has failed none comes back at its
    /// first pass, as in Envoy. 0 counts as 1.
    pub fn healthy_threshold(mut self, passes: u32) -> Self {
        self.healthy_threshold = passes.max(1);
        self
    }

    /// Checks the endpoints in service that get no traffic (Envoy's `no_traffic_interval`,
    /// HAProxy's `inter`): an endpoint with no call completed or in flight for `every` is checked,
    /// and again every `every` (jittered as the interval is) for as long as it gets none. One
    /// that fails [`unhealthy_threshold`](Self::unhealthy_threshold) checks in a row is taken
    /// out — within the ejection budget, never the last endpoint, as a server's own word is —
    /// and comes back as an ejected endpoint does, at the first check that passes (the
    /// [`healthy_threshold`](Self::healthy_threshold) in a row). So the first call after a quiet
    /// night does not find a server that died in it. Endpoints with traffic are judged by their
    /// calls: a call completed resets the count. Needs a probe that sends checks
    /// ([`Probe::sends_checks`](super::Probe::sends_checks)); off by default. At least a
    /// millisecond.
    pub fn no_traffic_interval(mut self, every: Duration) -> Self {
        self.no_traffic_interval = Some(every.max(Duration::from_millis(1)));
        self
    }

    /// How many checks in a row an endpoint in service must fail to be taken out (Envoy's
    /// `unhealthy_threshold`, HAProxy's `fall`): the checks of
    /// [`no_traffic_interval`](Self::no_traffic_interval). An endpoint avoided after a timeout
    /// is out of the balancer's picks already; its checks only bring it back. 0 counts as 1;
    /// the default is 3.
    pub fn unhealthy_threshold(mut self, failures: u32) -> Self {
        self.unhealthy_threshold = failures.max(1);
        self
    }

    /// Draws the jitter from `seed`: two layers with the same seed jitter alike.
    pub fn seed(mut self, seed: u64) -> Self {
        self.dice = Arc::new(Dice::new(seed));
        self
    }

    /// `base`, as this cadence jitters it: `own_jitter` says the policy's timing is jittered
    /// already (the default percentage then adds none), `first` that this is the first check
    /// after the endpoint was taken out (the initial jitter adds to it).
    pub(crate) fn jittered(&self, base: Duration, own_jitter: bool, first: bool) -> Duration {
        let percent = match self.jitter_percent {
            Some(percent) => percent,
            None if own_jitter => 0,
            None => DEFAULT_JITTER_PERCENT,
        };
        let mut most = scaled(base, f64::from(percent) / 100.0).saturating_add(self.jitter);
        if first {
            most = most.saturating_add(self.initial_jitter);
        }
        if most.is_zero() {
            return base;
        }
        base.saturating_add(scaled(most, self.dice.unit()))
    }
}

/// `d × by`, saturating (a jitter of a huge percentage of a huge interval is no panic).
fn scaled(d: Duration, by: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * by).unwrap_or(Duration::MAX)
}

#[cfg(feature = "envoy")]
impl ProbeCadence {
    /// The cadence an Envoy `HealthCheck` message gives
    /// ([`EnvoyHealthCheck`](crate::detectors::EnvoyHealthCheck)): `unhealthy_edge_interval` as
    /// the [`first_check`](Self::first_check) (the unhealthy interval where it is not given),
    /// `unhealthy_interval` as the [`interval`](Self::interval) (`interval` where it is not
    /// given), the jitters, the `timeout`, the `healthy_threshold`, the `unhealthy_threshold`
    /// and the `no_traffic_interval`; what the message leaves out keeps the default. Its [`notes`](crate::detectors::EnvoyHealthCheck::notes) name the
    /// fields that have no effect here.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier::detectors::EnvoyHealthCheck;
    /// use tower_outlier::probe::ProbeCadence;
    ///
    /// let check = EnvoyHealthCheck::from_json(
    ///     r#"{"timeout": "1s", "interval": "5s", "unhealthy_edge_interval": "0.5s",
    ///         "interval_jitter_percent": 10, "healthy_threshold": 2, "unhealthy_threshold": 2,
    ///         "no_traffic_interval": "60s", "healthy_edge_interval": "1s"}"#,
    /// )?;
    /// let cadence = ProbeCadence::from_envoy(&check);
    /// assert_eq!(check.notes().len(), 1, "healthy_edge_interval: in service, calls judge");
    /// # let _ = cadence;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_envoy(check: &crate::detectors::EnvoyHealthCheck) -> Self {
        let mut cadence = ProbeCadence::new();
        cadence.first_check = check.first_check();
        cadence.interval = check.unhealthy_interval();
        cadence.jitter_percent = check.interval_jitter_percent();
        cadence.jitter = check.interval_jitter().unwrap_or_default();
        cadence.initial_jitter = check.initial_jitter().unwrap_or_default();
        cadence.timeout = check.timeout();
        if let Some(passes) = check.healthy_threshold() {
            cadence = cadence.healthy_threshold(passes);
        }
        if let Some(failures) = check.unhealthy_threshold() {
            cadence = cadence.unhealthy_threshold(failures);
        }
        if let Some(every) = check.no_traffic_interval() {
            cadence = cadence.no_traffic_interval(every);
        }
        cadence
    }
}
