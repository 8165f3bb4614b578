//! Compiling the policy into seccomp BPF programs with `seccompiler`.
//!
//! Two programs, because one seccompiler filter has a single action for
//! every match:
//! - the *quiet* one refuses clone3 with ENOSYS and every x32-ABI call
//!   (numbers with bit 30 set: another table of system call numbers the
//!   rules below would not cover);
//! - the *audited* one returns SECCOMP_RET_USER_NOTIF for every rule of
//!   policy.rs, so the agent hears of each attempt.
//!
//! seccompiler has no USER_NOTIF action: the audited program is compiled
//! with a marker action (SECCOMP_RET_TRACE with a fixed value, never used
//! otherwise) and each `ret marker` instruction is then rewritten. Both
//! programs start with seccompiler's architecture check, which kills a
//! process that makes a system call of another architecture (i386 calls
//! through `int 0x80` on x86_64 would otherwise use numbers no rule names).

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

use super::policy::{self, When};

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
/// `seccomp_data.nr`.
const NR_OFFSET: u32 = 0;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// The marker stands for USER_NOTIF until [`rewrite_marker`] replaces it.
const MARKER: u32 = 0xd5ec;

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("seccompiler: {0}")]
    Compile(#[from] seccompiler::BackendError),
    #[error("this architecture has no system call filter")]
    UnsupportedArch,
}

fn arch() -> Result<TargetArch, BpfError> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Ok(TargetArch::aarch64)
    } else {
        Err(BpfError::UnsupportedArch)
    }
}

fn rule(when: When) -> Result<Option<SeccompRule>, BpfError> {
    let cond = |arg, len, op, val| SeccompCondition::new(arg, len, op, val);
    Ok(match when {
        When::Always => None,
        When::IoctlCmd(cmd) => Some(SeccompRule::new(vec![cond(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, u64::from(cmd))?])?),
        // True when every bit of `bits` is set: the caller passes one bit.
        When::FlagsAny(bits) => Some(SeccompRule::new(vec![cond(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(bits), bits)?])?),
        When::ArgMaskedEq { arg, mask, value } => {
            Some(SeccompRule::new(vec![cond(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(u64::from(mask)), u64::from(value))?])?)
        }
    })
}

/// The audited program (USER_NOTIF for every rule).
pub fn audited() -> Result<BpfProgram, BpfError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for r in policy::refused() {
        let entry = rules.entry(r.nr).or_default();
        match r.when {
            When::Always => entry.clear(),
            // "any of these bits": one rule per bit (rules of one system
            // call are alternatives; MaskedEq tests all bits of its mask).
            When::FlagsAny(bits) => {
                for bit in (0..64).map(|i| 1u64 << i).filter(|b| bits & b != 0) {
                    entry.extend(rule(When::FlagsAny(bit))?);
                }
            }
            When::IoctlCmd(_) | When::ArgMaskedEq { .. } => entry.extend(rule(r.when)?),
        }
    }
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Trace(MARKER), arch()?)?;
    let mut prog: BpfProgram = filter.try_into()?;
    rewrite_marker(&mut prog);
    Ok(prog)
}

/// The quiet program: ENOSYS for clone3 and the x32 ABI.
pub fn quiet() -> Result<BpfProgram, BpfError> {
    let rules = policy::QUIET_ENOSYS.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch()?)?;
    let mut prog: BpfProgram = filter.try_into()?;
    if cfg!(target_arch = "x86_64") {
        // After the 3-instruction architecture check (whose pass jumps to
        // the next instruction): load nr; nr >= X32 bit -> ENOSYS. The rest
        // of the program loads nr again itself.
        let refuse = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        let guard = [stmt(BPF_LD_W_ABS, NR_OFFSET), jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1), stmt(BPF_RET_K, refuse)];
        prog.splice(3..3, guard);
    }
    Ok(prog)
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn rewrite_marker(prog: &mut BpfProgram) {
    let marker = libc::SECCOMP_RET_TRACE | MARKER;
    for ins in prog.iter_mut().filter(|i| i.code == BPF_RET_K && i.k == marker) {
        ins.k = libc::SECCOMP_RET_USER_NOTIF;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audited_program_notifies_and_never_traces() {
        let prog = audited().unwrap();
        let rets: Vec<u32> = prog.iter().filter(|i| i.code == BPF_RET_K).map(|i| i.k).collect();
        assert!(rets.contains(&libc::SECCOMP_RET_USER_NOTIF));
        assert!(rets.contains(&libc::SECCOMP_RET_ALLOW));
        assert!(rets.iter().all(|k| k & libc::SECCOMP_RET_ACTION_FULL != libc::SECCOMP_RET_TRACE), "a marker was left");
        assert!(prog.len() < 4096);
    }

    #[test]
    fn quiet_program_starts_with_arch_check_then_x32_guard() {
        let prog = quiet().unwrap();
        assert_eq!(prog[2].k, libc::SECCOMP_RET_KILL_PROCESS);
        if cfg!(target_arch = "x86_64") {
            assert_eq!((prog[4].code, prog[4].k), (BPF_JGE_K, X32_SYSCALL_BIT));
            assert_eq!(prog[5].k, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
        }
    }
}
