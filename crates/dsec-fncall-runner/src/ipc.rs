//! System V IPC objects a call left in the runner's IPC namespace. The
//! monitor makes none, so every object there is a call's.

use super::sys::{as_call_user, read_small};
use crate::error::{os, RunnerError};

/// The *_INFO commands that count a namespace's objects: shmctl SHM_INFO
/// (struct shm_info: used_ids first), msgctl MSG_INFO (struct msginfo:
/// msgpool, the number of queues, first), semctl SEM_INFO (struct
/// seminfo: semusz, the number of sets, eighth int).
const SHM_INFO: i32 = 14;
const MSG_INFO: i32 = 12;
const SEM_INFO: i32 = 19;

/// Room for any of the three info structs (the largest, shm_info, is
/// under 128 bytes).
#[repr(C, align(8))]
struct InfoBuf([u8; 128]);

fn int_at(buf: &InfoBuf, index: usize) -> i32 {
    i32::from_ne_bytes(buf.0[index * 4..index * 4 + 4].try_into().expect("4 bytes"))
}

/// Whether the namespace holds any System V object: three system calls
/// instead of reading three /proc files. A failed count counts as "yes".
pub fn objects_exist() -> bool {
    let mut buf = InfoBuf([0; 128]);
    let p = buf.0.as_mut_ptr();
    // SAFETY: each *_INFO command writes one info struct, smaller than buf.
    if unsafe { libc::shmctl(0, SHM_INFO, p.cast()) } < 0 || int_at(&buf, 0) != 0 {
        return true;
    }
    // SAFETY: as above.
    if unsafe { libc::msgctl(0, MSG_INFO, p.cast()) } < 0 || int_at(&buf, 0) != 0 {
        return true;
    }
    // SAFETY: as above (semctl's fourth argument is the buffer).
    let sets = unsafe { libc::semctl(0, 0, SEM_INFO, p) };
    sets < 0 || int_at(&buf, 7) != 0
}

/// The ids in a /proc/sysvipc/* table (its second column).
fn ids_of_table(table: &[u8]) -> Vec<i32> {
    table
        .split(|b| *b == b'\n')
        .skip(1)
        .filter_map(|line| {
            let col = line.split(|b| b.is_ascii_whitespace()).filter(|c| !c.is_empty()).nth(1)?;
            std::str::from_utf8(col).ok()?.parse().ok()
        })
        .collect()
}

/// Removes every System V IPC object of the namespace. Removal needs
/// CAP_SYS_ADMIN, which the runner does not have, or the object's owner or
/// creator as effective uid, so it runs as the call user (whose objects
/// record it as creator even after an IPC_SET handed them to another uid).
/// Returns whether none is left.
pub fn remove_all() -> Result<bool, RunnerError> {
    if !objects_exist() {
        return Ok(true);
    }
    let tables: Vec<(&str, Vec<i32>)> = ["shm", "msg", "sem"]
        .into_iter()
        .map(|kind| (kind, read_small(&format!("/proc/sysvipc/{kind}")).map(|t| ids_of_table(&t)).unwrap_or_default()))
        .collect();
    as_call_user(|| {
        for (kind, ids) in &tables {
            for id in ids {
                // SAFETY: IPC_RMID takes no buffer.
                unsafe {
                    match *kind {
                        "shm" => libc::shmctl(*id, libc::IPC_RMID, std::ptr::null_mut()),
                        "msg" => libc::msgctl(*id, libc::IPC_RMID, std::ptr::null_mut()),
                        _ => libc::semctl(*id, 0, libc::IPC_RMID),
                    }
                };
            }
        }
    })
    .map_err(os("becoming the call user to remove its IPC objects"))?;
    Ok(!objects_exist())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_second_column() {
        let table = b"       key      shmid perms size\n         0      32769   600 4096\n  12345678          5   644 1\n";
        assert_eq!(ids_of_table(table), vec![32769, 5]);
        assert_eq!(ids_of_table(b"key id\n"), Vec::<i32>::new());
    }
}
