"""The in-process simulation backend: Flower's engine runs the real ClientApp in its own process, no Ray.

The unit tests drive :class:`bridge.runtime.simulation_backend.InProcessBackend` as
Flower's engine does (``build``, then ``process_message`` from worker
threads); the end-to-end test runs the same job through real ``flwr run`` with
each backend and requires identical metrics, with Ray's processes seen only
in the Ray run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import types
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException

from bridge.flower import task_identity
from bridge.runtime import simulation_backend
from bridge.runtime.simulation_backend import RAY_MODULE, InProcessBackend, install, pickup_wait, worker_count
from experiments.cli import main as fedsketch_main
from tests.conftest import ROOT, SESSION_TAG, flower_pids
from tests.listening import ListeningWatch, off_loopback


def _context(node_id: int = 1) -> Context:
    return Context(run_id=1, node_id=node_id, node_config={"partition-id": 0}, state=RecordDict(), run_config={})


def _request(value: int) -> Message:
    with task_identity():
        return Message(RecordDict({"c": ConfigRecord({"x": value})}), dst_node_id=1, message_type="train")


def _echo_app(record_calls: list[int] | None = None, fail_on: int | None = None) -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        x = int(msg.content["c"]["x"])  # type: ignore[arg-type]
        if x == fail_on:
            raise ValueError(f"client asked to fail on {x}")
        msg.content["c"]["x"] = -1  # a ClientApp that changes what it received changes only its copy  # type: ignore[assignment]
        context.state["seen"] = ConfigRecord({"x": x})
        if record_calls is not None:
            record_calls.append(x)
        return Message(RecordDict({"c": ConfigRecord({"y": 2 * x})}), reply_to=msg)

    return app


def test_workers_follow_the_cores_over_each_nodes_cpus_as_rays_pool_does() -> None:
    assert worker_count(1, cores=2) == 2
    assert worker_count(2, cores=2) == 1
    assert worker_count(8, cores=2) == 1
    assert worker_count(4, cores=16) == 4
    cores = len(os.sched_getaffinity(0))

    def made(config: dict[str, Any]) -> tuple[int, int]:
        backend = InProcessBackend({**config, "init_args": {}})
        assert backend.is_worker_idle()  # it never queues: a message goes to a free worker thread
        return backend.num_workers, backend.threads

    # a node's CPUs: one unless given (0 and below one count as one); the workers share the cores' threads
    one = [{"client_resources": {"num_cpus": n}} for n in (1, 0, 0.5)]
    assert [made(c) for c in [{}, {"client_resources": {}}, *one]] == [(worker_count(1), 1)] * 5
    assert made({"client_resources": {"num_cpus": cores}}) == (1, cores)


def test_a_message_before_build_is_refused_by_name() -> None:
    backend = InProcessBackend({"client_resources": {"num_cpus": 1}, "init_args": {}})
    with task_identity(), pytest.raises(ValueError) as refused:
        backend.process_message(_request(1), _context())
    assert str(refused.value) == "InProcessBackend.process_message called before build()"


def test_each_call_runs_with_the_backends_torch_threads_and_build_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker thread's torch threads are set for its calls, whatever the thread had (torch keeps them per thread)."""
    import torch

    cores = len(os.sched_getaffinity(0))
    seen: list[int] = []
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        seen.append(torch.get_num_threads())
        return Message(RecordDict(), reply_to=msg)

    backend = InProcessBackend({"client_resources": {"num_cpus": cores}, "init_args": {}})
    with caplog.at_level(INFO, logger="flwr"):
        backend.build(lambda: app)
    said = "fedsketch: ClientApp calls run in the simulation process, 1 at once, %d torch threads each (no Ray)"
    assert said % cores in caplog.messages

    def worker() -> None:
        for before in (cores + 1, cores + 2):
            torch.set_num_threads(before)
            with task_identity():
                backend.process_message(_request(1), _context())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [cores, cores]


def test_a_message_gets_its_reply_and_the_nodes_context_keeps_what_the_clientapp_stored() -> None:
    backend = InProcessBackend({"client_resources": {"num_cpus": 2}, "init_args": {}})
    backend.build(lambda: _echo_app())
    request, context = _request(21), _context()
    with task_identity():
        reply, updated = backend.process_message(request, context)
    assert int(reply.content["c"]["y"]) == 42  # type: ignore[arg-type]
    assert reply.metadata.reply_to_message_id == request.metadata.message_id
    assert int(updated.state["seen"]["x"]) == 21  # type: ignore[index, arg-type]
    assert int(request.content["c"]["x"]) == 21  # type: ignore[arg-type]  # the sender's message is untouched


