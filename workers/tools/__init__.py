"""legion.workers.tools."""
