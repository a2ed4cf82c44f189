"""What runs: the worker's protocol loop, local mode and the embedded Redis server."""
