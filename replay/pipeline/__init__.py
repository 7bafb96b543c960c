"""The export job: one chain of strategies per group, from plain torch.export to regimes."""
