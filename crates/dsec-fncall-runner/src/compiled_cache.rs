//! What the compiler made of the last sources a Python runner was sent,
//! so that a source seen again skips it: a judge's test cases, or RL code
//! that sends one program once per test case in separate requests (verl's
//! SandboxFusion reward does). A code object is a function of the source
//! alone (the file name it carries is the same for every call), so an
//! answer from here is the one the compiler would give.
//!
//! Like the node's cache of compiled programs (C, C++, ...), a hit is
//! faster than a miss, so a call could time whether this runner saw its
//! source before; it learns no more than that, and less than a compiled
//! language's cache tells (a compile takes seconds, this ~0.1 ms).

use std::collections::VecDeque;

use super::compiler::Compiled;

/// Sources remembered.
const ENTRIES: usize = 32;
/// Bytes of sources and answers remembered, in all (the monitor's memory
/// counts against the runner's).
const BYTES: usize = 4 << 20;
/// A source longer than this is never remembered.
pub const MAX_SOURCE: usize = 256 << 10;

/// Most recently used first.
#[derive(Default)]
pub struct CompiledCache {
    entries: VecDeque<(Vec<u8>, Compiled)>,
    bytes: usize,
}

impl CompiledCache {
    /// What became of `source`, if remembered (it becomes the most recent).
    pub fn get(&mut self, source: &[u8]) -> Option<Compiled> {
        let i = self.entries.iter().position(|(s, _)| s.as_slice() == source)?;
        let entry = self.entries.remove(i)?;
        let known = entry.1.clone();
        self.entries.push_front(entry);
        Some(known)
    }

    /// Remembers what became of `source`, forgetting the least recently
    /// used to make room. "Let the worker compile it" is not remembered:
    /// it may come of a passing shortage here.
    pub fn put(&mut self, source: Vec<u8>, compiled: Compiled) {
        let size = source.len() + compiled.payload_len();
        if matches!(compiled, Compiled::InWorker) || source.len() > MAX_SOURCE || size > BYTES {
            return;
        }
        if let Some(i) = self.entries.iter().position(|(s, _)| *s == source) {
            let (s, c) = self.entries.remove(i).expect("a found index");
            self.bytes -= s.len() + c.payload_len();
        }
        while self.entries.len() >= ENTRIES || self.bytes + size > BYTES {
            let Some((s, c)) = self.entries.pop_back() else { break };
            self.bytes -= s.len() + c.payload_len();
        }
        self.bytes += size;
        self.entries.push_front((source, compiled));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(n: usize) -> Compiled {
        Compiled::Code(vec![b'c'; n])
    }

    #[test]
    fn remembers_the_most_recent_within_its_bounds() {
        let mut c = CompiledCache::default();
        assert_eq!(c.get(b"a"), None);
        c.put(b"a".to_vec(), code(3));
        c.put(b"b".to_vec(), Compiled::SyntaxError(b"bad".to_vec()));
        assert_eq!(c.get(b"a"), Some(code(3)));
        assert_eq!(c.get(b"b"), Some(Compiled::SyntaxError(b"bad".to_vec())));
        // Never remembered: the worker's own compile, an oversized source.
        c.put(b"w".to_vec(), Compiled::InWorker);
        assert_eq!(c.get(b"w"), None);
        c.put(vec![b'x'; MAX_SOURCE + 1], code(1));
        assert_eq!(c.entries.len(), 2);
        // Put twice: one entry, counted once.
        c.put(b"a".to_vec(), code(3));
        assert_eq!((c.entries.len(), c.bytes), (2, 1 + 3 + 1 + 3));
        // By count: "a" was used last, so "b" goes first.
        for i in 0..ENTRIES - 1 {
            c.put(format!("s{i}").into_bytes(), code(1));
            let _ = c.get(b"a");
        }
        assert_eq!(c.entries.len(), ENTRIES);
        assert_eq!(c.get(b"b"), None);
        assert_eq!(c.get(b"a"), Some(code(3)));
        // By bytes: a big answer pushes the older ones out.
        c.put(b"big".to_vec(), code(BYTES - 10));
        assert!(c.bytes <= BYTES, "{}", c.bytes);
        assert_eq!(c.get(b"big"), Some(code(BYTES - 10)));
        assert_eq!(c.get(b"s0"), None);
        let counted: usize = c.entries.iter().map(|(s, a)| s.len() + a.payload_len()).sum();
        assert_eq!(counted, c.bytes);
    }
}
