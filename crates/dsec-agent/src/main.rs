//! dsec-agent: the guest agent, PID 1 of every sandbox.
//!
//! ```text
//! dsec-agent container                       # PID 1 of fresh namespaces
//! dsec-agent plain --root DIR [--sandbox-id ID]
//! dsec-agent guest                           # a service of a full VM's OS
//! ```
//! Either way it speaks dsec-agent-proto on fd 3. The handshake and (in
//! container mode) the setup run with blocking I/O before the event loop
//! starts; then a single-threaded tokio runtime serves every request.

mod agent;
mod aio;
mod audit;
mod caps;
mod changes;
mod channel;
mod container_setup;
mod envs;
mod errors;
mod exec;
mod files;
mod guest;
mod input;
mod launch;
mod ops;
mod paths;
mod pgroup;
mod port;
mod pty;
mod reaper;
mod reattach;
mod request;
mod seccomp;
mod server;
mod session;
mod session_state;
mod setup_error;
mod signals;
mod spawn;
mod spawner;
mod start_error;
mod startup;
mod tamper;
mod tar;
mod users;
mod vm_identity;
mod vm_init;
mod vm_net;

use std::fs::File;
use std::os::fd::OwnedFd;
use std::process::ExitCode;
use std::rc::Rc;

use dsec_agent_proto::codec::{read_frame, write_frame, CodecError};
use dsec_agent_proto::{AgentError, AgentState, ErrorKind, FromAgent, Op, Reply, ToAgent};

use agent::{Agent, Identity, Mode};
use paths::Root;
use setup_error::SetupError;
use spawn::ChildPolicy;
use start_error::StartError;

const USAGE: &str = "usage: dsec-agent container\n       dsec-agent plain --root DIR [--sandbox-id ID]\n       dsec-agent guest\n       dsec-agent spawner [--exec]\n       dsec-agent fncall-monitor ZYGOTE_PY [--exec-zygote]";

enum Cli {
    Container,
    /// A full VM's service (its channel is the virtio-serial port).
    Guest,
    /// The edge's spawn helper (socket on fd 3). `exec`: each agent execs
    /// this binary afresh instead of being forked from the helper.
    Spawner {
        exec: bool,
    },
    Plain {
        root: String,
        sandbox_id: String,
    },
}

fn parse_args(args: &[String]) -> Result<Cli, StartError> {
    let usage = |m: &str| StartError::Usage(m.into());
    match args.first().map(String::as_str) {
        Some("container") if args.len() == 1 => Ok(Cli::Container),
        Some("spawner") if args.len() == 1 => Ok(Cli::Spawner { exec: false }),
        Some("spawner") if args.len() == 2 && args[1] == "--exec" => Ok(Cli::Spawner { exec: true }),
        Some("guest") if args.len() == 1 => Ok(Cli::Guest),
        Some("plain") => {
            let mut root = None;
            let mut sandbox_id = "plain".to_string();
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--root" => root = it.next().cloned(),
                    "--sandbox-id" => sandbox_id = it.next().cloned().ok_or_else(|| usage("--sandbox-id needs a value"))?,
                    other => return Err(StartError::Usage(format!("unknown argument {other:?}"))),
                }
            }
            Ok(Cli::Plain { root: root.ok_or_else(|| usage("plain mode needs --root DIR"))?, sandbox_id })
        }
        _ => Err(usage("expected a mode")),
    }
}

