"""Writing the artifact: the manifest's entries built from an export's groups, and the archive."""
