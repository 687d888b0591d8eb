"""Shared pytest configuration: every test has a timeout (pyproject `timeout`)."""
