"""The ONNX target: programs converted to ONNX, checked with onnxruntime, guarded and routed.

A room of its own because ONNX is a second target with its own files, its own runtime and its
own ways to be wrong (a conversion that does not mean what the torch program means), while it
keeps replay's contract: every file is checked on the same coverage rows as its torch program
(`replay.onnx.parity`), the files of one export share one weights file
(`replay.runtime.ort.weights`), a manifest beside them says what each file serves
(`replay.runtime.ort.manifest`: the ``.pt2`` artifact's typed manifest, with the files' fields
added; built by `replay.onnx.entries`), and ``replay.load`` of what ``onnx=PATH`` wrote returns an
onnxruntime runner routed by the rule
of the ``.pt2`` runner (`replay.runtime.ort.runner`, `replay.runtime.guards.route`). Conversion:
`replay.onnx.convert`.
"""
