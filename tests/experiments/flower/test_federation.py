"""The federation a run simulates (experiments/flower/federation.py): its nodes' CPUs and GPU share, its
backend and runtime, and the devices its workers can see."""

from __future__ import annotations

import os

import pytest

from bridge import flower
from experiments.flower.federation import (
    Federation,
    check_device,
    cpus_per_node,
    default_backend,
    gpus_per_node,
    on_public_flower,
)
from experiments.flower.superlink_run import connection_toml


def test_simulated_nodes_share_the_visible_gpus() -> None:
    """Ray hides GPUs from workers that ask for none: on a GPU machine the nodes must ask for a share."""
    assert gpus_per_node(4, None, visible_gpus=0) == 0.0
    assert gpus_per_node(4, None, visible_gpus=1) == 0.25
    assert gpus_per_node(2, None, visible_gpus=8) == 1.0
    assert gpus_per_node(4, 0.5, visible_gpus=1) == 0.5
    assert "num-gpus = 0.25" in connection_toml(Federation(num_supernodes=4, gpus_per_client=0.25), "127.0.0.1:1")
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        gpus_per_node(2, 0.5, visible_gpus=0)
    with pytest.raises(ValueError, match="must be >= 0"):
        gpus_per_node(2, -1.0, visible_gpus=1)


def test_simulated_nodes_split_the_cores_so_each_has_one_worker_and_none_idles() -> None:
    """Flower starts a ClientApp worker per ``num-cpus`` the machine holds, whatever the number of nodes."""
    assert cpus_per_node(1, cores=2) == 2  # one worker, not one busy and one idle
    assert cpus_per_node(2, cores=2) == 1
    assert cpus_per_node(4, cores=2) == 1  # more nodes than cores: one CPU each, nodes wait for a worker
    assert cpus_per_node(4, cores=16) == 4
    assert "num-cpus = 2" in connection_toml(Federation(num_supernodes=1, cpus_per_client=2), "127.0.0.1:1")


def test_ray_is_the_default_only_where_a_ray_cluster_is_named() -> None:
    assert default_backend({}) == "inprocess"
    assert default_backend({"RAY_ADDRESS": "10.0.0.1:6379"}) == "ray"


def test_the_ray_backend_gives_each_worker_its_gpu_as_cuda_0() -> None:
    ray = Federation(num_supernodes=2, gpus_per_client=0.5, backend="ray")
    check_device("cuda", ray)
    check_device("cuda:0", ray)
    with pytest.raises(ValueError, match=r"'cuda:1' but under the Ray backend .* CUDA_VISIBLE_DEVICES"):
        check_device("cuda:1", ray)
    with pytest.raises(ValueError, match=r"no GPU share \(--gpus-per-node 0\)"):
        check_device("cuda", Federation(backend="ray"))
    check_device("cuda:1", Federation(gpus_per_client=0.5))  # in-process: the process sees what the command sees


def test_a_federation_refuses_an_unknown_backend_or_runtime_by_name() -> None:
    assert Federation() == Federation(2, 1, 0.0, "inprocess", "process")
    with pytest.raises(ValueError, match=r"^backend must be one of inprocess, ray; got 'threads'$"):
        Federation(backend="threads")
    with pytest.raises(ValueError, match=r"^runtime must be one of process, superlink; got 'flwr'$"):
        Federation(runtime="flwr")


def test_on_flowers_public_api_only_a_federation_runs_through_a_superlink_on_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fed = Federation(num_supernodes=3, cpus_per_client=2, gpus_per_client=0.5)
    monkeypatch.setenv(flower.SWITCH, "0")
    assert on_public_flower(fed) == (fed if flower.internals() else Federation(3, 2, 0.5, "ray", "superlink"))
    monkeypatch.setenv(flower.SWITCH, "1")
    assert on_public_flower(fed) == Federation(3, 2, 0.5, "ray", "superlink")


def test_without_a_count_the_cores_are_those_this_process_may_run_on() -> None:
    assert cpus_per_node(1) == len(os.sched_getaffinity(0))


def test_a_device_that_is_not_cuda_is_never_refused() -> None:
    for fed in (Federation(backend="ray"), Federation(backend="ray", gpus_per_client=0.5), Federation()):
        check_device("cpu", fed)
        check_device("auto", fed)


def test_a_share_of_none_is_always_allowed_and_shares_are_whole_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpus_per_node(2, 0.0, visible_gpus=0) == 0.0 and gpus_per_node(2, 0.0, visible_gpus=1) == 0.0
    assert cpus_per_node(2, cores=3) == 1 and isinstance(cpus_per_node(2, cores=3), int)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert default_backend() == "ray"
    monkeypatch.delenv("RAY_ADDRESS")
    assert default_backend() == "inprocess"


def test_a_device_the_ray_workers_cannot_see_is_refused_saying_what_to_do() -> None:
    with pytest.raises(ValueError) as none:
        check_device("cuda", Federation(backend="ray"))
    assert str(none.value) == (
        "setting 'device' is 'cuda' but the Ray backend's workers get no GPU share (--gpus-per-node 0), and Ray "
        "hides every GPU from them; give them a share or use device = 'auto'"
    )
    with pytest.raises(ValueError) as other:
        check_device("cuda:1", Federation(backend="ray", gpus_per_client=0.5))
    assert str(other.value) == (
        "setting 'device' is 'cuda:1' but under the Ray backend each ClientApp worker sees only the GPU Ray placed "
        "it on, as cuda:0; choose the GPUs with CUDA_VISIBLE_DEVICES on the command and set device = 'cuda'"
    )