def test_a_failing_clientapp_raises_what_flowers_engine_turns_into_an_error_reply() -> None:
    backend = InProcessBackend({"client_resources": {"num_cpus": 2}, "init_args": {}})
    backend.build(lambda: _echo_app(fail_on=3))
    with task_identity(), pytest.raises(ClientAppException, match="client asked to fail on 3"):
        backend.process_message(_request(3), _context())
    with task_identity():
        reply, _ = backend.process_message(_request(4), _context())  # the backend goes on
    assert int(reply.content["c"]["y"]) == 8  # type: ignore[arg-type]


def test_workers_run_messages_side_by_side_from_the_first() -> None:
    """Nothing serializes the calls: two workers' first messages train at once (the ServerApp loaded the data)."""
    order: list[str] = []
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        x = int(msg.content["c"]["x"])  # type: ignore[arg-type]
        order.append(f"start {x}")
        time.sleep(0.2)
        order.append(f"end {x}")
        return Message(RecordDict(), reply_to=msg)

    backend = InProcessBackend({"client_resources": {"num_cpus": 1}, "init_args": {}})
    backend.build(lambda: app)
    with task_identity():
        requests = [_request(i) for i in range(2)]

    def call(msg: Message) -> None:
        with task_identity():
            backend.process_message(msg, _context())

    threads = [threading.Thread(target=call, args=(m,)) for m in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(order[:2]) == ["start 0", "start 1"], order


PROBE = (
    "import sys, {module}; r = sys.modules.get({ray!r}); v = sys.modules.get({vce!r}); "
    "print(r.RayBackend.__name__ if r else None, v.add_messages_to_queue.__module__ if v else None)"
)


@pytest.mark.slow  # a fresh Python importing Flower and torch per case
@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("clients.client_app", ["None", "None"]),
        ("clients.inprocess_app", ["InProcessBackend", "bridge.runtime.simulation_backend"]),
    ],
)
def test_only_the_inprocess_app_installs_the_backend_on_import(module: str, expected: list[str]) -> None:
    """Importing the ClientApp (Ray, deployment, ``flwr run .``) patches nothing; the in-process app, the one
    switch, answers Flower's backend import and replaces its pick-up loop. In a fresh interpreter each."""
    code = PROBE.format(module=module, ray=RAY_MODULE, vce="flwr.server.superlink.fleet.vce.vce_api")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == expected


