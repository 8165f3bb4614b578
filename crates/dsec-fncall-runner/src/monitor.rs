//! `dsec-agent fncall-monitor ZYGOTE_PY [--exec-zygote]`: the FnCall
//! runner's monitor.
//!
//! The edge starts it once per runner, as root inside the runner's
//! sandbox, through the guest agent (dsec-fncall's runner.rs). Its first
//! line, {"ready": ...}, goes out on stdout (the agent's exec stream); the
//! edge then connects to the monitor's own socket (edge_link.rs), which
//! carries everything else. Requests are `<length>\n<JSON>`; answers are
//! one JSON line each, followed by the raw parts the line announces.
//!
//! Per call it prepares the scratch directory and the stdio memfds, has
//! the compiler (compiler.rs) turn a Python call's source into a code
//! object (a source seen lately is answered from compiled_cache.rs),
//! hands the call to the zygote's pre-forked worker (see zygote.py: a warm
//! Python interpreter the monitor starts once and which forks one worker
//! ahead of each call), waits for the worker's end, answers and cleans
//! up. With `--exec-zygote` (the edge gives it to runners of every
//! language but Python) there is no compiler and the zygote is
//! exec_zygote.rs, which forks far more cheaply: every step then execs its
//! program, a Python checker's too (`python3 main.py`). It holds calls'
//! data but never forks after starting its two helpers, so no call inherits its memory. It is
//! single-threaded and makes only blocking system calls: a call is about
//! thirty of them, and in Rust they are most of its cost (the Python
//! monitor it replaced spent ~0.4 ms per call, mostly interpretation).
//!
//! Cleanup after every call: kill(-1, SIGKILL) with the call user's real
//! and effective uid ends every process the call started; every entry the
//! call user owns in a writable directory is removed, and its System V IPC
//! objects, and the scratch directory. A call that left no process,
//! created nothing in those directories and holds no IPC object (most
//! calls) skips the searches: see Family::only_helpers_left, SweepWatch and
//! ipc::objects_exist.

use crate::error::{broken, last_os, os, refused, RunnerError};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

use base64::Engine;

use crate::answer::{self, Answer, Part};
use crate::cleanup::Family;
use crate::compiler::{Compiled, Compiler};
use crate::langs::{self, Lang};
use crate::request::{self, Parsed, Request, RequestReader};
use crate::sweep::{self, SweepWatch};
use crate::worker::{self, Program, Step};
use crate::zygote::{self, Zygote};
use crate::{edge_link, ipc, outcome, scratch, sys, BASE, EXEC_ZYGOTE_FLAG, MONITOR_MODE, SCRATCH};

/// At most this many bytes of fetched files per call.
const MAX_FETCH_BYTES: u64 = 8 << 20;

/// Why a request got no result.
enum Failure {
    /// Answered with {"error": ...}; the monitor goes on.
    Answer(String),
    /// The runner cannot be trusted any more: the monitor exits (the edge
    /// sees the runner's command end and retires it).
    Fatal(RunnerError),
}

fn answerable(e: impl std::fmt::Display) -> Failure {
    Failure::Answer(e.to_string())
}

fn unb64(what: &str, s: &str) -> Result<Vec<u8>, Failure> {
    base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| Failure::Answer(format!("{what}: bad base64: {e}")))
}

/// What a Python step's RLIMIT_AS allows beyond its memory limit when it
/// runs as `python3 main.py` (in an exec zygote's runner): the fresh
/// interpreter's own mappings (14-17 MiB here), which a warm call leaves
/// out by counting from the zygote's size.
const PYTHON_EXEC_AS_BYTES: u64 = 32 << 20;

pub fn run(args: &[String]) -> Result<(), RunnerError> {
    let (script, exec_zygote) = match args {
        [script] => (script, false),
        [script, flag] if flag == EXEC_ZYGOTE_FLAG => (script, true),
        _ => return Err(RunnerError::Usage(format!("usage: dsec-agent {MONITOR_MODE} ZYGOTE_PY [{EXEC_ZYGOTE_FLAG}]"))),
    };
    Monitor::start(script, exec_zygote)?.serve()
}

