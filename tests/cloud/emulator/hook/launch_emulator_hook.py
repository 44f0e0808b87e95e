"""Points the two SkyPilot 0.14.1 internals that cannot be configured at the emulated RunPod API.

Loaded by the harness only: on the client and its local API server through `sitecustomize.py` on
PYTHONPATH, on pods through a `.pth` file in the baked `~/skypilot-runtime`. No SkyPilot file is
changed; nothing of this is in `launcher/` or `payload/`. Re-check both names at every SkyPilot upgrade
(tests/cloud/test_harness.py asserts that they still exist):

- `sky.adaptors.runpod._REST_BASE` (sky/adaptors/runpod.py:17): the network-volumes REST API is
  hard-coded to https://rest.runpod.io/v1.
- `sky.backends.backend_utils._TEST_IP_LIST` (sky/backends/backend_utils.py:137): the jobs controller
  loops on `check_network_connection()` (sky/jobs/controller.py:1081), which HEADs public DNS
  resolvers. Pods have no route out, so it is pointed at the emulated API, which answers HEAD.

The API's address comes from LAUNCH_EMULATOR_API, else /etc/launch-emulator-api (written into each
pod's root). RUNPOD_API_BASE_URL (read by runpod/api/graphql.py at import) is set from it too, so
processes SkyPilot starts over ssh on a pod (skylet, the jobs controller) reach the same API.
"""

import importlib.abc
import importlib.util
import os
import sys


def _api() -> str:
    url = os.environ.get("LAUNCH_EMULATOR_API", "")
    if not url:
        try:
            with open("/etc/launch-emulator-api") as f:
                url = f.read().strip()
        except OSError:
            return ""
    return url.rstrip("/")


_API = _api()


class _Redirect(importlib.abc.MetaPathFinder):
    patches = {
        "sky.adaptors.runpod": {"_REST_BASE": _API + "/v1"},
        "sky.backends.backend_utils": {"_TEST_IP_LIST": [_API]},
    }

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module, _run=run, _values=self.patches[name]):
            _run(module)
            for key, value in _values.items():
                if not hasattr(module, key):
                    raise ImportError(f"emulated RunPod: {name}.{key} is gone; update the hook for this SkyPilot")
                setattr(module, key, value)

        spec.loader.exec_module = exec_module
        return spec


if _API and not any(type(f).__name__ == "_Redirect" for f in sys.meta_path):
    os.environ.setdefault("RUNPOD_API_BASE_URL", _API)
    sys.meta_path.insert(0, _Redirect())
