"""A researcher's own code, kept outside fedsketch: a model builder and a data loader (docs/data.md)."""
