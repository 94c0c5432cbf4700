"""Models (``models``), a model's parameters as one flat vector (``flat``), and a run's data, model and
local training built from its config (``task``)."""
