//! A bounded ring of samples: the newest `capacity`, oldest first.
//!
//! Its memory is taken at the first push, `capacity` slots, and never
//! grows: a sandbox's series costs the same whether it lived a minute or a
//! week (dropping the ring gives it back).

use std::collections::VecDeque;

#[derive(Debug)]
pub(crate) struct Ring<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T: Clone> Ring<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Ring { items: VecDeque::new(), capacity }
    }

    /// Adds `item` as the newest, dropping the oldest when full.
    pub(crate) fn push(&mut self, item: T) {
        if self.capacity == 0 {
            return;
        }
        if self.items.capacity() == 0 {
            self.items.reserve_exact(self.capacity);
        }
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    /// The newest `n` items (all if fewer), oldest first.
    pub(crate) fn last(&self, n: usize) -> Vec<T> {
        let skip = self.items.len().saturating_sub(n);
        self.items.iter().skip(skip).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_items_oldest_first() {
        let mut r = Ring::new(3);
        assert!(r.last(10).is_empty());
        for i in 0..5 {
            r.push(i);
        }
        assert_eq!(r.last(10), vec![2, 3, 4]);
        assert_eq!(r.last(2), vec![3, 4]);
        assert_eq!(r.last(0), Vec::<i32>::new());
        assert_eq!(r.items.len(), 3);
    }

    #[test]
    fn never_holds_more_than_its_capacity() {
        let mut r = Ring::new(300);
        for i in 0..10_000 {
            r.push(i);
        }
        assert_eq!(r.items.len(), 300);
        assert!(r.items.capacity() < 2 * 300, "the ring's memory does not grow: {}", r.items.capacity());
        assert_eq!(r.last(1), vec![9_999]);
    }

    #[test]
    fn a_ring_of_no_capacity_holds_nothing() {
        let mut r = Ring::new(0);
        r.push(1);
        assert_eq!((r.items.len(), r.items.capacity()), (0, 0));
    }
}
