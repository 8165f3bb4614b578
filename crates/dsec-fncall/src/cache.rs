//! Compiled programs by source hash, least recently used out first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

pub type Key = [u8; 32];

/// The key of a compile: language, source and extra files (which headers
/// may come from). Each part is length-prefixed so no two inputs collide.
pub fn compile_key(language: &str, code: &str, files: &std::collections::BTreeMap<String, String>) -> Key {
    let mut h = Sha256::new();
    let mut part = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    part(language.as_bytes());
    part(code.as_bytes());
    for (k, v) in files {
        part(k.as_bytes());
        part(v.as_bytes());
    }
    h.finalize().into()
}

struct Entry {
    data: Arc<Vec<u8>>,
    last_used: u64,
}

struct Inner {
    map: HashMap<Key, Entry>,
    bytes: u64,
    tick: u64,
    hits: u64,
    misses: u64,
}

pub struct CompileCache {
    budget: u64,
    inner: Mutex<Inner>,
}

impl CompileCache {
    pub fn new(budget: u64) -> Self {
        CompileCache { budget, inner: Mutex::new(Inner { map: HashMap::new(), bytes: 0, tick: 0, hits: 0, misses: 0 }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &Key) -> Option<Arc<Vec<u8>>> {
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        match g.map.get_mut(key) {
            Some(e) => {
                e.last_used = tick;
                let data = e.data.clone();
                g.hits += 1;
                Some(data)
            }
            None => {
                g.misses += 1;
                None
            }
        }
    }

    pub fn put(&self, key: Key, data: Vec<u8>) {
        let len = data.len() as u64;
        if len > self.budget {
            return;
        }
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        if let Some(old) = g.map.insert(key, Entry { data: Arc::new(data), last_used: tick }) {
            g.bytes -= old.data.len() as u64;
        }
        g.bytes += len;
        // Linear scan for the oldest: the cache holds at most a few
        // thousand programs and eviction is rare next to compiling.
        while g.bytes > self.budget {
            let Some(oldest) = g.map.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| *k) else { break };
            if let Some(e) = g.map.remove(&oldest) {
                g.bytes -= e.data.len() as u64;
            }
        }
    }

    /// (entries, bytes, hits, misses)
    pub fn stats(&self) -> (usize, u64, u64, u64) {
        let g = self.lock();
        (g.map.len(), g.bytes, g.hits, g.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let c = CompileCache::new(10);
        let k = |n: u8| [n; 32];
        c.put(k(1), vec![0; 4]);
        c.put(k(2), vec![0; 4]);
        assert!(c.get(&k(1)).is_some()); // 1 is now newer than 2
        c.put(k(3), vec![0; 4]);
        assert!(c.get(&k(2)).is_none(), "2 was least recently used");
        assert!(c.get(&k(1)).is_some() && c.get(&k(3)).is_some());
        assert_eq!(c.stats().1, 8);
        c.put(k(4), vec![0; 11]);
        assert!(c.get(&k(4)).is_none(), "larger than the whole budget: not kept");
    }

    #[test]
    fn keys_separate_language_code_and_files() {
        let none = BTreeMap::new();
        let a = compile_key("c", "x", &none);
        assert_ne!(a, compile_key("cpp", "x", &none));
        assert_ne!(a, compile_key("c", "y", &none));
        let files = BTreeMap::from([("h.h".to_string(), "AA==".to_string())]);
        assert_ne!(a, compile_key("c", "x", &files));
        assert_ne!(compile_key("ab", "c", &none), compile_key("a", "bc", &none));
    }
}
