-- wrk's done(): one "WRKJSON {...}" line with the run's counts and latency
-- percentiles, which the bench scripts parse. Loaded with dofile() by the
-- wrk scripts; $DSEC_BENCH_LUA_DIR (set by lib.sh) is this directory.
done = function(summary, latency, requests)
  io.write(string.format(
    "WRKJSON {\"requests\": %d, \"duration_us\": %d, \"errors_status\": %d, \"errors_socket\": %d, " ..
    "\"p50_ms\": %.3f, \"p90_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f, \"mean_ms\": %.3f}\n",
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, latency.mean / 1000))
end
