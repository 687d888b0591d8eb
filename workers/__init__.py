"""Worker processes, the session engine, model providers, tools and transcripts."""
