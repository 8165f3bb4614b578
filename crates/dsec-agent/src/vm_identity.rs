//! A microVM restored from a memory image (a node template, or a fork of
//! another sandbox) becomes a sandbox of its own: `Op::Reidentify`.
//!
//! Every VM restored from one image starts with the same kernel state,
//! including the random number generator's. The host's random bytes are
//! credited to the input pool (RNDADDENTROPY) and the kernel's generator
//! is reseeded from it at once (RNDRESEEDCRNG), so each VM draws its own
//! numbers from then on. The device is opened at boot, before the guest's
//! root is the sandbox's (whose /dev a sandboxed root may replace), and
//! after the start-up closed stray descriptors.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;

use dsec_agent_proto::{AgentError, Reply, VmIdentity};

use crate::agent::{Agent, Mode};
use crate::errors::{io_err, os_err, protocol};

/// /dev/urandom, opened at boot.
static RANDOM: OnceLock<OwnedFd> = OnceLock::new();

/// `_IOW('R', 0x03, int[2])`: add bytes to the input pool, crediting bits.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the kernel's generator from the input pool now.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
/// Most seed bytes taken (the pool hashes whatever it gets).
const MAX_SEED: usize = 256;

/// Opens the random device for a later reseed (best effort: a guest
/// without it cannot be reseeded, and says so when asked).
pub fn open_random_device() {
    if let Ok(fd) = rustix::fs::open("/dev/urandom", rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty()) {
        let _ = RANDOM.set(fd);
    }
}

/// Takes `id`: the next greeting names its sandbox id; hostname, clock and
/// random generator are set.
pub fn reidentify(agent: &Agent, id: VmIdentity) -> Result<Reply, AgentError> {
    if agent.mode != Mode::Vm {
        return Err(protocol("only a microVM's agent takes a new identity"));
    }
    reseed(&id.seed)?;
    rustix::system::sethostname(id.hostname.as_bytes()).map_err(|e| os_err("sethostname", e))?;
    crate::vm_init::set_clock(id.now_ms);
    *agent.sandbox_id.borrow_mut() = id.sandbox_id;
    Ok(Reply::Done)
}

/// Mixes `seed` into the kernel's input pool (crediting it) and reseeds
/// the generator from the pool.
fn reseed(seed: &[u8]) -> Result<(), AgentError> {
    let Some(dev) = RANDOM.get() else { return Err(protocol("the guest has no /dev/urandom to reseed")) };
    if seed.is_empty() {
        return Ok(());
    }
    let seed = &seed[..seed.len().min(MAX_SEED)];
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + seed.len());
    info.extend_from_slice(&((seed.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(seed.len() as i32).to_ne_bytes());
    info.extend_from_slice(seed);
    // SAFETY: RNDADDENTROPY reads a rand_pool_info whose buf_size bytes
    // follow its header; `info` holds exactly that.
    if unsafe { libc::ioctl(dev.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) } != 0 {
        return Err(io_err("RNDADDENTROPY", std::io::Error::last_os_error()));
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(dev.as_raw_fd(), RNDRESEEDCRNG as _, 0) } != 0 {
        return Err(io_err("RNDRESEEDCRNG", std::io::Error::last_os_error()));
    }
    Ok(())
}
