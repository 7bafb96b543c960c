"""Coverage: every program checked against recorded signatures, probes, payloads; drift."""
