//! What every stack of a run shares: how long anyone waits for an answer, and what one request
//! comes to.

use std::time::Duration;

/// Every caller gives up after this long, and so does every endpoint (`tower::timeout`) and every
/// proxy (`proxy_read_timeout`, `timeout server`).
pub const TIMEOUT: Duration = Duration::from_secs(1);

/// One request and its fate: how long it took, and whether the caller got a good answer.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub latency: f64,
    pub ok: bool,
}
