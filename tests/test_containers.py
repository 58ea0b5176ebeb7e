"""The pure parts of the docker target and container faults: create arguments from the spec, published
ports, ownership by labels, the image skeleton, CFS quotas, and the target keys' validation."""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

import pytest

from chaos.docker.containers import (
    LABEL_RUN_DIR,
    LABEL_RUN_ID,
    ownership_problem,
    parse_gpus,
    parse_volume,
    run_labels,
)
from chaos.execution.rollback import outstanding_resources
from chaos.experiment import experiment_from_dict
from chaos.model.errors import ExperimentInvalid, SetupFailed
from chaos.targets.docker import container_config, published_port
from chaos.targets.host_image import host_mounts, skeleton_tar
from faults.docker import quota_for


def spec(**target: Any) -> Any:
    return experiment_from_dict({"name": "t", "target": {"kind": "docker", **target},
                                 "phases": [{"name": "p", "duration": "1s"}]}).target


def test_container_config_from_the_spec() -> None:
    target = spec(image="vllm/vllm-openai:v0.6", command=["--model", "m"], env={"HF_HOME": "/cache"},
                  volumes=["/models:/models:ro"], gpus="device=0,2", network="bridge", port=8000)
    config = container_config(target, image="vllm/vllm-openai:v0.6", port=8000, labels={"l": "v"}, name="n")
    assert config["command"] == ["--model", "m"] and config["environment"] == {"HF_HOME": "/cache"}
    assert config["volumes"] == ["/models:/models:ro"]
    assert config["ports"] == {"8000/tcp": ("127.0.0.1", None)} and "network_mode" not in config
    request = config["device_requests"][0]
    assert request["DeviceIDs"] == ["0", "2"] and request["Capabilities"] == [["gpu"]]
    assert config["restart_policy"] == {"Name": "no"} and "user" not in config
    # bridge is the default (issue 23: a server binding 0.0.0.0 must not land on the host's interfaces)
    everything = container_config(spec(gpus="all"), image="i", port=1, labels={}, name="n", hardened_user="1000:1000")
    assert everything["device_requests"][0]["Count"] == -1 and "network_mode" not in everything
    assert everything["ports"] == {"1/tcp": ("127.0.0.1", None)}
    host = container_config(spec(network="host"), image="i", port=1, labels={}, name="n")
    assert host["network_mode"] == "host" and "ports" not in host
    assert everything["read_only"] and everything["cap_drop"] == ["ALL"] and everything["user"] == "1000:1000"


def test_an_image_target_runs_without_what_no_inference_server_needs_unless_asked() -> None:
    """A user's image keeps what its entrypoint may need (chown, setuid down, a low port), loses raw
    sockets, device nodes, chroot and file capabilities, never gains privileges through a setuid
    binary, and mounts host paths read-only unless a volume says :rw; `hardening: none` is Docker's."""
    hardened = container_config(spec(image="i", volumes=["/models:/models", "/cache:/cache:rw"]), image="i", port=1,
                                labels={}, name="n")
    assert hardened["security_opt"] == ["no-new-privileges"]
    assert {"NET_RAW", "MKNOD", "SYS_CHROOT", "SETFCAP"} <= set(hardened["cap_drop"])
    assert not {"CHOWN", "SETUID", "SETGID", "NET_BIND_SERVICE", "DAC_OVERRIDE"} & set(hardened["cap_drop"])
    assert hardened["volumes"] == ["/models:/models:ro", "/cache:/cache:rw"]
    plain = container_config(spec(image="i", hardening="none"), image="i", port=1, labels={}, name="n")
    assert "cap_drop" not in plain and "security_opt" not in plain
    with pytest.raises(ExperimentInvalid, match="only a docker target takes 'hardening'"):
        experiment_from_dict({"name": "t", "target": {"kind": "builtin", "hardening": "none"},
                              "phases": [{"name": "p", "duration": "1s"}]})


def test_published_port_is_read_from_the_inspect_data() -> None:
    attrs = json.loads('{"NetworkSettings": {"Ports": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49153"}]}}}')
    assert published_port(attrs, 8000) == 49153
    assert published_port(attrs, 9000) is None and published_port({}, 8000) is None


def test_ownership_is_decided_by_both_labels() -> None:
    labels = run_labels("abc", "/runs/one", "target")
    attrs = {"Id": "0123456789abcdef", "Config": {"Labels": labels}}
    assert ownership_problem(attrs, run_dir="/runs/one", run_id="abc") is None
    assert ownership_problem(attrs, run_dir="/runs/one") is None
    assert "not this run's" in str(ownership_problem(attrs, run_dir="/runs/two", run_id="abc"))
    assert f"its {LABEL_RUN_ID} label is 'abc', not 'abd'" in str(ownership_problem(attrs, run_dir="/runs/one",
                                                                                    run_id="abd"))
    assert f"carries no {LABEL_RUN_DIR} label" in str(ownership_problem({"Id": "x", "Config": {"Labels": None}},
                                                                        run_dir="/r"))


