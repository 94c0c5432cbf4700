"""The ClientApp, run in Flower's simulation process instead of Ray actors.

``fedsketch run`` with ``--backend inprocess`` (the default) stages the app with this module as its
ClientApp component (:mod:`experiments.flower.one_process`, or staged by :func:`experiments.flower.app_files.stage_app`). Flower's simulation engine
imports the ClientApp before it builds its backend; importing this module makes it build
:class:`bridge.runtime.simulation_backend.InProcessBackend` (:func:`~bridge.runtime.simulation_backend.install`).
The app itself is :data:`clients.client_app.app`, unchanged.
"""

from __future__ import annotations

from bridge.runtime import simulation_backend
from clients.client_app import app

simulation_backend.install()

__all__ = ["app"]
