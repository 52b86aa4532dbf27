//! gRPC health checking (`grpc.health.v1`, gRFC A17) as the layer's probe (feature
//! `grpc-health`): one `Health/Watch` stream per endpoint, as a gRPC client watches each
//! subchannel, and `Health/Check` as the recovery probe of an endpoint the rules ejected.
//!
//! What the watch says ([`Probe::watch`]): `SERVING` keeps the endpoint in, or brings it back at
//! once; `NOT_SERVING`, `SERVICE_UNKNOWN` and `UNKNOWN` take it out at once, within the budget and
//! never the last (kept in, p2c avoids it), so a server that drains by setting its status leaves
//! rotation before a single call fails. A server without the health service (`UNIMPLEMENTED`)
//! counts as serving, with one warning, in the watch and in the recovery check alike: an ejected
//! server of that kind passes its check once it answers, and its calls judge it on trial. A stream that fails or ends otherwise is called again
//! after a back-off (1 s, × 1.6 each time in a row, up to 2 minutes: gRPC's connection back-off
//! without its jitter), the endpoint keeping its last word meanwhile: whether its calls fail is
//! the rules' to judge.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::codec::Streaming;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::probe::{Health, HealthStream, Probe, ProbeFuture};

/// gRPC health checking as the layer's probe: `Health/Watch` per endpoint for the service named,
/// `Health/Check` as the recovery probe.
///
#[cfg_attr(feature = "detectors", doc = "```")]
#[cfg_attr(not(feature = "detectors"), doc = "```ignore")]
/// use tower_outlier::grpc_health::GrpcHealth;
/// use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer};
///
/// // Watch the health of one service of each server (`""`: the server as a whole); the layer
/// // then takes tonic `Channel`s (or any gRPC client service) from its discover stream.
/// let layer = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::recommended().build()?))
///     .probe(GrpcHealth::new("helloworld.Greeter"));
/// # let _ = layer;
/// # Ok::<(), tower_outlier::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct GrpcHealth {
    service: Arc<str>,
    first_backoff: Duration,
    max_backoff: Duration,
    // One warning per layer for servers without the health service.
    warned_unimplemented: Arc<AtomicBool>,
}

impl GrpcHealth {
    /// Watches and checks `service` (`""`: the server as a whole).
    pub fn new(service: impl Into<String>) -> Self {
        GrpcHealth {
            service: service.into().into(),
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(120),
            warned_unimplemented: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Sets the back-off before calling `Watch` again after a failure: `first` after the first,
    /// × 1.6 for each in a row, up to `max` (1 s and 2 minutes by default).
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_backoff = first;
        self.max_backoff = max.max(first);
        self
    }

    fn request(&self) -> HealthCheckRequest {
        HealthCheckRequest {
            service: self.service.to_string(),
        }
    }

    fn delay(&self, failures: u32) -> Duration {
        let factor = 1.6f64.powi(failures.saturating_sub(1).min(64) as i32);
        self.first_backoff
            .mul_f64(factor.min(1e6))
            .min(self.max_backoff)
    }
}

impl fmt::Debug for GrpcHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcHealth")
            .field("service", &self.service)
            .field("first_backoff", &self.first_backoff)
            .field("max_backoff", &self.max_backoff)
            .finish()
    }
}

/// What `Watch` says, as the layer reads it: only `SERVING` is serving (gRFC A17).
fn health_of(message: &HealthCheckResponse) -> Health {
    if message.status == ServingStatus::Serving as i32 {
        Health::Serving
    } else {
        Health::NotServing
    }
}

/// Where a watch stands between two words.
enum Phase {
    /// To call `Watch`, after `failures` failures in a row (a back-off first, if any).
    Call { failures: u32 },
    /// Reading the stream of a call that answered.
    Reading(Box<Streaming<HealthCheckResponse>>),
    /// Over: the server has no health service.
    Done,
}

impl<K, S> Probe<K, S> for GrpcHealth
where
    K: std::hash::Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    S: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    S::Error: Into<tower::BoxError>,
    S::Future: Send,
    S::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    fn sends_checks(&self) -> bool {
        true
    }

    fn idle_checker(&self) -> Option<crate::probe::IdleChecker<K, S>> {
        Some(crate::probe::IdleChecker::new(self.clone()))
    }

    fn probe(&mut self, key: &K, service: S) -> Option<ProbeFuture> {
        let request = self.request();
        let check = self.clone();
        let endpoint = format!("{key:?}");
        Some(Box::pin(async move {
            let mut client = HealthClient::new(service);
            match client.check(request).await {
                Ok(answer) => health_of(answer.get_ref()) == Health::Serving,
                // A server without the health service answered: it is reachable, and counts as
                // serving here as it does in the watch (otherwise an ejected server of that kind
                // would never pass a check, and stay out for good). Its calls judge it on trial.
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    check.warn_unimplemented(&endpoint);
                    true
                }
                Err(_) => false,
            }
        }))
    }

    fn watch(&mut self, key: &K, service: &S) -> Option<HealthStream> {
        let watch = self.clone();
        let endpoint = format!("{key:?}");
        let client = HealthClient::new(service.clone());
        let stream = futures::stream::unfold(
            (Phase::Call { failures: 0 }, client),
            move |(phase, mut client)| {
                let watch = watch.clone();
                let endpoint = endpoint.clone();
                async move {
                    let mut phase = phase;
                    loop {
                        phase = match phase {
                            Phase::Done => return None,
                            Phase::Call { failures } => {
                                if failures > 0 {
                                    tokio::time::sleep(watch.delay(failures)).await;
                                }
                                match client.watch(watch.request()).await {
                                    Ok(answer) => Phase::Reading(Box::new(answer.into_inner())),
                                    Err(status) => match watch.failed(&endpoint, &status, failures)
                                    {
                                        Some(next) => next,
                                        None => {
                                            return Some((Health::Serving, (Phase::Done, client)))
                                        }
                                    },
                                }
                            }
                            Phase::Reading(mut stream) => match stream.message().await {
                                Ok(Some(message)) => {
                                    let health = health_of(&message);
                                    return Some((health, (Phase::Reading(stream), client)));
                                }
                                Ok(None) => {
                                    tracing::debug!(target: "tower_outlier", endpoint = %endpoint, "the health watch ended; calling it again");
                                    Phase::Call { failures: 1 }
                                }
                                Err(status) => match watch.failed(&endpoint, &status, 0) {
                                    Some(next) => next,
                                    None => return Some((Health::Serving, (Phase::Done, client))),
                                },
                            },
                        };
                    }
                }
            },
        );
        Some(Box::pin(stream))
    }
}

impl GrpcHealth {
    /// A `Watch` call failed with `status` after `failures` failures in a row: the phase to go
    /// on with, or `None` when the server has no health service (it counts as serving).
    fn failed(&self, endpoint: &str, status: &tonic::Status, failures: u32) -> Option<Phase> {
        if status.code() == tonic::Code::Unimplemented {
            self.warn_unimplemented(endpoint);
            return None;
        }
        let failures = failures.saturating_add(1);
        tracing::debug!(
            target: "tower_outlier",
            endpoint,
            code = ?status.code(),
            retry_in = ?self.delay(failures),
            "the health watch failed; its last word stands"
        );
        Some(Phase::Call { failures })
    }

    /// Says once per layer that a server has no health service.
    fn warn_unimplemented(&self, endpoint: &str) {
        if !self.warned_unimplemented.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "tower_outlier",
                endpoint,
                service = %self.service,
                "the server has no grpc.health.v1 service: its endpoints count as serving"
            );
        }
    }
}
