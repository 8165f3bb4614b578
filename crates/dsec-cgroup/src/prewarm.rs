//! A few kernel objects made ahead of demand by a thread of their own, so a
//! creation takes a ready one instead of paying for it on its critical path
//! (network namespaces: `container::netns_pool`; cgroup v1 directories:
//! `cgroup::v1`).
//!
//! When a burst empties the pool the caller makes its own, as without a
//! pool: a pool only ever moves work off the creation path, never adds a
//! wait to it. The thread sleeps while the pool is full.

use std::sync::{Arc, Condvar, Mutex};

struct State<T> {
    ready: Vec<T>,
    stopping: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Signalled when an item is taken or the pool stops.
    wake: Condvar,
}

impl<T> Shared<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Keeps `size` items made by `make` ready; on drop, stops its thread and
/// hands every item still ready to `discard`.
pub struct Prewarm<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    thread: Option<std::thread::JoinHandle<()>>,
    discard: Box<dyn Fn(T) + Send + Sync>,
}

impl<T: Send + 'static> Prewarm<T> {
    /// Starts the filling thread (`name` shows in `ps -T`). Fails only if
    /// the thread cannot start. `make` runs on that thread only; `what`
    /// names the items in the one warning a failing `make` logs.
    pub fn start(
        name: &str,
        what: &'static str,
        size: usize,
        make: impl FnMut() -> std::io::Result<T> + Send + 'static,
        discard: impl Fn(T) + Send + Sync + 'static,
    ) -> std::io::Result<Prewarm<T>> {
        let shared = Arc::new(Shared { state: Mutex::new(State { ready: Vec::new(), stopping: false }), wake: Condvar::new() });
        let filler = shared.clone();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || fill(&filler, size, what, make))?;
        Ok(Prewarm { shared, thread: Some(thread), discard: Box::new(discard) })
    }

    /// A ready item, if there is one.
    pub fn take(&self) -> Option<T> {
        let item = self.shared.lock().ready.pop();
        if item.is_some() {
            self.shared.wake.notify_one();
        }
        item
    }

    /// How many are ready now.
    pub fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }
}

impl<T: Send + 'static> Drop for Prewarm<T> {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for item in std::mem::take(&mut self.shared.lock().ready) {
            (self.discard)(item);
        }
    }
}

/// The filling thread: tops the pool up, then sleeps until an item is
/// taken. A failing `make` is retried with a growing pause (up to ~13 s),
/// and warned about once per run of failures.
fn fill<T>(shared: &Shared<T>, size: usize, what: &str, mut make: impl FnMut() -> std::io::Result<T>) {
    let mut failures = 0u32;
    loop {
        {
            let mut st = shared.lock();
            while !st.stopping && st.ready.len() >= size {
                st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.stopping {
                return;
            }
        }
        match make() {
            Ok(item) => {
                failures = 0;
                shared.lock().ready.push(item);
            }
            Err(e) => {
                // Creations then make their own, and report any error where
                // a caller sees it.
                if failures == 0 {
                    tracing::warn!(error = %e, "cannot make {what} ahead; creations make their own");
                }
                failures = failures.saturating_add(1);
                let pause = std::time::Duration::from_millis(100u64 << failures.min(7));
                let st = shared.lock();
                let (st, _) = shared.wake.wait_timeout(st, pause).unwrap_or_else(|p| p.into_inner());
                if st.stopping {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    fn wait_until(mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn fills_refills_and_discards_the_rest_on_drop() {
        let made = Arc::new(AtomicUsize::new(0));
        let discarded = Arc::new(AtomicUsize::new(0));
        let (m, d) = (made.clone(), discarded.clone());
        let pool = Prewarm::start(
            "test-prewarm",
            "test items",
            3,
            move || Ok(m.fetch_add(1, Ordering::SeqCst)),
            move |_| {
                d.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        wait_until(|| pool.ready() == 3);
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert_ne!(a, b);
        wait_until(|| pool.ready() == 3);
        assert_eq!(made.load(Ordering::SeqCst), 5, "made only what was taken, plus the first fill");
        drop(pool);
        assert_eq!(discarded.load(Ordering::SeqCst), 3, "items still ready are discarded");
    }

    #[test]
    fn a_failing_maker_leaves_the_pool_empty_and_stops_promptly() {
        let pool: Prewarm<u8> = Prewarm::start("test-prewarm", "test items", 2, || Err(std::io::Error::other("no")), |_| {}).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(pool.take().is_none());
        let t = Instant::now();
        drop(pool);
        assert!(t.elapsed() < Duration::from_secs(2), "drop waits only for the current pause to be cut short");
    }
}
