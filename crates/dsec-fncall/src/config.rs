//! Pools, runner sizes and call limits of one node's FnCall service.

use std::time::Duration;

/// The longest a call may run, seconds: SandboxFusion takes any timeout,
/// and an hour holds the longest RL and judge calls while bounding how long
/// one call keeps a runner.
pub const MAX_TIME_S: f64 = 3600.0;

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub language: String,
    /// Runners kept warm even when idle.
    pub min: u32,
    /// Runners at most; beyond, calls queue.
    pub max: u32,
}

#[derive(Debug, Clone)]
pub struct FnCallConfig {
    /// The image every runner starts from (`judge`: Python, bash, gcc, g++,
    /// a JDK, Node.js, Go).
    pub image: String,
    pub pools: Vec<PoolConfig>,
    /// Calls waiting for a runner, per language; one more gets `QueueFull`.
    pub queue_limit: usize,
    /// How long a queued call waits for a runner at most.
    pub queue_timeout: Duration,
    /// Runners idle this long above the pool's minimum are stopped.
    pub shrink_after: Duration,
    /// A runner is replaced after this many calls (bounds any slow drift).
    pub max_calls_per_runner: u64,
    /// Starting a runner (sandbox + zygote ready) must take at most this.
    pub start_timeout: Duration,
    /// Modules the Python zygote imports before forking calls.
    pub preload: Vec<String>,
    /// The memory of an ordinary runner; calls asking for more than it
    /// holds get runners made big enough for them.
    pub runner_memory_mb: u64,
    pub runner_cpu_cores: f64,
    /// A runner's CPU quota (its cgroup), at least runner_cpu_cores.
    pub runner_cpu_quota_cores: f64,
    pub runner_disk_mb: u64,
    /// The pids limit of a runner: what a fork bomb hits.
    pub runner_pids: u64,
    /// The CPU QoS class of runners. Latency sensitive by default: a
    /// judge's time limit is wall-clock time (`TLE`), and best-effort
    /// runners on a busy node would turn accepted programs into timeouts,
    /// a wrong reward. A node that serves only snippets without time
    /// limits that matter may make them best effort.
    pub runner_qos_class: dsec_edge::QosClass,
    pub default_time_s: f64,
    pub max_time_s: f64,
    pub default_memory_mb: u64,
    pub default_output_bytes: u64,
    pub max_output_bytes: u64,
    pub default_compile_time_s: f64,
    pub max_files_bytes: u64,
    /// Compiled programs kept by source hash, in bytes.
    pub compile_cache_bytes: u64,
    /// Programs larger than this are not cached.
    pub max_cached_binary_bytes: u64,
    pub max_test_cases: usize,
    pub max_batch: usize,
}

impl FnCallConfig {
    /// Defaults sized for a node with `cpus` cores.
    pub fn for_node(cpus: f64) -> Self {
        let scale = cpus.max(1.0) as u32;
        let pool = |language: &str, min: u32, max: u32| PoolConfig { language: language.into(), min, max };
        Self {
            image: "judge".into(),
            // Few runners per core: calls are CPU-bound, so more runners
            // than cores add no throughput, and the scheduler then shares
            // the cores among their cgroups with waits of 100-200 ms
            // (measured: 8 Python runners on 2 cores, p99 198 ms at 16
            // clients; 2-4 runners, the same calls/s with p99 30-58 ms).
            // One pool per language of the runners' table, in its order.
            pools: dsec_fncall_runner::languages()
                .map(|language| match language {
                    "python" => pool(language, 2, 2 * scale),
                    "bash" | "cpp" => pool(language, 1, scale),
                    // Started on their first call: most nodes' calls are
                    // Python and C++, and a JVM runner idles on memory.
                    _ => pool(language, 0, scale),
                })
                .collect(),
            queue_limit: 4096,
            queue_timeout: Duration::from_secs(120),
            shrink_after: Duration::from_secs(60),
            max_calls_per_runner: 10_000,
            start_timeout: Duration::from_secs(30),
            preload: [
                "math",
                "collections",
                "itertools",
                "functools",
                "heapq",
                "bisect",
                "re",
                "json",
                "string",
                "random",
                "typing",
                "fractions",
                "decimal",
                "statistics",
                "traceback",
                "types",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            runner_memory_mb: 1024,
            // One core reserved: a runner serves one call at a time. The
            // reservation counts against the node's admission like any
            // sandbox's, so reserving the whole node per runner would
            // crowd out user sandboxes.
            runner_cpu_cores: 1.0_f64.min(cpus),
            // But the quota is the whole node: a call is a pipeline of
            // processes (monitor, compiler, zygote, worker) that overlap
            // on several cores, and a one-core quota throttled a runner
            // serving one client in 79 of 87 periods (docs/benchmarks.md,
            // "Findings of the probes"). Runners still share the cores
            // fairly with every other sandbox (equal weights), and each
            // call's own CPU time is bounded by RLIMIT_CPU.
            runner_cpu_quota_cores: cpus.max(1.0),
            runner_disk_mb: 256,
            runner_pids: 64,
            runner_qos_class: dsec_edge::QosClass::LatencySensitive,
            default_time_s: 10.0,
            max_time_s: MAX_TIME_S,
            default_memory_mb: 256,
            default_output_bytes: 1 << 20,
            max_output_bytes: 16 << 20,
            default_compile_time_s: 10.0,
            max_files_bytes: 64 << 20,
            compile_cache_bytes: 256 << 20,
            max_cached_binary_bytes: 16 << 20,
            max_test_cases: 1000,
            max_batch: 1000,
        }
    }
}