fn main() -> ExitCode {
    if std::env::args().next().is_some_and(|a| vm_init::is_vm_init(&a)) {
        // The init of a microVM. Returning would panic the guest kernel
        // (and so end the VM): say why on the console first.
        let r = vm_init::boot()
            .map_err(StartError::from)
            .and_then(|()| startup::prepare_process().map_err(StartError::os("prepare the process")))
            .and_then(vm);
        if let Err(e) = r {
            eprintln!("dsec-agent (vm init): {e}");
        }
        return ExitCode::FAILURE;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Not an agent: the FnCall runner's monitor (a command the runner's
    // agent started) and its exec zygote (which the monitor starts).
    if let Some(run) = args.first().and_then(|m| dsec_fncall_runner::mode(m)) {
        return match run(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dsec-agent {}: {e}", args[0]);
                ExitCode::FAILURE
            }
        };
    }
    let cli = match parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dsec-agent: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Cli::Spawner { exec } = cli {
        // Not an agent: no channel protocol, no reaper, no fd 4.
        return match startup::prepare_spawner().map_err(StartError::os("prepare the process")).and_then(|()| spawner::run(exec)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dsec-agent spawner: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Cli::Guest = cli {
        // The port becomes fd 3 before the process hygiene that expects it.
        if let Err(e) = guest::attach() {
            eprintln!("dsec-agent guest: {e}");
            return ExitCode::FAILURE;
        }
    }
    let chan = match startup::prepare_process() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dsec-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match cli {
        Cli::Container => container(chan),
        Cli::Guest => full_vm(chan),
        Cli::Plain { root, sandbox_id } => plain(chan, &root, sandbox_id),
        Cli::Spawner { .. } => unreachable!("handled above"),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dsec-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A container agent forked from the spawn helper (see spawner.rs): the
/// same start as `dsec-agent container` after its execve. Returns the
/// process's exit status.
fn forked_container_agent() -> i32 {
    match startup::prepare_process().map_err(StartError::os("prepare the process")).and_then(container) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dsec-agent: {e}");
            1
        }
    }
}

/// Blocking handshake: our Hello, then the edge's, with a version both
/// speak.
fn handshake(chan: &mut File, state: AgentState) -> Result<(), StartError> {
    write_frame(chan, &server::hello(state)).map_err(StartError::channel("send Hello"))?;
    match read_frame::<_, ToAgent>(chan) {
        Ok(ToAgent::Hello(h)) => server::accept(&h).map(drop),
        Ok(other) => Err(StartError::NoHello(format!("{other:?}"))),
        Err(e) => Err(StartError::Channel { step: "read Hello", source: e }),
    }
}

fn policy() -> ChildPolicy {
    ChildPolicy { reset_oom: startup::oom_score_adj() != 0, restrict_caps: caps::can_restrict(), ignored_signals: signals::ignored_mask() }
}

fn devnull() -> Result<OwnedFd, SetupError> {
    rustix::fs::open("/dev/null", rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(setup_error::fail("open /dev/null"))
}

fn plain(chan: OwnedFd, root_dir: &str, sandbox_id: String) -> Result<(), StartError> {
    let root = Root::open(root_dir).map_err(setup_error::fail(format!("open --root {root_dir}")))?;
    // Not PID 1 here, but orphans of our commands should still come to us
    // (and be reaped by us) rather than to the host's init.
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        eprintln!("dsec-agent: cannot become a child subreaper: {}", std::io::Error::last_os_error());
    }
    let root_path = std::fs::canonicalize(root_dir).ok().map(|p| p.to_string_lossy().into_owned());
    let mut chan = File::from(chan);
    handshake(&mut chan, AgentState::Ready { sandbox_id: sandbox_id.clone() })?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let id = Identity {
        sandbox_id,
        // A plain agent passes its own environment on, as a runner would.
        image_env: std::env::vars().collect(),
        workdir: "/".into(),
        default_user: uid.to_string(),
    };
    let agent = Agent::new(Mode::Plain, id, root, root_path, devnull()?, policy());
    run(agent.clone(), chan.into(), None)?;
    // Leave nothing running behind us.
    agent.kill_and_reap_all();
    Ok(())
}

fn container(chan: OwnedFd) -> Result<(), StartError> {
    serve_sandbox(chan, Mode::Container, |op| match op {
        Op::SetupContainer(cfg) => {
            let ident = Identity {
                sandbox_id: cfg.sandbox_id.clone(),
                image_env: cfg.env.clone(),
                workdir: cfg.workdir.clone(),
                default_user: cfg.default_user.clone(),
            };
            let syscall_filter = cfg.syscall_filter;
            Some(Box::new(move || container_setup::setup(&cfg).map(|upper| SetupDone { ident, upper: Some(upper), syscall_filter })))
        }
        _ => None,
    })
}

fn vm(chan: OwnedFd) -> Result<(), StartError> {
    // After the process hygiene (which closes stray descriptors), before
    // the root is the sandbox's.
    vm_identity::open_random_device();
    serve_sandbox(chan, Mode::Vm, |op| match op {
        Op::SetupVm(cfg) => {
            let ident = vm_identity(&cfg);
            // The guest kernel is the boundary of a VM: no filter inside it.
            Some(Box::new(move || vm_init::setup(&cfg).map(|()| SetupDone { ident, upper: None, syscall_filter: false })))
        }
        _ => None,
    })
}

fn vm_identity(cfg: &dsec_agent_proto::VmSetup) -> Identity {
    Identity {
        sandbox_id: cfg.sandbox_id.clone(),
        image_env: cfg.env.clone(),
        workdir: cfg.workdir.clone(),
        default_user: cfg.default_user.clone(),
    }
}

fn full_vm(chan: OwnedFd) -> Result<(), StartError> {
    serve_sandbox(chan, Mode::Guest, |op| match op {
        Op::SetupVm(cfg) => {
            let ident = vm_identity(&cfg);
            Some(Box::new(move || guest::setup(&cfg).map(|()| SetupDone { ident, upper: None, syscall_filter: false })))
        }
        _ => None,
    })
}

/// A sandbox's setup, run once its request arrived.
type SetupFn = Box<dyn FnOnce() -> Result<SetupDone, SetupError>>;

/// What a setup leaves for the event loop.
struct SetupDone {
    ident: Identity,
    /// O_PATH fd of the overlay's upper directory (containers: tamper.rs).
    upper: Option<OwnedFd>,
    /// Whether to install the system-call filter before serving.
    syscall_filter: bool,
}

/// Handshake, the one setup request `accept` recognises (anything else
/// first is refused), the image's default user checked, then the event
/// loop.
fn serve_sandbox(chan: OwnedFd, mode: Mode, accept: impl Fn(Op) -> Option<SetupFn>) -> Result<(), StartError> {
    let mut chan = File::from(chan);
    handshake(&mut chan, AgentState::Fresh)?;
    let (id, setup) = loop {
        match read_frame::<_, ToAgent>(&mut chan) {
            Ok(ToAgent::Request { id, op }) => match accept(op) {
                Some(setup) => break (id, setup),
                None => {
                    let err = AgentError::new(ErrorKind::Protocol, "the first request must set the sandbox up");
                    write_frame(&mut chan, &FromAgent::Reply { id, result: Err(err) }).map_err(StartError::channel("refuse a request"))?;
                }
            },
            Ok(other) => eprintln!("dsec-agent: ignoring {other:?} before setup"),
            Err(CodecError::Decode(e)) => eprintln!("dsec-agent: dropped a malformed frame: {e}"),
            Err(e) => return Err(StartError::Channel { step: "wait for the setup request", source: e }),
        }
    };
    let setup = setup().and_then(|done| {
        let root = Root::open("/").map_err(setup_error::fail("open /"))?;
        Ok((done, root, devnull()?))
    });
    let (SetupDone { ident, upper, syscall_filter }, root, null) = match setup {
        Ok(v) => v,
        Err(e) => return Err(refuse_setup(&mut chan, id, AgentError::new(ErrorKind::SetupFailed, e.to_string()))),
    };
    // The default user must exist in the image: say so now, as a clear
    // error of the creation, rather than at the first command.
    if let Err(e) = users::lookup(&root, &ident.default_user) {
        return Err(refuse_setup(&mut chan, id, e));
    }
    // Last: everything above (mounts, /proc writes) is what the filter
    // refuses to the sandbox.
    let listener = if syscall_filter {
        match seccomp::install() {
            Ok(fd) => Some(fd),
            Err(e) => return Err(refuse_setup(&mut chan, id, AgentError::new(ErrorKind::SetupFailed, format!("system call filter: {e}")))),
        }
    } else {
        None
    };
    write_frame(&mut chan, &FromAgent::Reply { id, result: Ok(Reply::Ready) }).map_err(StartError::channel("answer the setup"))?;
    let agent = Agent::new(mode, ident, root, None, null, policy());
    if let Some(upper) = upper {
        // Serves the tamper check and the changed-files walk of the
        // trajectory log.
        let _ = agent.upper.set(upper);
    }
    run(agent, chan.into(), listener)
}

/// Answers the setup request with `err` (the edge's creation fails with
/// it), and returns it as this process's reason to end.
fn refuse_setup(chan: &mut File, id: u64, err: AgentError) -> StartError {
    // The process ends either way; a channel that cannot carry the answer
    // is the edge's to notice.
    let _ = write_frame(chan, &FromAgent::Reply { id, result: Err(err.clone()) });
    StartError::Refused(err)
}

/// The event loop: one thread, no blocking pool.
/// `listener`: the seccomp filter's, whose notifications the agent answers.
fn run(agent: Rc<Agent>, chan: OwnedFd, listener: Option<OwnedFd>) -> Result<(), StartError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        // An agent watches a handful of descriptors. The default buffer of
        // 1,024 events (12 KiB) left each idle agent two more private heap
        // pages than this one does (smaps), i.e. 8 KiB per sandbox.
        .max_io_events_per_tick(64)
        .build()
        .map_err(StartError::os("start the event loop"))?;
    let local = tokio::task::LocalSet::new();
    if let Some(fd) = listener {
        local.spawn_local(audit::supervise(agent.audit.clone(), fd));
    }
    local.block_on(&rt, server::serve(agent, chan));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn command_line() {
        assert!(matches!(parse_args(&args(&["container"])), Ok(Cli::Container)));
        assert!(matches!(parse_args(&args(&["guest"])), Ok(Cli::Guest)));
        assert!(parse_args(&args(&["guest", "extra"])).is_err());
        match parse_args(&args(&["plain", "--root", "/r", "--sandbox-id", "x"])) {
            Ok(Cli::Plain { root, sandbox_id }) => assert_eq!((root.as_str(), sandbox_id.as_str()), ("/r", "x")),
            _ => panic!("plain mode not parsed"),
        }
        assert!(parse_args(&args(&["plain"])).is_err());
        assert!(parse_args(&args(&["container", "extra"])).is_err());
        assert!(parse_args(&args(&[])).is_err());
        assert!(parse_args(&args(&["plain", "--root", "/r", "--bogus"])).is_err());
    }
}
