"""Running the ClientApp where Flower's defaults cost too much, each behind one explicit switch.

- :mod:`clients.runtime.inprocess_app`: the ClientApp with Flower's simulation engine set to run it in the
  simulation process (:mod:`clients.runtime.simulation_backend`); ``fedsketch run --backend inprocess`` (the
  default) names this module as the run's ClientApp, nothing else installs it.
- :mod:`clients.runtime.launcher`: a device's launcher, ``python -m clients.runtime.launcher``
  (:mod:`clients.runtime.launcher_options`), which imports once and forks a child per round
  (:mod:`clients.runtime.forked`), keeps its SuperNode joined (:mod:`clients.runtime.supernode_child`,
  :mod:`clients.runtime.joining`, :mod:`clients.runtime.link_probe`); its SuperNode's shorter waits
  (:mod:`clients.runtime.supernode_waits`, :mod:`clients.runtime.object_pulls`) unless ``--supernode-waits flower``.
- :mod:`clients.runtime.object_pulls`: also the deployed ServerApp's shorter retries for a reply's parts, unless
  ``object-retry-s = 0`` (:func:`strategies.server_app.retry_objects_sooner`).
"""