struct Monitor {
    zygote: Zygote,
    /// None with the exec zygote: Python steps are then exec'd.
    compiler: Option<Compiler>,
    /// The image's python3, for Python steps exec'd.
    python: Option<String>,
    family: Family,
    /// Every directory the call user could create files in.
    sweep: Vec<String>,
    watch: SweepWatch,
}

impl Monitor {
    fn start(script: &str, exec_zygote: bool) -> Result<Monitor, RunnerError> {
        std::fs::DirBuilder::new().recursive(true).mode(0o711).create(BASE).map_err(os(BASE))?;
        std::fs::set_permissions(BASE, std::fs::Permissions::from_mode(0o711)).map_err(os(BASE))?;
        let sweep = sweep::writable_dirs();
        // Orphans of calls are reparented to us, and reaped here.
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(last_os("PR_SET_CHILD_SUBREAPER"));
        }
        // Rust ignores SIGPIPE; the edge gone means we are done.
        // SAFETY: restores a signal's default action; no handler runs.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let python = sys::which("python3");
        let (zygote, compiler) = if exec_zygote {
            (zygote::start_exec()?, None)
        } else {
            let python = python.as_deref().ok_or_else(|| refused("the image has no python3"))?;
            let compiler = Compiler::start(python, script, &format!("{SCRATCH}/{}", langs::PYTHON_FILE))?;
            (zygote::start(python, script)?, Some(compiler))
        };
        let family = Family::new(zygote.pid, compiler.as_ref().map(|c| c.pid))?;
        let watch = SweepWatch::new(&sweep);
        Ok(Monitor { zygote, compiler, python, family, sweep, watch })
    }

    fn serve(mut self) -> Result<(), RunnerError> {
        // Bound before the ready line, so the edge finds it at once.
        let listener = edge_link::Listener::bind().map_err(os(edge_link::MONITOR_SOCKET))?;
        // SAFETY: fd 1 is the agent's stream of our stdout, open for our life.
        let stdout = unsafe { std::os::fd::BorrowedFd::borrow_raw(1) };
        let ready = serde_json::json!({
            "ready": true,
            "languages": langs::available(self.python.is_some()),
            "preloaded": self.zygote.loaded,
            "sweep": self.sweep,
        });
        let mut line = ready.to_string().into_bytes();
        line.push(b'\n');
        sys::write_all(stdout, &line).map_err(os("writing to the edge"))?;
        let edge = listener.accept().map_err(os("waiting for the edge's connection"))?;
        let link = edge.as_fd();
        let mut requests = RequestReader::new(link);
        loop {
            let data = match requests.next() {
                Ok(Some(d)) => d,
                Ok(None) => return Ok(()), // the edge is done with this runner
                Err(e) => {
                    let answer = Answer { fatal: true, ..Answer::error(e.to_string()) };
                    return answer::send(link, &answer, &[]).map_err(os("writing to the edge"));
                }
            };
            let (answer, parts) = match request::parse(&data) {
                Parsed::Bad { id, error } => (Answer { id, ..Answer::error(error) }, Vec::new()),
                Parsed::Ok(req) => match self.handle(&req) {
                    Ok((answer, parts)) => (Answer { id: req.id.into(), ..answer }, parts),
                    Err(Failure::Answer(e)) => (Answer { id: req.id.into(), ..Answer::error(e) }, Vec::new()),
                    Err(Failure::Fatal(e)) => return Err(e),
                },
            };
            answer::send(link, &answer, &parts).map_err(os("writing to the edge"))?;
        }
    }

    /// Serves one request: its answer and raw parts.
    fn handle(&mut self, req: &Request<'_>) -> Result<(Answer, Vec<Part>), Failure> {
        match &*req.op {
            "ping" => return Ok((Answer::ok(), Vec::new())),
            "install" => {
                let binary = req.binary.as_deref().ok_or_else(|| answerable("install needs the binary"))?;
                scratch::install_program(&unb64("binary", binary)?).map_err(answerable)?;
                return Ok((Answer::ok(), Vec::new()));
            }
            _ => {}
        }
        let Some(lang) = Lang::named(&req.language) else {
            return Err(Failure::Answer(format!("unsupported language {:?}", req.language)));
        };
        let compile = match &*req.op {
            "run" => false,
            "compile" => true,
            op => return Err(Failure::Answer(format!("unknown op {op:?}"))),
        };
        let limits = req.limits.as_ref().ok_or_else(|| answerable("a run needs limits"))?;
        if let Some(compiler) = self.compiler.as_mut().filter(|_| lang.python && !compile) {
            // Compiled while the call's directory is made (call() takes it).
            compiler.submit(req.code.as_bytes()).map_err(Failure::Fatal)?;
        }
        scratch::prepare().map_err(answerable)?;
        // Plain names the monitor created in scratch (scratch::remove).
        let mut written = Vec::new();
        let served = self.call(req, lang, compile, limits, &mut written);
        let cleaned = self.clean_up(&written);
        // A fault of the cleanup outweighs the call's result.
        cleaned.and(served)
    }

    fn call(
        &mut self,
        req: &Request<'_>,
        lang: &'static Lang,
        compile: bool,
        limits: &request::Limits,
        written: &mut Vec<String>,
    ) -> Result<(Answer, Vec<Part>), Failure> {
        let mut files = Vec::new();
        for (name, content) in &req.files {
            files.push((name.clone(), unb64(&format!("file {name:?}"), content)?));
        }
        scratch::write_files(&files).map_err(answerable)?;
        let source = req.code.as_bytes();
        let (file, main) = lang.source_file(&req.code);
        let src_path = format!("{SCRATCH}/{file}");
        if compile || !lang.is_compiled() {
            scratch::write_new(&src_path, source, 0o644).map_err(|e| Failure::Answer(format!("writing {src_path}: {e}")))?;
            written.push(file.clone());
        }
        let stdin = unb64("stdin", &req.stdin)?;
        // Made before the compiler's answer is needed: more time for it to
        // finish on the other core, so less waiting for it here.
        let stdio = worker::Stdio::new(&stdin).map_err(|e| Failure::Answer(format!("memfd: {e}")))?;
        let code;
        let mut memory_bytes = lang.address_space_limit(limits.memory_bytes);
        let program = if compile {
            Program::Exec { argv: lang.compile_argv(&file, &main).ok_or_else(|| answerable(format!("{} has no compile step", lang.name)))? }
        } else if lang.python && self.compiler.is_none() {
            let python = self.python.clone().ok_or_else(|| answerable("the image has no python3"))?;
            if memory_bytes > 0 {
                memory_bytes += PYTHON_EXEC_AS_BYTES;
            }
            Program::Exec { argv: vec![python, src_path.clone()] }
        } else if let Some(compiler) = self.compiler.as_mut().filter(|_| lang.python) {
            match compiler.result().map_err(Failure::Fatal)? {
                Compiled::Code(c) => {
                    code = c;
                    Program::Python { path: &src_path, code: Some(&code) }
                }
                Compiled::InWorker => Program::Python { path: &src_path, code: None },
                // What `python3 main.py` prints and returns; no worker needed.
                Compiled::SyntaxError(text) => return syntax_error(text, limits.output_bytes),
            }
        } else {
            if lang.is_compiled() && !scratch::program_installed() {
                return Err(answerable("no compiled program installed"));
            }
            let argv = lang.run_argv(&file, limits.memory_bytes).ok_or_else(|| answerable(format!("{} cannot run", lang.name)))?;
            Program::Exec { argv }
        };
        // The language's variables (Go's memory limit...), then the call's;
        // most languages have none, and their calls copy nothing.
        let env = if lang.env.is_empty() {
            std::borrow::Cow::Borrowed(&req.env)
        } else {
            let mut env: std::collections::BTreeMap<String, String> = lang.step_env(limits.memory_bytes).collect();
            env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            std::borrow::Cow::Owned(env)
        };
        let step = Step {
            program,
            env: env.as_ref(),
            time_ms: limits.time_ms,
            memory_bytes,
            file_bytes: limits.file_bytes,
            output_bytes: limits.output_bytes,
        };
        let msg = worker::message(&step).map_err(answerable)?;
        let done = worker::run(&mut self.zygote, &self.family, &msg, stdio, step.time_ms, step.output_bytes).map_err(Failure::Fatal)?;
        let mut outcome = done.outcome;
        outcome.memory_exceeded = lang.exceeded(limits.memory_bytes, outcome.peak_memory_kb);
        let mut parts = Vec::new();
        let mut raw = Vec::new();
        for (name, fd) in [("stdout", done.stdout), ("stderr", done.stderr)] {
            let size = rustix::fs::fstat(&fd).map_err(answerable)?.st_size as u64;
            if size > limits.output_bytes {
                outcome.output_exceeded = true;
            }
            let len = size.min(limits.output_bytes);
            parts.push(Part { fd, len });
            raw.push((name.to_string(), len));
        }
        let mut answer = Answer { outcome: Some(outcome), ..Default::default() };
        if compile {
            answer.binary = Some(self.take_binary(answer.outcome.as_ref().and_then(|o| o.exit_code), req.max_binary_bytes)?);
        } else {
            fetch(req.fetch_files.iter(), &mut parts, &mut raw);
        }
        answer.raw = Some(raw);
        Ok((answer, parts))
    }

    /// After a compile step: installs the program it made, and returns it
    /// (base64) if it is no bigger than `max_bytes`.
    fn take_binary(&self, exit_code: Option<i32>, max_bytes: u64) -> Result<Option<String>, Failure> {
        if exit_code != Some(0) {
            return Ok(None);
        }
        let Some(data) = scratch::read_compiled() else { return Ok(None) };
        scratch::install_program(&data).map_err(answerable)?;
        Ok((data.len() as u64 <= max_bytes).then(|| base64::engine::general_purpose::STANDARD.encode(&data)))
    }

    /// What every call ends with, whatever happened to it.
    fn clean_up(&mut self, written: &[String]) -> Result<(), Failure> {
        if self.watch.changed() && !sweep::remove_owned(&self.sweep) {
            self.watch.give_up();
        }
        if !ipc::remove_all().map_err(Failure::Fatal)? {
            return Err(Failure::Fatal(broken("System V IPC objects of a call could not be removed")));
        }
        scratch::remove(written);
        Ok(())
    }
}

