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
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::BoxError;
use tower_service::Service;

use crate::connection::{ConnectionWatch, Gate, ResponseFuture};

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
/// Requests through it fail with hyper-util's error, boxed (a refused connection, a reset),
/// which the layer's classifiers count as transport failures. Put a `tower::timeout::Timeout`
/// around it, so that a server that never answers fails calls the layer can count.
///
/// Made with [`new`](Self::new) or [`with_connector`](Self::with_connector), it watches its
/// connection ([`connection`](crate::connection)): once a connection to its server is refused,
/// its `poll_ready` fails once with [`Disconnected`](crate::connection::Disconnected) and then
/// waits, reconnecting with a back-off (200 ms growing to 2 s), so that under the layer the
/// balancer picks it for no call until its server accepts connections again; the monitor shows
/// it `Unready`. Otherwise it is always ready: the client queues on its pool. Made with
/// [`with_client`](Self::with_client), it watches nothing (a shared client's connector serves
/// every endpoint).
///
/// A request naming an authority (`http://api.example.com/x`) and carrying no `Host` header is
/// given `Host: api.example.com`, so that a server routing by name still sees the name; without
/// either, hyper-util sets the pinned address. It is an endpoint, not a forward proxy: a
/// `CONNECT` request's target is replaced like any other authority. With
/// [`with_client`](Self::with_client) and a name rather than an address, the connector resolves
/// the name, and which address a connection reaches is the resolver's choice.
pub struct PinnedClient<B, C = ConnectionWatch<HttpConnector>> {
    client: Client<C, B>,
    scheme: Scheme,
    authority: Authority,
    gate: Option<Gate>,
    // The connector its connections go through, when it watches them.
    watch: Option<C>,
}

impl<B> PinnedClient<B>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    /// A client of its own (its own connection pool, Nagle off: small request/response pairs on
    /// kept-alive connections) sending to `addr` over plain HTTP, watching its connection.
    pub fn new(addr: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        PinnedClient::with_connector(connector, Scheme::HTTP, authority_of(addr))
    }

    /// A client of its own (its own connection pool) connecting through `connector` (TLS, a
    /// connect timeout, a proxy: whatever it does) to `scheme://authority`, watching its
    /// connection as [`new`](Self::new) does.
    pub fn with_connector<C>(
        connector: C,
        scheme: Scheme,
        authority: Authority,
    ) -> PinnedClient<B, ConnectionWatch<C>>
    where
        C: tower_service::Service<Uri> + Clone + Send + Sync + 'static,
        C::Future: Send,
        C::Response: Send,
        ConnectionWatch<C>: Connect,
    {
        let watch = ConnectionWatch::new(connector);
        let target = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .unwrap_or_default();
        let gate = Gate::new(watch.clone(), target);
        let client = Client::builder(TokioExecutor::new()).build(watch.clone());
        PinnedClient {
            client,
            scheme,
            authority,
            gate: Some(gate),
            watch: Some(watch),
        }
    }
}

impl<B, C> PinnedClient<B, C> {
    /// Pins `client` (which may be shared by every endpoint: one pool, keyed by authority, and
    /// whatever connector it has, TLS included) to `scheme://authority`. It does not watch its
    /// connection: it is always ready.
    pub fn with_client(client: Client<C, B>, scheme: Scheme, authority: Authority) -> Self {
        PinnedClient {
            client,
            scheme,
            authority,
            gate: None,
            watch: None,
        }
    }

    /// The [`ConnectionWatch`] its connections go through, when it watches them
    /// ([`new`](PinnedClient::new), [`with_connector`](PinnedClient::with_connector)): its
    /// connection metrics ([`ConnectionWatch::stats`], [`ConnectionWatch::named`]).
    ///
    /// ```
    /// use tower_outlier::hyper_client::PinnedClient;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let client = PinnedClient::<String>::new("127.0.0.1:8080".parse().unwrap());
    /// assert_eq!(client.watch().unwrap().stats().attempts_succeeded, 0);
    /// # }
    /// ```
    pub fn watch(&self) -> Option<&C> {
        self.watch.as_ref()
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
    type Error = BoxError;
    type Future = ResponseFuture<hyper_util::client::legacy::ResponseFuture>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.gate.as_mut() {
            Some(gate) => gate.poll(cx).map_err(Into::into),
            None => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
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
        ResponseFuture::new(self.client.request(request))
    }
}

impl<B, C: Clone> Clone for PinnedClient<B, C> {
    fn clone(&self) -> Self {
        PinnedClient {
            client: self.client.clone(),
            scheme: self.scheme.clone(),
            authority: self.authority.clone(),
            gate: self.gate.clone(),
            watch: self.watch.clone(),
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
