"""Training draft models: data, cached teacher distributions, losses, trainer, AdaSPEC pipeline."""
