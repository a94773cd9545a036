//! The in-memory store behind `previous_response_id` and
//! `GET` / `DELETE /v1/responses/{id}`: bounded by a count and by bytes,
//! oldest first out (FIFO by creation). Nothing survives a restart.
//!
//! Each entry holds its whole conversation (a follow-up's history is its
//! predecessor's plus its own turns), so a long chain costs quadratic
//! bytes: the byte bound is what keeps that in check.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// Most responses kept.
pub const MAX_RESPONSES: usize = 1000;
/// Most bytes kept (the JSON of the responses and their conversations).
pub const MAX_BYTES: usize = 64 << 20;

/// One stored response.
#[derive(Debug)]
pub struct Stored {
    /// The response object as it was returned.
    pub response: Value,
    /// The conversation in chat-completions message shape: the history it
    /// continued, its input turns, then its output turn (its
    /// `instructions` left out: they do not carry over).
    pub conversation: Vec<Value>,
    bytes: usize,
}

struct Inner {
    map: HashMap<String, Arc<Stored>>,
    /// Ids in creation order. Invariant: the same ids as `map`.
    order: VecDeque<String>,
    /// Sum of the entries' `bytes`.
    bytes: usize,
}

pub struct ResponseStore {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::new(MAX_RESPONSES, MAX_BYTES)
    }
}

impl ResponseStore {
    pub fn new(max_entries: usize, max_bytes: usize) -> ResponseStore {
        ResponseStore {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
            }),
            max_entries,
            max_bytes,
        }
    }

    /// A panic while the lock was held cannot leave the maps half-updated
    /// in a way that matters more than losing the store, so a poisoned
    /// lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps a response, evicting the oldest ones until both bounds hold.
    /// Returns false (and keeps nothing) when the entry alone is over the
    /// byte bound.
    pub fn insert(&self, id: String, response: Value, conversation: Vec<Value>) -> bool {
        let bytes = id.len()
            + response.to_string().len()
            + conversation
                .iter()
                .map(|m| m.to_string().len())
                .sum::<usize>();
        if bytes > self.max_bytes || self.max_entries == 0 {
            return false;
        }
        let mut g = self.lock();
        if let Some(old) = g.map.remove(&id) {
            g.bytes -= old.bytes;
            g.order.retain(|x| *x != id);
        }
        while g.map.len() >= self.max_entries || g.bytes + bytes > self.max_bytes {
            let Some(oldest) = g.order.pop_front() else {
                break;
            };
            if let Some(old) = g.map.remove(&oldest) {
                g.bytes -= old.bytes;
            }
        }
        g.bytes += bytes;
        g.order.push_back(id.clone());
        g.map.insert(
            id,
            Arc::new(Stored {
                response,
                conversation,
                bytes,
            }),
        );
        true
    }

    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.lock().map.get(id).cloned()
    }

    /// Forgets `id`; whether it was there.
    pub fn remove(&self, id: &str) -> bool {
        let mut g = self.lock();
        match g.map.remove(id) {
            Some(old) => {
                g.bytes -= old.bytes;
                g.order.retain(|x| x != id);
                true
            }
            None => false,
        }
    }

    /// (entries, bytes) kept now.
    pub fn usage(&self) -> (usize, usize) {
        let g = self.lock();
        (g.map.len(), g.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(s: &ResponseStore, id: &str, text: &str) -> bool {
        s.insert(
            id.to_string(),
            json!({"id": id}),
            vec![json!({"role": "user", "content": text})],
        )
    }

    #[test]
    fn evicts_oldest_by_count_and_bytes() {
        let s = ResponseStore::new(3, 1 << 20);
        for i in 0..5 {
            assert!(put(&s, &format!("r{i}"), "x"));
        }
        assert_eq!(s.usage().0, 3);
        assert!(s.get("r0").is_none() && s.get("r1").is_none());
        assert_eq!(s.get("r4").unwrap().conversation[0]["content"], "x");
        // Deleting frees its place: nothing else goes on the next insert.
        assert!(s.remove("r3"));
        assert!(!s.remove("r3"));
        assert!(put(&s, "r5", "y"));
        assert!(s.get("r2").is_some() && s.get("r4").is_some() && s.get("r5").is_some());

        let s = ResponseStore::new(100, 400);
        assert!(put(&s, "a", &"a".repeat(150)));
        assert!(put(&s, "b", &"b".repeat(150)));
        let (n, bytes) = s.usage();
        assert_eq!(n, 2);
        assert!(bytes <= 400);
        assert!(put(&s, "c", &"c".repeat(150)));
        assert!(s.get("a").is_none() && s.get("c").is_some());
        assert!(s.usage().1 <= 400);
        // Too big alone: refused, nothing evicted.
        assert!(!put(&s, "d", &"d".repeat(500)));
        assert!(s.get("b").is_some() && s.get("d").is_none());
    }
}
