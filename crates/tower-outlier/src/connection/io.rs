//! The connections a watch hands out: the connector's own, whose end marks the endpoint's
//! connection closed and is counted by why it ended.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::stats::{reason_of, CLOSED_BY_PEER};
use super::State;

pin_project! {
    /// A connection made through a [`ConnectionWatch`](super::ConnectionWatch): the connector's own, whose end (the
    /// client drops it when its server closed it, when it failed, or when the client's pool let
    /// it go) has the endpoint's gate check that its server still accepts connections before it
    /// is picked again. With the `hyper-io` feature (on with `hyper-client`) it is hyper's IO
    /// (and hyper-util's `Connection`) when the connector's is, as hyper-util's client and
    /// tonic's `Endpoint::connect_with_connector` need; it is tokio's `AsyncRead` and `AsyncWrite` when the
    /// connector's is.
    pub struct WatchedIo<T> {
        #[pin]
        pub(super) inner: T,
        pub(super) ended: Ended,
    }
}

/// Marks the endpoint's connection closed when dropped, unless disarmed, and counts why it
/// ended.
pub(super) struct Ended {
    pub(super) state: Option<Arc<State>>,
    // The first error or end of stream its reads and writes met, as an index in
    // `DISCONNECT_REASONS`.
    pub(super) reason: Option<u8>,
    // Its reads go through hyper's cursor, which does not show an end of stream.
    pub(super) blind: bool,
}

impl Ended {
    /// What a read or write returned: the first error, or an end of stream, is why the
    /// connection ends.
    #[inline]
    fn saw<T>(&mut self, result: &Poll<std::io::Result<T>>) {
        if let Poll::Ready(Err(error)) = result {
            self.reason.get_or_insert_with(|| reason_of(error));
        }
    }

    #[inline]
    fn saw_end(&mut self) {
        self.reason.get_or_insert(CLOSED_BY_PEER);
    }
}

impl Drop for Ended {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            state.closed();
            // No error and no end of stream: the client let it go (or, when its ends of stream
            // cannot be seen, it is not known who closed it).
            let unseen = if self.blind { CLOSED_BY_PEER } else { 0 };
            state.ended(Some(self.reason.unwrap_or(unseen)));
        }
    }
}

impl<T> WatchedIo<T> {
    /// The connection inside; its end is no longer watched (nor counted as a disconnection).
    pub fn into_inner(mut self) -> T {
        if let Some(state) = self.ended.state.take() {
            state.ended(None);
        }
        // `WatchedIo` has no `Drop` of its own (the guard has), so the field can move out.
        let WatchedIo { inner, .. } = self;
        inner
    }

    /// The connection inside.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T> fmt::Debug for WatchedIo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedIo").finish_non_exhaustive()
    }
}

impl<T: tokio::io::AsyncRead> tokio::io::AsyncRead for WatchedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let (room, before) = (buf.remaining(), buf.filled().len());
        let result = this.inner.poll_read(cx, buf);
        this.ended.saw(&result);
        if matches!(result, Poll::Ready(Ok(()))) && room > 0 && buf.filled().len() == before {
            this.ended.saw_end();
        }
        result
    }
}

impl<T: tokio::io::AsyncWrite> tokio::io::AsyncWrite for WatchedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write(cx, buf);
        this.ended.saw(&result);
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write_vectored(cx, bufs);
        this.ended.saw(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(feature = "hyper-io")]
impl<T: hyper::rt::Read> hyper::rt::Read for WatchedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        // hyper's cursor is handed on whole: what the read filled (an end of stream) is not seen
        // here, so an end without an error is `unknown` rather than the client's shutdown.
        this.ended.blind = true;
        let result = this.inner.poll_read(cx, buf);
        this.ended.saw(&result);
        result
    }
}

#[cfg(feature = "hyper-io")]
impl<T: hyper::rt::Write> hyper::rt::Write for WatchedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write(cx, buf);
        this.ended.saw(&result);
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write_vectored(cx, bufs);
        this.ended.saw(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(feature = "hyper-io")]
impl<T: hyper_util::client::legacy::connect::Connection>
    hyper_util::client::legacy::connect::Connection for WatchedIo<T>
{
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.inner.connected()
    }
}
