"""experiments/notebooks/own_model.ipynb, executed cell by cell on a real IPython kernel (nbclient), so it cannot rot:
it prints the plan, runs its own model and data through Flower, and draws accuracy against total bytes inline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "experiments" / "notebooks" / "own_model.ipynb"
pytestmark = pytest.mark.slow


def _text(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def test_the_notebook_prints_the_plan_runs_and_plots(tmp_path: Path, no_leftover_processes: None) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")  # kept without outputs
    kernel = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))  # sockets: no TCP port
    client = NotebookClient(nb, km=kernel, timeout=240, resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors

    plan = _text(code[1])
    assert "Plan of default: 2 run(s)" in plan
    assert "fetchsgd seed 0" in plan and "fedavg seed 0" in plan and "cols/k" in plan

    runs = _text(code[2])
    folders = {s: tmp_path / "runs-notebook" / "default" / s for s in ("fetchsgd", "fedavg")}
    for strategy, folder in folders.items():
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rows] == [2, 4, 6, 8]
        last = rows[-1]
        total = last["cum_upload_bytes"] + last["cum_download_bytes"]
        assert f"{strategy:>8}: accuracy {last['test_accuracy']:.3f} after 8 rounds, {total:,} bytes moved" in runs

    (figure,) = [o for o in code[3].outputs if o.output_type == "display_data"]
    assert "image/png" in figure.data and len(figure.data["image/png"]) > 10_000  # a drawn figure, inline
