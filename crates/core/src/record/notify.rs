//! How a record tells its layer that it wants a judgement: the layer's notifier and the
//! per-record signal bits.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Waker;

use futures::task::AtomicWaker;

use super::{EndpointRecord, FLAGGED};

/// Wakes the task that drives a layer when any endpoint's record signals.
///
/// One per layer instance. Records set the dirty flag and wake; the layer registers its waker
/// before it checks the flag, so a signal is never missed and no poll spins.
pub struct Notifier {
    dirty: AtomicBool,
    waker: AtomicWaker,
    // Whether the layer could eject one more endpoint now (budget and last-endpoint rules).
    room_to_eject: AtomicBool,
}

impl Default for Notifier {
    fn default() -> Self {
        Notifier {
            dirty: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            room_to_eject: AtomicBool::new(true),
        }
    }
}

impl Notifier {
    /// A notifier with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the records whether an ejection would be allowed now. While it would not (the budget
    /// is spent, or one endpoint is left), gathering evidence against an endpoint only costs
    /// callers failed requests, so [`EndpointRecord::calls_wanted`](crate::EndpointRecord::calls_wanted) asks for none.
    pub fn set_room_to_eject(&self, room: bool) {
        store_if_changed(&self.room_to_eject, room);
    }

    /// Whether an ejection would be allowed now (true until the layer says otherwise).
    pub fn room_to_eject(&self) -> bool {
        self.room_to_eject.load(Ordering::Relaxed)
    }

    /// Marks work pending and wakes the registered task.
    pub fn notify(&self) {
        self.dirty.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Registers the task to wake on the next [`notify`](Self::notify).
    pub fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// Takes the pending mark: true once per burst of notifications.
    pub fn take(&self) -> bool {
        // Checking first keeps the idle poll to a plain load.
        self.dirty.load(Ordering::Acquire) && self.dirty.swap(false, Ordering::AcqRel)
    }
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("dirty", &self.dirty.load(Ordering::Relaxed))
            .field("room_to_eject", &self.room_to_eject())
            .finish()
    }
}

/// Where an endpoint's record marks that it wants the layer to look at it: one bit of a board the
/// layer scans a word (64 endpoints) at a time, so a signal never costs the layer a scan of every
/// record. Handed to the record by the layer that tracks it ([`EndpointRecord::set_signal_slot`](crate::EndpointRecord::set_signal_slot)).
#[derive(Clone, Debug)]
pub struct SignalSlot {
    chunk: Arc<SignalChunk>,
    // The bit's place in the chunk (below 256): its word and its bit in it are a shift and a
    // mask away, and every record holds one of these (a `u64` mask beside it cost 8 bytes each).
    // One byte, so that the record holds it among its other bytes (a `u16` beside the pointer was
    // padded to a word in every record).
    index: u8,
}

/// 256 signal bits, in 4 words.
pub struct SignalChunk {
    words: [AtomicU64; SignalChunk::WORDS],
}

impl SignalChunk {
    const WORDS: usize = 4;
    /// The endpoints one chunk holds.
    pub const SLOTS: usize = Self::WORDS * 64;

    /// A chunk with no bit set.
    pub fn new() -> Arc<Self> {
        Arc::new(SignalChunk {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }

    /// The slot `index` (below [`SLOTS`](Self::SLOTS)) of `chunk`.
    pub fn slot(chunk: &Arc<Self>, index: usize) -> SignalSlot {
        let index = index % Self::SLOTS;
        SignalSlot {
            chunk: chunk.clone(),
            index: index as u8,
        }
    }

    /// Takes every bit set, calling `signalled` with each slot's index, lowest first.
    pub fn take(&self, mut signalled: impl FnMut(usize)) {
        for (word_index, word) in self.words.iter().enumerate() {
            // Checking first keeps a quiet word to a plain load.
            if word.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                signalled(word_index * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
    }
}

impl fmt::Debug for SignalChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set: u32 = self
            .words
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones())
            .sum();
        f.debug_struct("SignalChunk").field("set", &set).finish()
    }
}

impl SignalChunk {
    /// Sets the bit of the slot `index` of this chunk.
    #[inline]
    pub(super) fn raise(&self, index: u8) {
        let index = usize::from(index);
        self.words[index / 64].fetch_or(1 << (index % 64), Ordering::Release);
    }
}

/// Stores `value` in `flag` unless it already holds it.
///
/// A flag that per-call paths read stays in every reading core's cache while it does not change;
/// an unconditional store would take the line away from all of them each time.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use tower_outlier_core::store_if_changed;
///
/// let suspect = AtomicBool::new(false);
/// store_if_changed(&suspect, true);
/// assert!(suspect.load(Ordering::Relaxed));
/// ```
#[inline]
pub fn store_if_changed(flag: &AtomicBool, value: bool) {
    if flag.load(Ordering::Relaxed) != value {
        flag.store(value, Ordering::Relaxed);
    }
}

/// The record's place on its layer's signal board.
impl EndpointRecord {
    /// The flag was just set: mark the record's bit and wake the layer.
    #[cold]
    pub(super) fn raise_flag(&self) {
        if let Some(chunk) = &self.signal_chunk {
            chunk.raise(self.signal_index);
        }
        self.notifier.notify();
    }

    /// Gives the record the bit its layer reads its flag by, before the record is shared (a
    /// successor keeps its predecessor's). A flag already set is marked at once.
    pub fn set_signal_slot(&mut self, slot: SignalSlot) {
        self.signal_chunk = Some(slot.chunk);
        self.signal_index = slot.index;
        if self.marks.load(Ordering::Acquire) & FLAGGED != 0 {
            self.raise_flag();
        }
    }
}
