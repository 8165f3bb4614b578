//! Which runner a call's memory limit needs: the pool's ordinary runners
//! (most calls), or a bigger one, of a size that pools calls of similar
//! limits together; and the most a node can give one call.

/// Memory a runner keeps beyond its call's limit: the monitor, the
/// compiler, the zygote and the page cache of the call's files.
pub const RUNNER_OVERHEAD_MB: u64 = 128;
/// Bigger runners are made in steps of this, so that calls asking for
/// 1000 and 1024 MiB share a pool instead of each making its own.
pub const SIZE_STEP_MB: u64 = 512;

/// The most memory one call may ask for on a runner of `runner_mb`.
pub fn call_memory_mb(runner_mb: u64) -> u64 {
    runner_mb.saturating_sub(RUNNER_OVERHEAD_MB).max(16)
}

/// The runner size a call of `call_mb` needs: None when the ordinary
/// runners of `default_runner_mb` hold it, else a size of at most
/// `node_max_mb` (what one sandbox of the node may have). Err with the
/// largest call the node can take when even that is too small.
pub fn runner_memory_mb(call_mb: u64, default_runner_mb: u64, node_max_mb: u64) -> Result<Option<u64>, u64> {
    if call_mb <= call_memory_mb(default_runner_mb) {
        return Ok(None);
    }
    let largest = call_memory_mb(node_max_mb.max(default_runner_mb));
    if call_mb > largest {
        return Err(largest);
    }
    let needed = call_mb + RUNNER_OVERHEAD_MB;
    Ok(Some(needed.div_ceil(SIZE_STEP_MB).saturating_mul(SIZE_STEP_MB).min(node_max_mb).max(needed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_calls_take_the_ordinary_runners() {
        assert_eq!(runner_memory_mb(1, 1024, 24_000), Ok(None));
        assert_eq!(runner_memory_mb(896, 1024, 24_000), Ok(None));
    }

    #[test]
    fn bigger_calls_get_runners_in_steps() {
        // verl's default (1024 MiB) and its neighbours share one size.
        assert_eq!(runner_memory_mb(897, 1024, 24_000), Ok(Some(1536)));
        assert_eq!(runner_memory_mb(1024, 1024, 24_000), Ok(Some(1536)));
        assert_eq!(runner_memory_mb(1408, 1024, 24_000), Ok(Some(1536)));
        assert_eq!(runner_memory_mb(1409, 1024, 24_000), Ok(Some(2048)));
        assert_eq!(runner_memory_mb(4096, 1024, 24_000), Ok(Some(4608)));
    }

    #[test]
    fn the_node_bounds_the_size() {
        // Not a whole step left: the node's largest sandbox.
        assert_eq!(runner_memory_mb(23_800, 1024, 24_000), Ok(Some(24_000)));
        assert_eq!(runner_memory_mb(23_872, 1024, 24_000), Ok(Some(24_000)));
        assert_eq!(runner_memory_mb(23_873, 1024, 24_000), Err(23_872));
        assert_eq!(runner_memory_mb(u64::MAX, 1024, 24_000), Err(23_872));
    }
}
