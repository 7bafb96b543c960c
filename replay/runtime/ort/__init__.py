"""An ONNX set served by onnxruntime: its manifest, its shared weights file and the runner."""
