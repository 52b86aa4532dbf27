//! The signal board: which endpoints' records asked to be looked at.

use std::sync::Arc;

use tower_outlier_core::{SignalChunk, SignalSlot};

/// The bits records raise to be looked at, one per slot of the engine's entries
/// (`entries.rs`): a signal costs the adaptor a scan of one word per 64 endpoints, not of every
/// record (1 600 words at 100 000 endpoints). A response still in flight for a removed record
/// may raise its bit later; the entry then found in the slot (none, or the next one given it) is
/// merely looked at.
pub(super) struct SignalBoard {
    chunks: Vec<Arc<SignalChunk>>,
}

impl SignalBoard {
    pub(super) fn new() -> Self {
        SignalBoard { chunks: Vec::new() }
    }

    /// The bit the record of the entry in `slot` raises.
    pub(super) fn assign(&mut self, slot: u32) -> SignalSlot {
        let slot = slot as usize;
        while slot / SignalChunk::SLOTS >= self.chunks.len() {
            self.chunks.push(SignalChunk::new());
        }
        SignalChunk::slot(&self.chunks[slot / SignalChunk::SLOTS], slot)
    }

    /// The slots whose bits are raised, taking the bits, lowest first.
    pub(super) fn take(&self) -> Vec<u32> {
        let mut raised = Vec::new();
        for (index, chunk) in self.chunks.iter().enumerate() {
            chunk.take(|bit| raised.push((index * SignalChunk::SLOTS + bit) as u32));
        }
        raised
    }
}
