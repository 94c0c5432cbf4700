"""Flower's legacy API, for secure aggregation only: SecAgg+ in Flower 1.42 is on the legacy side.

``flwr.server.workflow.SecAggPlusWorkflow`` drives a legacy ``flwr.server.strategy.Strategy`` through a
``LegacyContext`` and ``FitIns``/``FitRes``; ``flwr.client.mod.secaggplus_mod`` calls the app back in the
legacy ``FitRes`` layout (``strategies/secure.py``, ``clients/secure.py``). Every legacy name either side
uses is taken here (tested on :data:`bridge.flower.TESTED`). Importing this module imports Flower's legacy
server and client packages: the two secure modules import it when a secure round or message comes.
"""

from __future__ import annotations

from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, FitIns, FitRes, Parameters, Scalar, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey

__all__ = [
    "MAIN_CONFIGS_RECORD",
    "MAIN_PARAMS_RECORD",
    "RECORD_KEY_CONFIGS",
    "ClientAppCallable",
    "ClientManager",
    "ClientProxy",
    "Code",
    "FitIns",
    "FitRes",
    "GridClientProxy",
    "LegacyContext",
    "LegacyStrategy",
    "Parameters",
    "Scalar",
    "SecAggPlusWorkflow",
    "Status",
    "WorkflowKey",
    "compat",
    "ndarrays_to_parameters",
    "parameters_to_ndarrays",
    "secaggplus_mod",
]
