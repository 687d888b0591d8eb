"""ZeroMQ wire protocol, control channel and monitor stream (imports nothing of legion)."""
