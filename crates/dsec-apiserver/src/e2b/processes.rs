//! The processes started through envd's process service, per sandbox:
//! each is one streamed agent call held by a task of its own, so it
//! outlives the request that started it (E2B's background commands) and
//! any number of streams can attach to it (`Connect`). Output goes to the
//! streams attached at the time (none: it is dropped, as envd does); input,
//! signals and resizes go to the call. An entry leaves the table when its
//! process ends or its sandbox goes away.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use dsec_edge::agent::{Call, CallEvent, CallSender, ExecResult, Reply, Stream};
use tokio::sync::mpsc;

/// What a process was started with (envd's `ProcessConfig`), for `List`.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: Option<String>,
}

/// How a process is started, besides its call.
pub struct Spawn {
    pub tag: Option<String>,
    pub config: Config,
    pub pty: bool,
    /// Killed (SIGKILL) this long after its start: envd ends a process at
    /// its `Start` call's deadline (`Connect-Timeout-Ms`), though not when
    /// the call's stream merely goes away.
    pub deadline: Option<std::time::Duration>,
}

/// One event of a process, as streams see it.
#[derive(Debug, Clone)]
pub enum Event {
    Output {
        stream: Stream,
        data: Vec<u8>,
    },
    /// The process ended; nothing follows.
    End(ExecResult),
    /// The call failed (the agent refused it or went away); nothing follows.
    Failed(String),
}

pub struct Process {
    pub pid: u32,
    pub tag: Option<String>,
    pub config: Config,
    pub pty: bool,
    pub input: CallSender,
    watchers: Mutex<Vec<mpsc::Sender<Event>>>,
}

impl Process {
    /// A new stream of this process's events from now on.
    pub fn attach(&self) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        lock(&self.watchers).push(tx);
        rx
    }

    async fn publish(&self, ev: Event) {
        let watchers: Vec<_> = lock(&self.watchers).clone();
        for w in watchers {
            // A slow stream slows the process (the agent's credit holds
            // it back) rather than losing output; a closed one is dropped.
            if w.send(ev.clone()).await.is_err() {
                lock(&self.watchers).retain(|x| !x.same_channel(&w));
            }
        }
    }
}

/// Events buffered per attached stream.
const STREAM_BUFFER: usize = 64;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
pub struct ProcessTable {
    by_sandbox: Mutex<HashMap<String, BTreeMap<u32, Arc<Process>>>>,
    next_pid: AtomicU32,
}

/// How a selector names a process.
pub enum Selector {
    Pid(u32),
    Tag(String),
}

impl ProcessTable {
    /// Registers a started call and runs it to its end in a task of its
    /// own; `on_end` gets how it ended (for the trajectory log). The first
    /// stream is attached before any output can arrive.
    pub fn start<F, Fut>(self: &Arc<Self>, sandbox: &str, spawn: Spawn, call: Call, on_end: F) -> (Arc<Process>, mpsc::Receiver<Event>)
    where
        F: FnOnce(Result<Reply, String>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        // Numbered from 1000, clear of the low pids a sandbox's own
        // processes are likely to show.
        let (input, mut output) = call.into_split();
        let pid = 1000 + self.next_pid.fetch_add(1, Ordering::Relaxed);
        let Spawn { tag, config, pty, deadline } = spawn;
        let p = Arc::new(Process { pid, tag, config, pty, input, watchers: Mutex::new(Vec::new()) });
        let first = p.attach();
        lock(&self.by_sandbox).entry(sandbox.to_string()).or_default().insert(pid, p.clone());
        let (table, sandbox, proc_) = (self.clone(), sandbox.to_string(), p.clone());
        tokio::spawn(async move {
            // The deadline runs beside the pump, so a stream that holds
            // the pump back cannot hold the kill back too.
            let killer = deadline.map(|d| {
                let p = proc_.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    // Its end (killed by a signal) follows as usual.
                    let _ = p.input.signal(9);
                })
            });
            let end = loop {
                match output.recv().await {
                    Ok(Some(CallEvent::Data { stream, data })) => proc_.publish(Event::Output { stream, data }).await,
                    Ok(Some(CallEvent::Reply(Ok(Reply::Exited(r))))) => break Ok(Reply::Exited(r)),
                    Ok(Some(CallEvent::Reply(Ok(other)))) => break Err(format!("unexpected agent reply {other:?}")),
                    Ok(Some(CallEvent::Reply(Err(e)))) => break Err(e.message),
                    Ok(None) => break Err("the sandbox ended before the process did".into()),
                    Err(e) => break Err(e.to_string()),
                }
            };
            if let Some(k) = killer {
                k.abort();
            }
            // Out of the table before anyone hears of its end, so a `List`
            // after the end event never shows it.
            table.remove(&sandbox, proc_.pid);
            match &end {
                Ok(Reply::Exited(r)) => proc_.publish(Event::End(r.clone())).await,
                Ok(_) => {}
                Err(m) => proc_.publish(Event::Failed(m.clone())).await,
            }
            on_end(end).await;
        });
        (p, first)
    }

    fn remove(&self, sandbox: &str, pid: u32) {
        let mut all = lock(&self.by_sandbox);
        if let Some(procs) = all.get_mut(sandbox) {
            procs.remove(&pid);
            if procs.is_empty() {
                all.remove(sandbox);
            }
        }
    }

    pub fn find(&self, sandbox: &str, sel: &Selector) -> Option<Arc<Process>> {
        let all = lock(&self.by_sandbox);
        let procs = all.get(sandbox)?;
        match sel {
            Selector::Pid(pid) => procs.get(pid).cloned(),
            Selector::Tag(tag) => procs.values().find(|p| p.tag.as_deref() == Some(tag)).cloned(),
        }
    }

    pub fn list(&self, sandbox: &str) -> Vec<Arc<Process>> {
        lock(&self.by_sandbox).get(sandbox).map(|p| p.values().cloned().collect()).unwrap_or_default()
    }

    /// A killed sandbox's processes: their calls end with it; this only
    /// stops them from being found meanwhile.
    pub fn forget_sandbox(&self, sandbox: &str) {
        lock(&self.by_sandbox).remove(sandbox);
    }
}
