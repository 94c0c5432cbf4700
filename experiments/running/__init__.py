"""Running experiments: the runner, sweeps, checks before a run, forecasts, the command's plan, progress, stopping."""
