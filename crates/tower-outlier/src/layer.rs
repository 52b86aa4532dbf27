//! The layer users configure.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;
use tower_outlier_core::{
    Clock, DynOutlierPolicy, EjectionBudget, EndpointRecord, NetworkErrors, Notifier,
    OutlierPolicy, SlowStart, WhenAllOut,
};

use crate::discover::{DiscoverErrors, OutlierDetectionDiscover};
use crate::endpoint::OutlierEndpoint;
use crate::engine::{Settings, DEFAULT_MAX_PUSHBACK};
use crate::hosts::{HostOf, HostRegistry};
use crate::monitor::Monitor;
use crate::probe::{PassiveTrial, ProbeCadence};
use crate::rebuild::KeepService;
use crate::reconfigure::{RulesCell, RulesHandle};
use crate::shared::Shared;

/// Client-side outlier detection for a `tower::discover` stream.
///
/// Wraps a discover stream of services; the result is itself a discover stream, of
/// [`OutlierEndpoint`]s, minus the endpoints the policies eject. Feed it to
/// `tower::balance::p2c::Balance` (usually behind `tower::buffer::Buffer`).
///
/// * `C` classifies results ([`NetworkErrors`] by default; see
///   [`classify`](crate::classify) for the others).
/// * `P` checks ejected endpoints ([`PassiveTrial`] by default; see [`probe`](crate::probe)).
///
#[cfg_attr(feature = "error-rate", doc = "```")]
#[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
/// use std::convert::Infallible;
/// use tower::balance::p2c::Balance;
/// use tower::discover::ServiceList;
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
/// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let endpoints = (0..3).map(|i| service_fn(move |_req: ()| async move { Ok::<_, Infallible>(i) }));
/// let outliers = OutlierDetectionLayer::new(ErrorRatePolicy::new(
///     ErrorRateConfig::edas_spring_cloud().error_rate_threshold(0.5).build()?,
/// ));
/// let monitor = outliers.monitor();
/// let mut balancer = ServiceBuilder::new()
///     .layer_fn(Balance::new)
///     .layer(outliers)
///     .service(ServiceList::new(endpoints));
/// let answer = balancer.ready().await?.call(()).await?;
/// assert!(answer < 3);
/// assert_eq!(monitor.snapshot().endpoints.len(), 3);
/// # Ok(()) }
/// ```
pub struct OutlierDetectionLayer<C = NetworkErrors, P = PassiveTrial, R = KeepService> {
    discover_errors: DiscoverErrors,
    rules: Arc<RulesCell>,
    hosts: Option<(HostRegistry, HostOf)>,
    budget: Option<EjectionBudget>,
    all_out: Option<WhenAllOut>,
    max_pushback: Duration,
    slow_start: Option<SlowStart>,
    degraded_hold: Duration,
    cadence: ProbeCadence,
    clock: Clock,
    classifier: C,
    probe: P,
    rebuild: R,
    monitor: Monitor,
}

impl OutlierDetectionLayer {
    /// A layer running `policy`, classifying with [`NetworkErrors`] and recovering by passive
    /// trial. The ejection budget is the policy's.
    pub fn new(policy: impl OutlierPolicy) -> Self {
        let monitor = Monitor::new();
        let rules = RulesCell::new(
            vec![<dyn DynOutlierPolicy>::from_policy(policy)],
            monitor.registry().clone(),
        );
        OutlierDetectionLayer {
            discover_errors: DiscoverErrors::PassThrough,
            monitor,
            rules,
            hosts: None,
            budget: None,
            all_out: None,
            max_pushback: DEFAULT_MAX_PUSHBACK,
            slow_start: None,
            degraded_hold: Duration::ZERO,
            cadence: ProbeCadence::new(),
            clock: Clock::auto(),
            classifier: NetworkErrors,
            probe: PassiveTrial,
            rebuild: KeepService,
        }
    }
}

