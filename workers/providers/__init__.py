"""legion.workers.providers."""