/// The answer to a Python call that does not compile: exit status 1 and
/// the error on stderr, as from `python3 main.py`.
fn syntax_error(text: Vec<u8>, output_bytes: u64) -> Result<(Answer, Vec<Part>), Failure> {
    let stdout = sys::memfd("stdout", b"").map_err(answerable)?;
    let stderr = sys::memfd("stderr", &text).map_err(answerable)?;
    let len = (text.len() as u64).min(output_bytes);
    let outcome = outcome::Outcome { exit_code: Some(1), output_exceeded: len < text.len() as u64, ..Default::default() };
    let answer = Answer { outcome: Some(outcome), raw: Some(vec![("stdout".into(), 0), ("stderr".into(), len)]), ..Default::default() };
    Ok((answer, vec![Part { fd: stdout, len: 0 }, Part { fd: stderr, len }]))
}

/// Adds the requested files of scratch to the answer's parts: regular
/// files only, opened without following symbolic links, at most
/// MAX_FETCH_BYTES in all; the others are left out.
fn fetch<'a>(names: impl Iterator<Item = &'a String>, parts: &mut Vec<Part>, raw: &mut Vec<(String, u64)>) {
    let mut budget = MAX_FETCH_BYTES;
    for name in names {
        let Some(rel) = request::safe_rel(name) else { continue };
        let Ok(fd) = scratch::open_beneath(&rel) else { continue };
        let Ok(st) = rustix::fs::fstat(fd.as_fd()) else { continue };
        let size = st.st_size as u64;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || size > budget {
            continue;
        }
        budget -= size;
        parts.push(Part { fd, len: size });
        raw.push((format!("file:{name}"), size));
    }
}