impl<C, P, R> OutlierDetectionLayer<C, P, R> {
    /// Adds another policy. All policies judge every endpoint; the first that calls it an
    /// outlier ejects it, and all ejections spend from the one budget.
    ///
    /// A [`monitor`](Self::monitor) taken before or after shows the same endpoints, each with
    /// the windows of all the policies of the layer that built its adaptor. A
    /// [`rules`](Self::rules) handle belongs to the policies it was taken with: take it after
    /// the last `with_policy` (dry run and overrides set through an earlier one stay with it).
    pub fn with_policy(mut self, policy: impl OutlierPolicy) -> Self {
        // A new set of rules of its own: a clone of this layer, or a handle taken before, keeps
        // the policies it had.
        let mut policies = self.rules.current().policies.to_vec();
        policies.push(<dyn DynOutlierPolicy>::from_policy(policy));
        self.rules = RulesCell::new(policies, self.monitor.registry().clone());
        self
    }

    /// Sets the shared ejection budget (by default the first policy's that has one, else 20 % with
    /// at least one).
    pub fn budget(mut self, budget: EjectionBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Sets what the layer does when its rules would leave the balancer no endpoint to pick
    /// ([`WhenAllOut`]): keep the last one (EDAS and HSF; the default when no policy says, and
    /// this library's recommendation; linkerd's preset too), fail fast (gRPC; with
    /// [`fail_fast`](Self::fail_fast) in front of the balancer), or Envoy's panic threshold. By
    /// default the first policy's choice: each detector preset brings its system's.
    ///
    #[cfg_attr(feature = "detectors", doc = "```")]
    #[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
    /// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer, WhenAllOut};
    ///
    /// // gRPC's detector, but the last endpoint kept in rather than every pick failing.
    /// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::grpc().build()?))
    ///     .when_all_out(WhenAllOut::KeepLast);
    /// # let _ = layer;
    /// # Ok::<(), tower_outlier::ConfigError>(())
    /// ```
    pub fn when_all_out(mut self, choice: WhenAllOut) -> Self {
        self.all_out = Some(choice);
        self
    }

    /// Sets the longest a server's pushback keeps its endpoint out (default 300 s, linkerd's
    /// cap; `Duration::ZERO` ignores pushback). A 429 or 503 with `Retry-After` or a rate
    /// limiter's reset headers ([`pushback::asked_wait`](crate::pushback::asked_wait)), or a gRPC
    /// status with `grpc-retry-pushback-ms`, read by [`ServerErrors`](crate::ServerErrors) and
    /// [`GrpcErrors`](crate::grpc::GrpcErrors), asks the layer to leave the endpoint alone that
    /// long ([`pushback`](crate::pushback)): it is ejected for the time asked, within the budget
    /// and never the last, and comes back without a trial when the time is up; where the budget
    /// keeps it in, its load is infinite for that long, so p2c picks it only against another
    /// endpoint that asked too.
    ///
    #[cfg_attr(feature = "error-rate", doc = "```")]
    #[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
    /// use std::time::Duration;
    /// use tower_outlier::{ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer, ServerErrors};
    ///
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?))
    ///     .classifier(ServerErrors)
    ///     .max_pushback(Duration::from_secs(30));
    /// # let _ = layer;
    /// # Ok::<(), tower_outlier::ConfigError>(())
    /// ```
    pub fn max_pushback(mut self, longest: Duration) -> Self {
        self.max_pushback = longest;
        self
    }

    /// Ramps up the traffic of an endpoint that joins a fleet already serving, or is re-admitted
    /// after an ejection, over `ramp`'s window (Envoy's slow start; off by default). While it
    /// ramps, the endpoint takes part in only a share of the balancer's power-of-two-choices
    /// draws and loses the others, so that with even costs it gets
    /// `max(min_weight, (t / window)^(1 / aggression))` of a full endpoint's share; where it wins
    /// or loses the draws it takes part in on cost (more calls in flight elsewhere, a weight), its
    /// share moves as that cost says. A warming server (a JIT, cold caches, a pool still filling)
    /// is not handed a full share at once, and one that fails again after its re-admission fails
    /// fewer calls before it is judged. Endpoints present from the start do not ramp (they would
    /// all ramp together), nor does one re-admitted in dry run (it never left the balancer).
    ///
    #[cfg_attr(feature = "detectors", doc = "```")]
    #[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
    /// use std::time::Duration;
    /// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer, SlowStart};
    ///
    /// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?))
    ///     .slow_start(SlowStart::new(Duration::from_secs(30)).build()?);
    /// # let _ = layer;
    /// # Ok::<(), tower_outlier::ConfigError>(())
    /// ```
    pub fn slow_start(mut self, ramp: SlowStart) -> Self {
        self.slow_start = Some(ramp);
        self
    }

    /// Reads what servers say of their own state (Envoy's `detect_degraded_hosts`; off by
    /// default): a response carrying `x-envoy-degraded`, read by
    /// [`ServerErrors`](crate::ServerErrors) and [`GrpcErrors`](crate::grpc::GrpcErrors) (or
    /// reported by a classifier of your own through
    /// [`Recorder::degraded`](crate::classify::Recorder::degraded)), marks its endpoint degraded
    /// for `hold`, or until a response without it. A degraded endpoint stays in the balancer's
    /// set but is picked only when no endpoint that is not can take the call: p2c takes it only
    /// against another degraded endpoint, or when the others are not ready (at a concurrency
    /// limit, reconnecting). Once `hold` has passed it competes again, and its next response says
    /// whether it still is. Its failures still count: ejection wins over degradation.
    /// `Duration::ZERO` turns it off.
    ///
    #[cfg_attr(feature = "detectors", doc = "```")]
    #[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
    /// use std::time::Duration;
    /// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer, ServerErrors};
    ///
    /// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::envoy().build()?))
    ///     .classifier(ServerErrors)
    ///     .detect_degraded(Duration::from_secs(10));
    /// # let _ = layer;
    /// # Ok::<(), tower_outlier::ConfigError>(())
    /// ```
    pub fn detect_degraded(mut self, hold: Duration) -> Self {
        self.degraded_hold = hold;
        self
    }

    /// Sets when the active probe's checks run ([`ProbeCadence`]): the first check after an
    /// endpoint is taken out, the interval while it fails them, their jitter and timeout, and
    /// how many passes in a row bring back an endpoint that has failed one — Envoy's
    /// health-check fields. Without it, the ejecting policy's own timing, with 20 % jitter where
    /// that has none, so that a fleet of clients does not probe in step. A passive trial sends
    /// no check and is not timed by it.
    ///
    #[cfg_attr(feature = "detectors", doc = "```")]
    #[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
    /// use std::time::Duration;
    /// use tower_outlier::probe::ProbeCadence;
    /// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
    ///
    /// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?))
    ///     .probe_cadence(ProbeCadence::new().interval(Duration::from_secs(2)).healthy_threshold(2));
    /// # let _ = layer;
    /// # Ok::<(), tower_outlier::ConfigError>(())
    /// ```
    pub fn probe_cadence(mut self, cadence: ProbeCadence) -> Self {
        self.cadence = cadence;
        self
    }

    /// Makes an endpoint a fresh service when it returns after calls of it timed out or failed in
    /// transport, instead of a clone of the one it had ([`rebuild`](crate::rebuild)): before its
    /// recovery probe, which then runs on the new service, or its re-admission, once per
    /// ejection. A clone shares its original's connections, which a restarted server or a black
    /// hole may have left dead.
    ///
    #[cfg_attr(feature = "detectors", doc = "```")]
    #[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
    /// use tower_outlier::rebuild::rebuild_fn;
    /// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
    ///
    /// # #[derive(Clone)] struct Client(String);
    /// # impl Client { fn connect(to: &str) -> Self { Client(to.to_owned()) } }
    /// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?))
    ///     .rebuild_on_return(rebuild_fn(|address: &String| Client::connect(address)));
    /// # let _ = layer;
    /// # Ok::<(), tower_outlier::ConfigError>(())
    /// ```
    pub fn rebuild_on_return<R2>(self, rebuild: R2) -> OutlierDetectionLayer<C, P, R2> {
        let (layer, classifier, probe, _) = self.into_parts();
        layer.with_parts(classifier, probe, rebuild)
    }

    /// Sets the clock calls are timed with. The default, [`Clock::auto`], chose when the layer was
    /// built: tokio's clock if it was paused (a test), else the CPU's time-stamp counter, which
    /// halves the per-call cost but ignores tokio's paused clock.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the classifier deciding which results count as failures.
    ///
    /// Each endpoint handle holds a copy, and each call's response future another (as
    /// tower-http makes a classifier per request), so keep it cheap to clone: the crate's
    /// classifiers are zero-sized or `Copy`; share anything larger behind an `Arc`.
    pub fn classifier<C2>(self, classifier: C2) -> OutlierDetectionLayer<C2, P, R> {
        let (layer, _, probe, rebuild) = self.into_parts();
        layer.with_parts(classifier, probe, rebuild)
    }

    /// Sets how ejected endpoints are checked for recovery (an active probe instead of the
    /// passive trial).
    pub fn probe<P2>(self, probe: P2) -> OutlierDetectionLayer<C, P2, R> {
        let (layer, classifier, _, rebuild) = self.into_parts();
        layer.with_parts(classifier, probe, rebuild)
    }

    /// The layer apart from its typed parts (classifier, probe, rebuild), for the builders that
    /// change one of their types.
    fn into_parts(self) -> (OutlierDetectionLayer<(), (), ()>, C, P, R) {
        let OutlierDetectionLayer {
            discover_errors,
            rules,
            hosts,
            budget,
            all_out,
            max_pushback,
            slow_start,
            degraded_hold,
            cadence,
            clock,
            classifier,
            probe,
            rebuild,
            monitor,
        } = self;
        let layer = OutlierDetectionLayer {
            discover_errors,
            rules,
            hosts,
            budget,
            all_out,
            max_pushback,
            slow_start,
            degraded_hold,
            cadence,
            clock,
            classifier: (),
            probe: (),
            rebuild: (),
            monitor,
        };
        (layer, classifier, probe, rebuild)
    }

    /// Sets what the adaptor does with an error from the upstream discover stream: pass it to the
    /// balancer (the default, as tower's own stack does; tower's `Balance` then fails every later
    /// call, and `Buffer` with it), or log it and keep serving the endpoints the upstream gave so
    /// far ([`DiscoverErrors::KeepServing`], what the README's stack uses).
    ///
    #[cfg_attr(feature = "error-rate", doc = "```")]
    #[cfg_attr(not(feature = "error-rate"), doc = "```ignore")]
    /// use tower_outlier::{DiscoverErrors, ErrorRateConfig, ErrorRatePolicy, OutlierDetectionLayer};
    ///
    /// let layer = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?))
    ///     .discover_errors(DiscoverErrors::KeepServing);
    /// # let _ = layer;
    /// # Ok::<(), tower_outlier::ConfigError>(())
    /// ```
    pub fn discover_errors(mut self, choice: DiscoverErrors) -> Self {
        self.discover_errors = choice;
        self
    }

    /// A guard for the front of this layer's balancer that fails calls at once, with
    /// [`NoEndpointAvailable`](crate::fail_fast::NoEndpointAvailable), while the rules leave the
    /// balancer no endpoint ([`WhenAllOut::FailFast`]); without it such calls wait for an
    /// endpoint to come back.
    ///
    #[cfg_attr(feature = "detectors", doc = "```")]
    #[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
    /// use std::convert::Infallible;
    /// use tower::balance::p2c::Balance;
    /// use tower::discover::Change;
    /// use tower::{service_fn, ServiceBuilder};
    /// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
    ///
    /// let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::grpc().build()?));
    /// let backend = service_fn(|_: ()| async { Ok::<_, Infallible>(()) });
    /// let discover = futures::stream::iter([Ok::<_, Infallible>(Change::Insert(0, backend))]);
    /// let balancer = ServiceBuilder::new()
    ///     .layer(outliers.fail_fast())
    ///     .layer_fn(Balance::new)
    ///     .layer(outliers)
    ///     .service(discover);
    /// # let _ = balancer;
    /// # Ok::<(), tower_outlier::ConfigError>(())
    /// ```
    pub fn fail_fast(&self) -> crate::fail_fast::FailFastLayer {
        crate::fail_fast::FailFastLayer::new(self.monitor.registry().clone())
    }

    /// A handle for reading per-endpoint state. Every adaptor this layer builds reports to it.
    pub fn monitor(&self) -> Monitor {
        self.monitor.clone()
    }

    /// A handle for changing the layer's policies while it runs: every adaptor it built, or
    /// will build, applies what the handle publishes. Take it once the policies are added.
    pub fn rules(&self) -> RulesHandle {
        RulesHandle::new(self.rules.clone())
    }

    /// Shares hosts with the other layers given `registry` (HSF's `ipDimension` on for this
    /// service): an endpoint this layer ejects holds its host out in the registry, and this layer
    /// ejects its endpoints on a host another one holds out — within its own budget, never its
    /// last endpoint — and re-admits them on trial when no layer holds the host out any more.
    /// `host_of` finds the host of a discover key. See [`hosts`](crate::hosts).
    pub fn share_hosts(mut self, registry: HostRegistry, host_of: HostOf) -> Self {
        self.hosts = Some((registry, host_of));
        self
    }

    fn settings(&self) -> Settings {
        let mut settings = Settings::new(
            &self.rules,
            self.budget,
            self.all_out,
            self.max_pushback,
            self.clock.clone(),
            self.hosts.clone(),
        );
        settings.slow_start = self.slow_start;
        settings.degraded_hold = self.degraded_hold;
        settings.cadence = self.cadence.clone();
        settings
    }

    /// Wraps one service as an endpoint tracked by no adaptor: its calls are recorded and it
    /// reports its [`Load`](tower::load::Load), but nothing ejects it. For custom balancers and
    /// benchmarks.
    pub fn endpoint<S>(&self, service: S) -> OutlierEndpoint<S, C>
    where
        C: Clone,
    {
        // No adaptor can eject this endpoint, so its load never asks for evidence.
        let notifier = Notifier::new();
        notifier.set_room_to_eject(false);
        let record = EndpointRecord::new(
            self.clock.clone(),
            self.rules
                .current()
                .policies
                .iter()
                .map(|p| p.new_endpoint())
                .collect(),
            Arc::new(notifier),
        );
        OutlierEndpoint::new(service, Shared::new(record), self.classifier.clone())
    }
}

