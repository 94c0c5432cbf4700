"""The project's own studies of where sketching pays: the regime and participation maps of docs/regime.md,
drawn from runs of the experiment files in ``experiments/configs/``. Not shipped: run from the repository."""
