//! Process groups: every command the agent starts leads one of its own,
//! which is how the agent signals the command and whatever it started.

/// Sends `sig` to process group `pgid`; a group that is already gone is fine.
pub fn signal_group(pgid: i32, sig: i32) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill(2) with integer arguments; pgid > 1 never means "all".
    unsafe { libc::kill(-pgid, sig) };
}

pub fn group_alive(pgid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks existence.
    pgid > 1 && unsafe { libc::kill(-pgid, 0) } == 0
}

/// Pids of our direct children (from /proc/self/task/*/children).
pub fn own_children() -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    out
}
