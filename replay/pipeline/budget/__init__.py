"""A group's export bounded in time: torch.export in a child process, static fallback."""
