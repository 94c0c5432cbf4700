"""Flower ClientApps: unpack records, call fedsketch, pack records."""

SIM_BACKEND_ENV = "FEDSKETCH_SIM_BACKEND"
"""The environment variable the launcher sets for a simulation, ``inprocess`` or ``ray``, and
:mod:`clients.simulation_backend` reads (here, so that the launcher need not import Flower to name it)."""