impl OutlierDetectionLayer<(), (), ()> {
    /// The layer with these typed parts.
    fn with_parts<C, P, R>(
        self,
        classifier: C,
        probe: P,
        rebuild: R,
    ) -> OutlierDetectionLayer<C, P, R> {
        OutlierDetectionLayer {
            discover_errors: self.discover_errors,
            rules: self.rules,
            hosts: self.hosts,
            budget: self.budget,
            all_out: self.all_out,
            max_pushback: self.max_pushback,
            slow_start: self.slow_start,
            degraded_hold: self.degraded_hold,
            cadence: self.cadence,
            clock: self.clock,
            classifier,
            probe,
            rebuild,
            monitor: self.monitor,
        }
    }
}

impl<D, C, P, R> Layer<D> for OutlierDetectionLayer<C, P, R>
where
    D: tower::discover::Discover,
    C: Clone,
    P: Clone,
    R: crate::rebuild::Rebuild<D::Key, D::Service> + Clone + Send + Sync + 'static,
{
    type Service = OutlierDetectionDiscover<D, C, P>;

    fn layer(&self, discover: D) -> Self::Service {
        OutlierDetectionDiscover::new(
            discover,
            Arc::new(self.settings()),
            self.classifier.clone(),
            self.probe.clone(),
            self.monitor.registry().clone(),
        )
        .with_discover_errors(self.discover_errors)
        .with_rebuild(Box::new(self.rebuild.clone()))
    }
}