def test_install_answers_flowers_import(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.server.superlink.fleet.vce import vce_api

    monkeypatch.setattr(vce_api, "add_messages_to_queue", vce_api.add_messages_to_queue)  # install() replaces it
    monkeypatch.delitem(sys.modules, RAY_MODULE, raising=False)
    install()
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend  # what Flower's start_vce imports

    assert RayBackend is InProcessBackend
    assert "ray" not in sys.modules or isinstance(sys.modules[RAY_MODULE], types.ModuleType)


def test_start_vce_still_builds_its_backend_from_the_module_install_replaces() -> None:
    """Flower's engine (1.41, 1.42) imports ``RayBackend`` from ``RAY_MODULE`` when it builds the backend; if a new
    Flower moves that, this fails rather than the in-process backend silently falling back to Ray."""
    import inspect

    from flwr.server.superlink.fleet.vce import vce_api

    source = inspect.getsource(vce_api.start_vce)
    assert "from .backend.raybackend import RayBackend" in source
    assert f"{vce_api.__name__.rsplit('.', 1)[0]}.backend.raybackend" == RAY_MODULE
    # and the ClientApp is loaded (so install() has run) before the backend is built
    assert source.index("client_app = app_fn()") < source.index("run_api(")


class _HeldMessages:
    """The one link-state call the pick-up loop makes: undelivered messages for a node, at most ``limit``."""

    def __init__(self) -> None:
        self.waiting: dict[int, list[str]] = {}
        self.lock = threading.Lock()
        self.limits: set[int | None] = set()

    def get_message_ins(self, node_id: int, limit: int | None) -> list[str]:
        with self.lock:
            self.limits.add(limit)
            held = self.waiting.get(node_id, [])
            taken, self.waiting[node_id] = held[:limit], held[limit:]
            return taken


def test_the_pick_up_loop_takes_a_message_within_its_short_wait_and_stops_when_asked() -> None:
    from queue import Queue

    state, queue, stop = _HeldMessages(), Queue(), threading.Event()  # type: ignore[var-annotated]
    loop = threading.Thread(target=simulation_backend.add_messages_to_queue, args=(state, queue, {1: 0, 2: 1}, stop))
    loop.start()
    try:
        time.sleep(0.05)  # the loop is between looks
        latencies = []
        for node in (1, 2, 1, 2, 1):
            with state.lock:
                state.waiting[node] = [f"m{node}", f"n{node}"]
            put = time.perf_counter()
            assert queue.get(timeout=2) == f"m{node}"
            latencies.append(time.perf_counter() - put)
            assert queue.get(timeout=2) == f"n{node}"  # one a look, as Flower's loop takes them
    finally:
        stop.set()
        loop.join(timeout=2)
    assert not loop.is_alive() and state.limits == {1}  # one message a node each look, as Flower's loop asks
    assert pickup_wait(0) == pickup_wait(1) == 0.005 and pickup_wait(2) == 0.01 and pickup_wait(100) == 0.1
    # Flower's own loop waits 0.1 s between looks (0.05 s on average); two nodes wait 0.01 s
    assert sorted(latencies)[2] < 0.03, latencies


def test_install_puts_the_short_wait_loop_where_flowers_engine_looks_it_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import inspect

    from flwr.server.superlink.fleet.vce import vce_api

    flowers = vce_api.add_messages_to_queue
    monkeypatch.setattr(vce_api, "add_messages_to_queue", flowers)  # restored after the test
    monkeypatch.delitem(sys.modules, RAY_MODULE, raising=False)
    assert flowers is not simulation_backend.add_messages_to_queue
    assert list(inspect.signature(flowers).parameters) == simulation_backend.PICKUP_PARAMETERS
    assert "f_stop.wait(0.1)" in inspect.getsource(flowers)  # the wait this replaces
    install()
    assert vce_api.add_messages_to_queue is simulation_backend.add_messages_to_queue
    assert simulation_backend.pick_up_sooner(vce_api)  # in place already
    monkeypatch.setattr(vce_api, "add_messages_to_queue", flowers)
    assert simulation_backend.pick_up_sooner(vce_api)
    assert vce_api.add_messages_to_queue is simulation_backend.add_messages_to_queue
    # run_api starts its extractor thread from the module's name, after the ClientApp is loaded
    assert "target=add_messages_to_queue" in inspect.getsource(vce_api.run_api)

    def other_loop(state: object, queue: object) -> None: ...

    monkeypatch.setattr(vce_api, "add_messages_to_queue", other_loop)
    with caplog.at_level(WARNING, logger="flwr"):
        assert not simulation_backend.pick_up_sooner(vce_api)  # a changed engine keeps its own loop
        assert not simulation_backend.pick_up_sooner(types.ModuleType("engine"))  # or one without a loop
    assert vce_api.add_messages_to_queue is other_loop
    changed = "fedsketch: Flower's simulation engine changed; its message pick-up keeps its own 0.1 s wait"
    assert caplog.messages == [changed, changed]


def test_install_swaps_the_class_of_rays_module_when_imported_and_else_stands_in_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flwr.server.superlink.fleet.vce import vce_api

    monkeypatch.setattr(vce_api, "add_messages_to_queue", vce_api.add_messages_to_queue)  # install() replaces it
    rays = types.ModuleType(RAY_MODULE)
    monkeypatch.setitem(sys.modules, RAY_MODULE, rays)
    install()
    assert sys.modules[RAY_MODULE] is rays and rays.RayBackend is InProcessBackend  # type: ignore[attr-defined]
    del sys.modules[RAY_MODULE]
    install()
    stand_in = sys.modules[RAY_MODULE]
    assert stand_in is not rays and stand_in.RayBackend is InProcessBackend  # type: ignore[attr-defined]
    assert stand_in.__doc__ == (
        "fedsketch's in-process backend in place of Ray's (see bridge/runtime/simulation_backend.py)"
    )


TINY = [
    "num-clients=20",
    "clients-per-round=10",
    "num-rounds=3",
    "eval-every=1",
    "sketch-rows=3",
    "sketch-cols=5000",
    "k=2000",
    "lr=0.5",
    'lr-schedule="constant"',
]
RAY_NAMES = ("raylet", "gcs_server", "ray::")


def _run_watching_processes(args: list[str]) -> tuple[int, set[str]]:
    """``fedsketch`` with ``args``, and the names of this session's Flower/Ray processes seen meanwhile."""
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid in flower_pids():
                try:
                    seen.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        code = fedsketch_main(args)
    finally:
        done.set()
        watcher.join()
    return code, seen


RUNS = {"inprocess": ("inprocess", "process"), "ray": ("ray", "process"), "superlink": ("inprocess", "superlink")}
"""Backend and runtime of each run the next test compares."""
FLOWER_PROGRAM = {"process": "experiments.flower.one_process", "superlink": "flwr-simulation"}
"""The process each runtime runs the ServerApp in."""


@pytest.mark.slow
def test_both_backends_and_both_runtimes_give_the_same_run_and_only_ray_starts_ray(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    rows = {}
    for name, (backend, runtime) in RUNS.items():
        args = ["run", "--out", str(tmp_path / name), "--strategies", "fetchsgd", "--no-plot"]
        args += ["--backend", backend, "--runtime", runtime]
        for pair in [*TINY, "experiment=tiny"]:
            args += ["--set", pair]
        with ListeningWatch((SESSION_TAG, os.environ[SESSION_TAG])) as ports:
            code, seen = _run_watching_processes(args)
        assert code == 0
        # Ray's GCS server, raylet and workers listen (the watch does see them), on loopback only; so does a SuperLink
        assert bool(ports.sockets) == (backend == "ray" or runtime == "superlink"), (name, ports.sockets)
        print(f"{name}: listening: {sorted(f'{ip}:{port} ({who})' for (ip, port), who in ports.sockets.items())}")
        assert not off_loopback(ports.sockets), f"{name}: listening beyond loopback: {off_loopback(ports.sockets)}"
        assert any(FLOWER_PROGRAM[runtime] in cmd for cmd in seen), seen  # the watcher does see Flower's processes
        assert any("flower-superlink" in cmd for cmd in seen) == (runtime == "superlink"), sorted(seen)
        started_ray = any(name in cmd for cmd in seen for name in RAY_NAMES)
        assert started_ray == (backend == "ray"), (backend, sorted(seen))
        folder = tmp_path / name / "tiny" / "fetchsgd"
        log = (folder / "flower.log").read_text(encoding="utf-8", errors="replace")
        assert ("ClientApp calls run in the simulation process" in log) == (backend == "inprocess")
        rows[name] = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    timing = {"wall_s", "unix_time"}
    strip = {name: [{k: v for k, v in r.items() if k not in timing} for r in rows[name]] for name in RUNS}
    assert [r["round"] for r in strip["inprocess"]] == [1, 2, 3]
    assert strip["inprocess"] == strip["ray"] == strip["superlink"]  # accuracy, losses, every byte and count
    assert strip["inprocess"][-1]["clients"] == 10 and strip["inprocess"][-1]["client_errors"] == 0


def test_cohorts_on_two_threads_at_once_equal_the_same_cohorts_one_after_another() -> None:
    """Each thread trains on its own scratch model (fedsketch/client/cohort.py): no thread overwrites another's weights."""
    import numpy as np
    import torch

    from fedsketch.client.cohort import ClientOutcome, run_cohort
    from fedsketch.config import RunConfig
    from fedsketch.data.run import load_data
    from fedsketch.methods import ClientJob
    from fedsketch.model.flat import get_flat
    from fedsketch.task import make_model

    cfg = RunConfig.from_mapping(
        {
            "num-clients": 12,
            "model-hidden": 256,
            "k": 40,
            "sketch-rows": 3,
            "sketch-cols": 400,
            "local-steps": 20,
            "client-update": "delta",
        }
    )
    d = get_flat(make_model(cfg, load_data(cfg))).numel()
    weights = [np.random.default_rng(s).normal(0, 0.05, d).astype(np.float32) for s in (1, 2)]
    jobs = [[ClientJob(cid, 2, {"sketch-seed": 0, "sketch-rows": 3, "sketch-cols": 400}) for cid in range(6)]] * 2
    alone: dict[int, list[ClientOutcome]] = {}
    together: dict[int, list[ClientOutcome]] = {}

    def one(i: int, out: dict[int, list[ClientOutcome]]) -> None:
        torch.set_num_threads(1)  # as each worker thread of the in-process backend does on this machine
        out[i] = run_cohort(cfg, weights[i], jobs[i])

    for i in (0, 1):  # one after another, each on a thread of its own
        t = threading.Thread(target=one, args=(i, alone))
        t.start()
        t.join()
    threads = [threading.Thread(target=one, args=(i, together)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 1):
        assert [o.error for o in together[i]] == [None] * 6
        for x, y in zip(alone[i], together[i], strict=True):
            assert x.payload is not None and y.payload is not None
            np.testing.assert_array_equal(x.payload["table"], y.payload["table"])


def test_an_unknown_backend_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert fedsketch_main(["run", "--backend", "threads", "--set", "num-rounds=1"]) != 0
    assert "backend must be one of inprocess, ray; got 'threads'" in capsys.readouterr().err
