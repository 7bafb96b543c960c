"""A group's export bounded in time: torch.export stopped at a deadline, static fallback."""
