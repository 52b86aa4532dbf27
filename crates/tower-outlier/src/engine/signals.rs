//! The signal board: which endpoints' records asked to be looked at.

use std::sync::Arc;

use tower_outlier_core::SignalChunk;

/// The bits records raise to be looked at, and whose each is: a signal costs the adaptor a scan of
/// one word per 64 endpoints, not of every record (1 600 words at 100 000 endpoints).
pub(super) struct SignalBoard<K> {
    chunks: Vec<Arc<SignalChunk>>,
    // The entry (id and key) at each slot, `None` once removed.
    slots: Vec<Option<(u64, K)>>,
    free: Vec<u32>,
}

impl<K> SignalBoard<K> {
    pub(super) fn new() -> Self {
        SignalBoard {
            chunks: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<K: Clone> SignalBoard<K> {
    /// A slot for entry `id` under `key`, and the bit its record raises.
    pub(super) fn assign(&mut self, id: u64, key: &K) -> (u32, tower_outlier_core::SignalSlot) {
        let slot = match self.free.pop() {
            Some(slot) => slot as usize,
            None => {
                let slot = self.slots.len();
                self.slots.push(None);
                if slot / SignalChunk::SLOTS >= self.chunks.len() {
                    self.chunks.push(SignalChunk::new());
                }
                slot
            }
        };
        self.slots[slot] = Some((id, key.clone()));
        let chunk = &self.chunks[slot / SignalChunk::SLOTS];
        (slot as u32, SignalChunk::slot(chunk, slot))
    }

    /// Frees `slot`. A response still in flight for the removed record may raise its bit later;
    /// the entry then found there (none, or the next one given the slot) is merely looked at.
    pub(super) fn release(&mut self, slot: u32) {
        if let Some(entry) = self.slots.get_mut(slot as usize) {
            *entry = None;
            self.free.push(slot);
        }
    }

    /// The entries whose bits are raised, taking the bits.
    pub(super) fn take(&self) -> Vec<(u64, K)> {
        let mut raised = Vec::new();
        for (index, chunk) in self.chunks.iter().enumerate() {
            chunk.take(|bit| {
                if let Some(Some(entry)) = self.slots.get(index * SignalChunk::SLOTS + bit) {
                    raised.push(entry.clone());
                }
            });
        }
        raised
    }
}
