"""A run's results: the finishing step, its files, baselines, ranks merged, CUDA snapshots."""
