"""legion: runs trees of LLM agent sessions as an OTP-style supervision tree of OS processes."""

__version__ = "0.1.0"
