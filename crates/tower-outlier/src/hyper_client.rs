//! An HTTP client pinned to one address (feature `hyper-client`): the service a discover stream
//! hands the balancer for each server of an HTTP fleet.
//!
//! p2c picks an endpoint per request, so each endpoint must send whatever request it is given to
//! its own server, whatever authority the request names. [`PinnedClient`] is hyper-util's
//! pooled client with the request's scheme and authority replaced by the endpoint's (the path
//! and query are kept; an origin-form request, as axum hands a handler, gets `/`). It is `Clone`
//! (clones share the connection pool), as the layer needs to re-admit an endpoint and to probe it.

use std::fmt;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use tower_service::Service;

/// A hyper-util client that sends every request to one address, over plain HTTP/1.1 by default.
///
/// ```
/// use std::net::SocketAddr;
/// use bytes::Bytes;
/// use http_body_util::Empty;
/// use tower::discover::Change;
/// use tower_outlier::hyper_client::PinnedClient;
///
/// let servers: [SocketAddr; 2] = ["127.0.0.1:8081".parse()?, "127.0.0.1:8082".parse()?];
/// // One change per server, for a channel-backed discover stream (or a `ServiceList`).
/// let changes: Vec<Change<SocketAddr, PinnedClient<Empty<Bytes>>>> = servers
///     .iter()
///     .map(|&addr| Change::Insert(addr, PinnedClient::new(addr)))
///     .collect();
/// # let _ = changes;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Requests through it fail with hyper-util's error (a refused connection, a reset), which the
/// layer's classifiers count as transport failures. It is always ready: the client queues on its
/// pool. Put a `tower::timeout::Timeout` around it, so that a server that never answers fails
/// calls the layer can count.
///
/// A request naming an authority (`http://api.example.com/x`) and carrying no `Host` header is
/// given `Host: api.example.com`, so that a server routing by name still sees the name; without
/// either, hyper-util sets the pinned address. It is an endpoint, not a forward proxy: a
/// `CONNECT` request's target is replaced like any other authority. With
/// [`with_client`](Self::with_client) and a name rather than an address, the connector resolves
/// the name, and which address a connection reaches is the resolver's choice.
pub struct PinnedClient<B, C = HttpConnector> {
    client: Client<C, B>,
    scheme: Scheme,
    authority: Authority,
}

impl<B> PinnedClient<B>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    /// A client of its own (its own connection pool, Nagle off: small request/response pairs on
    /// kept-alive connections) sending to `addr` over plain HTTP.
    pub fn new(addr: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        PinnedClient::with_client(client, Scheme::HTTP, authority_of(addr))
    }
}

impl<B, C> PinnedClient<B, C> {
    /// Pins `client` (which may be shared by every endpoint: one pool, keyed by authority, and
    /// whatever connector it has, TLS included) to `scheme://authority`.
    pub fn with_client(client: Client<C, B>, scheme: Scheme, authority: Authority) -> Self {
        PinnedClient {
            client,
            scheme,
            authority,
        }
    }

    /// The authority every request is sent to.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

fn authority_of(addr: SocketAddr) -> Authority {
    // A socket address always formats as a valid authority (`127.0.0.1:80`, `[::1]:80`).
    match Authority::try_from(addr.to_string()) {
        Ok(authority) => authority,
        Err(_) => Authority::from_static("localhost"),
    }
}

impl<B, C> Service<Request<B>> for PinnedClient<B, C>
where
    C: Connect + Clone + Send + Sync + 'static,
    B: http_body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> ResponseFuture {
        // The authority the request named becomes its Host (when it has none), so that a server
        // routing by name (an nginx `server_name`, an ingress) still sees it.
        if !request.headers().contains_key(http::header::HOST) {
            if let Some(named) = request.uri().authority() {
                if let Ok(host) = http::HeaderValue::from_str(named.as_str()) {
                    request.headers_mut().insert(http::header::HOST, host);
                }
            }
        }
        let mut parts = request.uri().clone().into_parts();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts
            .path_and_query
            .get_or_insert(PathAndQuery::from_static("/"));
        // With a scheme, an authority and a path the parts always make a URI.
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        self.client.request(request)
    }
}

impl<B, C: Clone> Clone for PinnedClient<B, C> {
    fn clone(&self) -> Self {
        PinnedClient {
            client: self.client.clone(),
            scheme: self.scheme.clone(),
            authority: self.authority.clone(),
        }
    }
}

impl<B, C> fmt::Debug for PinnedClient<B, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedClient")
            .field("scheme", &self.scheme)
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}
