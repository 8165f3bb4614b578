"""Run arguments serialise to exactly the fields that were set."""

from __future__ import annotations

import dataclasses

import pytest

from dsec import BaseRunArgs, DSecContainerRunArgs, DSecRunArgs


def test_paper_listing_args() -> None:
    args = DSecContainerRunArgs(container_image="python", memory_limit_mb=1024,
                                cpu_cores_limit=1, ttl_running_stop=300,
                                network_rules={}, init_user="root")
    assert args.to_json() == {
        "backend": "container",
        "image": "python",
        "memory_limit_mb": 1024,
        "cpu_cores_limit": 1,
        "ttl_running_stop": 300,
        "init_user": "root",
    }


def test_container_image_is_sent_as_image() -> None:
    body = DSecContainerRunArgs(container_image="busybox:1.36").to_json()
    assert body == {"backend": "container", "image": "busybox:1.36"}
    assert "container_image" not in body


def test_container_args_expose_image_and_backend() -> None:
    args = DSecContainerRunArgs(container_image="python")
    assert args.image == "python"
    assert args.backend == "container"
    assert isinstance(args, BaseRunArgs)


def test_only_set_fields_are_sent() -> None:
    args = DSecRunArgs(image="python")
    assert args.to_json() == {"backend": "container", "image": "python"}


def test_every_field_when_set() -> None:
    args = DSecRunArgs(
        backend="microvm", image="ubuntu:24.04", workspace="ws-1", toolkits=["tk-a", "tk-b"],
        memory_limit_mb=2048, cpu_cores_limit=0.5, disk_limit_mb=4096, pids_limit=100,
        ttl_running_stop=60, max_lifetime_s=3600, network_rules={"pypi": True, "npm": False},
        init_user="user", env={"A": "1"}, workdir="/app", labels={"task": "t1"}, job="job-7",
    )
    assert args.to_json() == {
        "backend": "microvm", "image": "ubuntu:24.04", "workspace": "ws-1",
        "toolkits": ["tk-a", "tk-b"], "memory_limit_mb": 2048, "cpu_cores_limit": 0.5,
        "disk_limit_mb": 4096, "pids_limit": 100, "ttl_running_stop": 60,
        "max_lifetime_s": 3600, "network_rules": {"pypi": True, "npm": False},
        "init_user": "user", "env": {"A": "1"}, "workdir": "/app", "labels": {"task": "t1"},
        "job": "job-7",
    }


def test_zero_is_set_not_default() -> None:
    # ttl_running_stop=0 disables the idle timeout: it must be sent.
    body = DSecRunArgs(image="python", ttl_running_stop=0, max_lifetime_s=0).to_json()
    assert body["ttl_running_stop"] == 0
    assert body["max_lifetime_s"] == 0


def test_false_network_rule_is_sent() -> None:
    body = DSecRunArgs(image="python", network_rules={"npm": False}).to_json()
    assert body["network_rules"] == {"npm": False}


def test_to_json_copies_collections() -> None:
    args = DSecRunArgs(image="python", labels={"a": "b"}, toolkits=["x"])
    body = args.to_json()
    body["labels"]["c"] = "d"
    body["toolkits"].append("y")
    assert args.labels == {"a": "b"}
    assert args.toolkits == ["x"]


def test_tuple_toolkits_become_a_list() -> None:
    body = DSecRunArgs(image="python", toolkits=("a", "b")).to_json()  # type: ignore[arg-type]
    assert body["toolkits"] == ["a", "b"]


def test_image_is_required() -> None:
    with pytest.raises(TypeError):
        DSecRunArgs()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        DSecContainerRunArgs()  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        DSecRunArgs(image="").to_json()


def test_defaults_are_not_shared() -> None:
    a, b = DSecRunArgs(image="x"), DSecRunArgs(image="y")
    a.labels["k"] = "v"
    assert b.labels == {}


def test_field_names_match_the_api() -> None:
    # The Rust CreateSandboxRequest fields (crates/dsec-api/src/sandboxes.rs).
    api = {"backend", "image", "workspace", "toolkits", "memory_limit_mb", "cpu_cores_limit",
           "disk_limit_mb", "pids_limit", "qos_class", "ttl_running_stop", "max_lifetime_s",
           "network_rules", "init_user", "env", "workdir", "labels", "job", "snapshot", "node_selector", "volumes"}
    assert {f.name for f in dataclasses.fields(DSecRunArgs)} == api
    container = {f.name for f in dataclasses.fields(DSecContainerRunArgs)}
    # A snapshot starts a microVM: not a container argument.
    assert container == (api - {"backend", "image", "snapshot"}) | {"container_image"}


def test_unknown_backend_string_passes_through() -> None:
    assert DSecRunArgs(backend="quantum", image="x").to_json()["backend"] == "quantum"


def test_volumes_are_sent_by_path_as_names_or_options() -> None:
    args = DSecContainerRunArgs(container_image="python",
                                volumes={"/data": "cache", "/ref": {"name": "ref", "read_only": True}})
    assert args.to_json() == {"backend": "container", "image": "python",
                              "volumes": {"/data": "cache", "/ref": {"name": "ref", "read_only": True}}}
    assert "volumes" not in DSecContainerRunArgs(container_image="python").to_json()
