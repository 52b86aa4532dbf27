//! `PinnedClient` on loopback: a request naming any authority, or none (the origin form axum
//! hands a handler), reaches the pinned server with its path and query; a server that is gone is
//! a transport failure the layer counts.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tower::{Service, ServiceExt};
use tower_outlier::hyper_client::PinnedClient;
use tower_outlier::{DetectorConfig, DetectorPolicy, OutlierDetectionLayer, ServerErrors};

/// A server answering with the path and query it was asked for, and the Host header after a
/// space.
async fn echo_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|request: http::Request<Incoming>| {
                    let host = request
                        .headers()
                        .get(http::header::HOST)
                        .and_then(|h| h.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let target = format!(
                        "{} {host}",
                        request.uri().path_and_query().map_or("", |p| p.as_str())
                    );
                    async move { Ok::<_, Infallible>(http::Response::new(Full::<Bytes>::from(target))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn answer(client: &mut PinnedClient<Empty<Bytes>>, uri: &str) -> String {
    let request = http::Request::get(uri).body(Empty::new()).unwrap();
    let response = client.ready().await.unwrap().call(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn requests_reach_the_pinned_server_with_their_path_and_query() {
    let addr = echo_server().await;
    let mut client = PinnedClient::new(addr);
    assert_eq!(client.authority().as_str(), addr.to_string());
    let pinned = addr.to_string();
    assert_eq!(
        answer(&mut client, "/orders?id=7").await,
        format!("/orders?id=7 {pinned}")
    );
    // The name the request gave is kept as its Host, for servers that route by name.
    assert_eq!(
        answer(&mut client, "http://elsewhere.example:9999/a/b").await,
        "/a/b elsewhere.example:9999"
    );
    assert_eq!(
        answer(&mut client, "http://elsewhere.example").await,
        "/ elsewhere.example"
    );
}

#[tokio::test]
async fn a_server_that_is_gone_is_a_transport_failure() {
    // A port that was just free: nothing listens on it.
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let layer = OutlierDetectionLayer::new(DetectorPolicy::new(
        DetectorConfig::recommended().build().unwrap(),
    ))
    .classifier(ServerErrors);
    let mut endpoint = layer.endpoint(PinnedClient::new(addr));
    let request = http::Request::get("/").body(Empty::<Bytes>::new()).unwrap();
    assert!(endpoint.ready().await.unwrap().call(request).await.is_err());
    let record = endpoint.record();
    let counts = record.policies()[0].describe(record.clock().now()).counts;
    assert_eq!((counts.calls, counts.failures), (1, 1));
}
