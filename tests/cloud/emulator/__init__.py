"""An emulated RunPod cloud for the tests: a fake RunPod API (runpod_api.py) answering the real SDK's
wire formats, and pods that are Linux network namespaces (pods.py)."""
