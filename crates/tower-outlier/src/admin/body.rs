//! The admin component's response body: a whole document, or server-sent events.

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use http_body::{Frame, SizeHint};

/// The body of an [`Admin`](super::Admin) response: a document, or a stream of server-sent events
/// that ends only when the layer's monitor is gone or the client goes away.
pub struct AdminBody {
    kind: Kind,
}

enum Kind {
    Full(Option<Bytes>),
    Events(Pin<Box<dyn Stream<Item = Bytes> + Send>>),
}

impl AdminBody {
    pub(super) fn full(bytes: impl Into<Bytes>) -> Self {
        AdminBody {
            kind: Kind::Full(Some(bytes.into())),
        }
    }

    pub(super) fn events(stream: impl Stream<Item = Bytes> + Send + 'static) -> Self {
        AdminBody {
            kind: Kind::Events(Box::pin(stream)),
        }
    }
}

impl http_body::Body for AdminBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().kind {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Events(stream) => stream
                .as_mut()
                .poll_next(cx)
                .map(|next| next.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.kind, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
            Kind::Events(_) => SizeHint::default(),
        }
    }
}

impl fmt::Debug for AdminBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Full(bytes) => f
                .debug_struct("AdminBody")
                .field("len", &bytes.as_ref().map_or(0, Bytes::len))
                .finish(),
            Kind::Events(_) => f.debug_struct("AdminBody").field("events", &true).finish(),
        }
    }
}
