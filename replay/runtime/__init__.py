"""What a server imports to serve an artifact: the typed manifest, guards, fills and the router.

The bottom floor of `replay`: it imports nothing of the export job. `replay.runtime.pt2` reads a
``.pt2`` archive as data, `replay.runtime.ort` serves an ONNX set with onnxruntime.
"""
