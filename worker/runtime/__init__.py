"""The runtime: the engine that drives one run, the runner that claims runs, leases, presence, live text."""
