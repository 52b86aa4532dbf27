//! Every endpoint's entry, held once: in a table by the slot of the signal board its record
//! raises, with a map from key to slot. A raised bit names its entry by the slot, a caller by the
//! key, and neither needs a second copy of the other (a map of entries by key beside a list of
//! keys by slot held each key twice: 40 bytes per endpoint at 10 000). The map holds slots only,
//! hashed by the key their entry holds: a map from key to slot held a copy of every key (a
//! `SocketAddr` is 32 bytes, a `Uri` 88) and 28 bytes per endpoint with `usize` keys.

use std::hash::{BuildHasher, Hash, RandomState};

use hashbrown::HashTable;

use super::standing::Entry;

pub(super) struct Entries<K, S> {
    // By slot; `None` where an entry was removed, until the slot is given again.
    slots: Vec<Option<(K, Entry<S>)>>,
    // The slot of every entry, by the hash of its key. Every slot here holds an entry.
    index: HashTable<u32>,
    // Keys come from the upstream: hashed as std's maps hash them, against chosen collisions.
    hasher: RandomState,
    // Slots given up, given again last-freed first.
    free: Vec<u32>,
}

impl<K, S> Entries<K, S> {
    pub(super) fn new() -> Self {
        Entries {
            slots: Vec::new(),
            index: HashTable::new(),
            hasher: RandomState::new(),
            free: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The slot the next [`insert`](Self::insert) fills.
    pub(super) fn vacant_slot(&self) -> u32 {
        self.free
            .last()
            .copied()
            .unwrap_or_else(|| u32::try_from(self.slots.len()).unwrap_or(u32::MAX))
    }

    /// The entry in `slot`, if any, with its key.
    pub(super) fn by_slot(&self, slot: u32) -> Option<(&K, &Entry<S>)> {
        self.slots
            .get(slot as usize)?
            .as_ref()
            .map(|(key, entry)| (key, entry))
    }

    /// Every entry with its key, in slot order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &Entry<S>)> {
        self.slots
            .iter()
            .filter_map(|slot| slot.as_ref().map(|(key, entry)| (key, entry)))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Entry<S>> {
        self.iter().map(|(_, entry)| entry)
    }
}

/// Whether `slot` holds the entry of `key`.
fn holds<K: Eq, S>(slots: &[Option<(K, Entry<S>)>], slot: u32, key: &K) -> bool {
    matches!(slots.get(slot as usize), Some(Some((held, _))) if held == key)
}

/// The hash of the key `slot` holds (every slot in the index holds one; 0 keeps a broken
/// invariant from panicking, at the cost of a slower lookup).
fn rehash<K: Hash, S>(hasher: &RandomState, slots: &[Option<(K, Entry<S>)>], slot: u32) -> u64 {
    match slots.get(slot as usize) {
        Some(Some((key, _))) => hasher.hash_one(key),
        _ => 0,
    }
}

impl<K: Hash + Eq, S> Entries<K, S> {
    fn slot_of(&self, key: &K) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        self.index
            .find(hash, |&slot| holds(&self.slots, slot, key))
            .copied()
    }

    pub(super) fn get(&self, key: &K) -> Option<&Entry<S>> {
        let slot = self.slot_of(key)?;
        self.slots[slot as usize].as_ref().map(|(_, entry)| entry)
    }

    pub(super) fn get_mut(&mut self, key: &K) -> Option<&mut Entry<S>> {
        let slot = self.slot_of(key)?;
        self.slots[slot as usize].as_mut().map(|(_, entry)| entry)
    }

    pub(super) fn remove(&mut self, key: &K) -> Option<Entry<S>> {
        let hash = self.hasher.hash_one(key);
        let slots = &self.slots;
        let found = self
            .index
            .find_entry(hash, |&slot| holds(slots, slot, key))
            .ok()?;
        let (slot, _) = found.remove();
        let (_, entry) = self.slots.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(entry)
    }

    /// Adds `entry` under `key`, in the slot it was made for ([`vacant_slot`](Self::vacant_slot)
    /// named it); an entry the key held goes.
    pub(super) fn insert(&mut self, key: K, entry: Entry<S>) {
        let slot = entry.slot;
        let hash = self.hasher.hash_one(&key);
        let slots = &self.slots;
        let old = match self
            .index
            .find_entry(hash, |&held| holds(slots, held, &key))
        {
            Ok(mut found) => Some(std::mem::replace(found.get_mut(), slot)),
            Err(_) => {
                let hasher = &self.hasher;
                self.index
                    .insert_unique(hash, slot, |&held| rehash(hasher, slots, held));
                None
            }
        };
        if let Some(old) = old.filter(|&old| old != slot) {
            if let Some(held) = self.slots.get_mut(old as usize) {
                *held = None;
            }
            self.free.push(old);
        }
        // The vacant slot is the last one freed, or the next past the end.
        match self.free.iter().rposition(|&free| free == slot) {
            Some(at) => {
                self.free.swap_remove(at);
            }
            None => {
                while self.slots.len() <= slot as usize {
                    if self.slots.len() == self.slots.capacity() {
                        // An eighth more at a time, not twice as many: a table at 10 000
                        // endpoints held room for 16 384, 48 bytes each.
                        self.slots.reserve_exact((self.slots.len() / 8).max(16));
                    }
                    self.slots.push(None);
                }
            }
        }
        self.slots[slot as usize] = Some((key, entry));
    }
}

#[cfg(test)]
impl<K: Hash + Eq, S> std::ops::Index<&K> for Entries<K, S> {
    type Output = Entry<S>;

    fn index(&self, key: &K) -> &Entry<S> {
        self.get(key).expect("an entry under that key")
    }
}
