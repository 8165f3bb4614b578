//! Runs one request to its single reply.

use std::rc::Rc;

use dsec_agent_proto::{AgentError, ErrorKind, Op, Reply};

use crate::agent::{Agent, Mode};
use crate::errors::protocol;
use crate::request::ReqCtx;
use crate::{changes, exec, files, pty, session, tar};

pub async fn run(agent: Rc<Agent>, ctx: Rc<ReqCtx>, op: Op) {
    let shutdown = matches!(op, Op::Shutdown);
    agent.request_started();
    let result = handle(&agent, &ctx, op).await;
    ctx.reply(result);
    agent.request_finished();
    if shutdown {
        // The reply must reach the edge before we go.
        ctx.conn().flush().await;
        std::process::exit(0);
    }
}

async fn handle(agent: &Rc<Agent>, ctx: &Rc<ReqCtx>, op: Op) -> Result<Reply, AgentError> {
    match op {
        Op::Ping => Ok(Reply::Pong),
        Op::SetupContainer(_) | Op::SetupVm(_) => Err(match agent.mode {
            Mode::Container | Mode::Vm | Mode::Guest => protocol("the sandbox is already set up"),
            Mode::Plain => AgentError::new(ErrorKind::Unsupported, "plain mode has no container to set up"),
        }),
        Op::Exec(spec) if spec.session.is_some() => session::exec(agent, ctx, spec).await,
        Op::Exec(spec) => exec::exec(agent, ctx, spec).await,
        Op::OpenSession(spec) => session::open(agent, spec),
        Op::CloseSession { session_id } => session::close(agent, &session_id),
        Op::OpenPty(spec) => pty::open(agent, ctx, spec).await,
        Op::ReadFile { path, offset, limit } => files::read_file(agent, ctx, &path, offset, limit).await,
        Op::WriteFile(spec) => files::write_file(agent, ctx, spec).await,
        Op::Stat { path } => files::stat(agent, &path),
        Op::ListDir { path } => files::list_dir(agent, &path),
        Op::Mkdir { path, parents, mode } => files::mkdir(agent, &path, parents, mode),
        Op::Remove { path, recursive } => files::remove(agent, &path, recursive),
        Op::TarCreate { path } => tar::create(agent, ctx, &path).await,
        Op::TarExtract { path, max_bytes } => tar::extract(agent, ctx, &path, max_bytes).await,
        Op::AuditEvents { after } => Ok(Reply::Audit(agent.audit.borrow().since(after))),
        Op::ChangedSince { since_sec, since_nsec, max_paths } => {
            changes::changed_since(agent.upper.get(), &agent.changes_seen, since_sec, since_nsec, max_paths)
        }
        Op::RecordAudit { events } => {
            let mut ring = agent.audit.borrow_mut();
            for e in events {
                ring.push(e.time_ms, &e.kind, e.pid, e.detail);
            }
            Ok(Reply::Done)
        }
        Op::Reidentify(id) => crate::vm_identity::reidentify(agent, id),
        Op::ConnectPort { port } => crate::port::connect(ctx, port).await,
        Op::Shutdown => {
            agent.kill_everything();
            // tmpfs has nothing to flush; a VM's disk does. syncfs, not
            // sync: in plain mode the host's other filesystems are not ours.
            // (syncfs needs a real fd, not the O_PATH root.)
            let root = crate::paths::SandboxPath::parse("/")?;
            if let Ok(fd) = agent.root.open_at(&root, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY, rustix::fs::Mode::empty())
            {
                let _ = rustix::fs::syncfs(&fd);
            }
            Ok(Reply::Done)
        }
    }
}
