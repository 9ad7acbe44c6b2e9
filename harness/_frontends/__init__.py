"""The ways in: the pytest plugin, the command line, the gate, spawned and distributed ranks, the
selfcheck."""