impl<C: Clone, P: Clone, R: Clone> Clone for OutlierDetectionLayer<C, P, R> {
    fn clone(&self) -> Self {
        OutlierDetectionLayer {
            discover_errors: self.discover_errors,
            rules: self.rules.clone(),
            hosts: self.hosts.clone(),
            budget: self.budget,
            all_out: self.all_out,
            max_pushback: self.max_pushback,
            slow_start: self.slow_start,
            degraded_hold: self.degraded_hold,
            cadence: self.cadence.clone(),
            clock: self.clock.clone(),
            classifier: self.classifier.clone(),
            probe: self.probe.clone(),
            rebuild: self.rebuild.clone(),
            monitor: self.monitor.clone(),
        }
    }
}

impl<C: fmt::Debug, P: fmt::Debug, R: fmt::Debug> fmt::Debug for OutlierDetectionLayer<C, P, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutlierDetectionLayer")
            .field("policies", &self.rules.current().policies)
            .field("budget", &self.budget)
            .field("when_all_out", &self.all_out)
            .field("max_pushback", &self.max_pushback)
            .field("slow_start", &self.slow_start)
            .field("degraded_hold", &self.degraded_hold)
            .field("probe_cadence", &self.cadence)
            .field("clock", &self.clock)
            .field("classifier", &self.classifier)
            .field("probe", &self.probe)
            .field("rebuild", &self.rebuild)
            .finish()
    }
}
