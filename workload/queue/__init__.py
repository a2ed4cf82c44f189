"""The Redis work queue (leases, tokens, dead letters) and the plan on the share that rebuilds it."""
