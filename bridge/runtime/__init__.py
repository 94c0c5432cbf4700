"""Running the ClientApp where Flower's defaults cost too much, each behind one explicit switch.

- :mod:`clients.inprocess_app`: the ClientApp with Flower's simulation engine set to run it in the
  simulation process (:mod:`bridge.runtime.simulation_backend`); ``fedsketch run --backend inprocess`` (the
  default) names this module as the run's ClientApp, nothing else installs it.
- :mod:`bridge.runtime.launcher`: a device's launcher, ``python -m bridge.runtime.launcher``
  (:mod:`bridge.runtime.launcher_options`), which imports once and forks a child per round
  (:mod:`bridge.runtime.forked`), keeps its SuperNode joined (:mod:`bridge.runtime.supernode_child`,
  :mod:`bridge.runtime.joining`, :mod:`bridge.runtime.link_probe`); its SuperNode's shorter waits
  (:mod:`bridge.runtime.supernode_waits`, :mod:`bridge.runtime.object_pulls`) unless ``--supernode-waits flower``.
- :mod:`bridge.runtime.object_pulls`: also the deployed ServerApp's shorter retries for a reply's parts, unless
  ``object-retry-s = 0`` (:func:`strategies.server_app.retry_objects_sooner`).
"""