def test_one_host_path_mounted_twice_keeps_both_mounts() -> None:
    """Issue 41: the SDK's dict form is keyed by host path, so a read-only and a writable mount of one
    directory collapsed into one (the read-only one silently gone); the list form keeps both."""
    target = spec(image="i", volumes=["/srv/models:/models:ro", "/srv/models:/scratch:rw"])
    config = container_config(target, image="i", port=1, labels={}, name="n")
    assert config["volumes"] == ["/srv/models:/models:ro", "/srv/models:/scratch:rw"]
    # the host-Python stack's own mounts and a volume of one of its host paths: both, each where it was asked
    both = container_config(spec(volumes=["/usr:/host-usr"]), image="i", port=1, labels={}, name="n",
                            mounts={"/usr": {"bind": "/usr", "mode": "ro"}}, hardened_user="1:1")
    assert both["volumes"] == ["/usr:/usr:ro", "/usr:/host-usr:ro"]
    # a volume over a container path the stack mounts already cannot be honoured with it: refused, said where
    with pytest.raises(SetupFailed, match="'/srv:/usr:rw' mounts at /usr, where /usr:/usr:ro is mounted already"):
        container_config(spec(volumes=["/srv:/usr:rw"]), image="i", port=1, labels={}, name="n",
                         mounts={"/usr": {"bind": "/usr", "mode": "ro"}})


def test_two_volumes_at_one_container_path_are_refused_where_written() -> None:
    with pytest.raises(ExperimentInvalid) as caught:
        experiment_from_dict({"name": "t", "phases": [{"name": "p", "duration": "1s"}], "target": {
            "kind": "docker", "image": "i", "volumes": ["/a:/data:ro", "/b:/other", "/c:/data:rw"]}})
    assert "target.volumes[2]" in str(caught.value)
    assert "'/a:/data:ro' (volumes[0]) mounts at that container path already" in str(caught.value)


def test_volumes_and_gpus_parse_as_docker_run_takes_them() -> None:
    assert parse_volume("/a:/b") == ("/a", "/b", "ro") and parse_volume("/a:/b:rw") == ("/a", "/b", "rw")
    for bad in ("a:/b", "/a", "/a:/b:rx", "/a:/b:ro:x", ":/b"):
        with pytest.raises(ValueError):
            parse_volume(bad)
    assert parse_gpus("all") == (-1, ()) and parse_gpus(2) == (2, ()) and parse_gpus("3") == (3, ())
    assert parse_gpus("device=0,GPU-1a") == (0, ("0", "GPU-1a"))
    wrong: tuple[object, ...] = (0, "0", "some", True, "device=")
    for value in wrong:
        with pytest.raises(ValueError):
            parse_gpus(value)


def test_the_image_skeleton_is_small_deterministic_and_merged_usr() -> None:
    data = skeleton_tar()
    assert data == skeleton_tar() and len(data) < 64 * 1024
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["lib"].issym() and members["lib"].linkname == "usr/lib"
    assert members["tmp"].mode == 0o1777 and "etc/passwd" in members


def test_host_mounts_are_read_only_and_not_nested() -> None:
    mounts = host_mounts(("/usr/lib",))
    assert "/usr" in mounts and "/usr/lib" not in mounts  # mounted once, through its parent
    assert all(m["mode"] == "ro" and m["bind"] == path for path, m in mounts.items())


def test_cfs_quota_for_a_share_of_cpus() -> None:
    assert quota_for(0.2, 100_000) == 20_000 and quota_for(2, 50_000) == 100_000
    assert quota_for(0.001, 100_000) == 1000  # the kernel's floor


def test_outstanding_resources_merge_plans_and_close_on_release_or_rollback() -> None:
    def res(action: str, **extra: Any) -> dict[str, Any]:
        return {"type": "resource", "name": "target", "kind": "docker.container", "action": action, **extra}

    planned = [res("plan", undo={"labels": {"a": "b"}}), res("plan", undo={"container_id": "c1"})]
    assert outstanding_resources(planned) == [{"name": "target", "kind": "docker.container",
                                               "undo": {"labels": {"a": "b"}, "container_id": "c1"}}]
    assert outstanding_resources(planned + [res("release")]) == []
    assert outstanding_resources(planned + [res("rollback")]) == []
    assert len(outstanding_resources(planned + [res("error")])) == 1  # a failed removal stays outstanding


def test_docker_faults_need_a_docker_target_at_load_time() -> None:
    from chaos.model.errors import ExperimentInvalid

    with pytest.raises(ExperimentInvalid) as caught:
        experiment_from_dict({"name": "x", "phases": [{"name": "p", "duration": "1s", "faults": [
            {"kind": "docker.pause"}, {"kind": "docker.cpu_limit", "cpus": 0.5, "period": "2s"}]}]})
    messages = [p.message for p in caught.value.problems]
    assert sum("acts on the container of a docker target; this experiment's target is builtin" in m
               for m in messages) == 2
    assert any("the CFS period must lie between 1ms and 1s" in m for m in messages)
