//! A user's first program, as the README documents it, built in a fresh project by
//! `.ci/newest-dependencies` against the newest versions crates.io serves: tower-http and
//! prometheus-client are this project's own dependencies, not the ones tower-outlier re-exports.
use std::convert::Infallible;
use std::time::Duration;

use futures::TryStreamExt as _;
use prometheus_client::registry::Registry;
use tower::balance::p2c::Balance;
use tower::discover::{Change, ServiceList};
use tower::timeout::Timeout;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_http::classify::ServerErrorsAsFailures;
use tower_outlier::tower_http_classifier::TowerHttp;
use tower_outlier::{DetectorConfig, DetectorPolicy, ErrorRateConfig, ErrorRatePolicy};
use tower_outlier::{OutlierDetectionLayer, ServerErrors};

#[tokio::main]
async fn main() -> Result<(), tower::BoxError> {
    // The tower-http classifier, from this project's tower-http.
    let _classified = OutlierDetectionLayer::new(ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?))
        .classifier(TowerHttp(ServerErrorsAsFailures::new()));

    // The README's recommended stack: a timeout per endpoint, the layer, p2c, a buffer.
    let outliers = OutlierDetectionLayer::new(DetectorPolicy::new(DetectorConfig::linkerd().build()?))
        .classifier(ServerErrors);
    let monitor = outliers.monitor();
    let services = (0..3u16).map(|i| {
        service_fn(move |_: http::Request<()>| async move {
            Ok::<_, Infallible>(http::Response::new(i))
        })
    });
    let discover = ServiceList::new(services).map_ok(|change| match change {
        Change::Insert(key, service) => Change::Insert(key, Timeout::new(service, Duration::from_secs(2))),
        Change::Remove(key) => Change::Remove(key),
    });
    let balancer = ServiceBuilder::new()
        .buffer(1024)
        .layer_fn(Balance::new)
        .layer(outliers)
        .service(discover);
    let response = balancer.oneshot(http::Request::new(())).await?;
    assert!(*response.body() < 3);

    // Metrics into this project's prometheus-client registry.
    let mut registry = Registry::default();
    let _metrics = tower_outlier::metrics::register(&mut registry, &monitor);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    assert!(text.contains("outlier_"), "no outlier metrics in:\n{text}");
    println!("user project: built and ran against the newest dependencies");
    Ok(())
}
