"""The code sample of the DSec paper, unchanged, against a running dsec.

Endpoint and token come from DSEC_ENDPOINT and DSEC_TOKEN.
"""
import asyncio

from dsec import DSecClient, DSecContainerRunArgs


async def main() -> None:
    client = DSecClient()
    await client.open()
    args = DSecContainerRunArgs(container_image="python", memory_limit_mb=1024,
                                cpu_cores_limit=1, ttl_running_stop=300,
                                network_rules={"npm": False, "pypi": True}, init_user="root")
    sandbox = await client.run_container(args, timeout=120)
    result = await sandbox.run_shell("echo hello world")
    assert result.exit_code == 0 and result.stdout == "hello world\n"
    print(f"sandbox {sandbox.id}: {result.stdout.strip()!r} (exit {result.exit_code}, {result.duration_ms:.1f} ms)")
    await sandbox.stop()
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
