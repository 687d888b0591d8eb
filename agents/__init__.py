"""Role cards, settings, teams, presets and model resolution."""
