"""SkyPilot backend: on-demand profiles run as a cluster, spot profiles as a managed job.

Everything goes through SkyPilot's Python SDK. `backend` is the backend itself (`SkyPilotBackend`:
launch, logs, status, down, fetch), `run_state` what state a run is in (SkyPilot's queues merged with
its status.json), `task` the task SkyPilot parses from the rendered `sky/<profile>.yaml` and the
cluster name a run gets;
`sdk` the SDK's import and its errors as one line, `control` what bills (the local API server, the
jobs controller, waits), `files` how a run's files are reached (SSH into a cluster, S3 on a RunPod
volume), `price` the live $/hour, `runpod_volumes` where a network volume is made, `runpod_pods`
RunPod's word on a managed job's pod (EXITED).

The CLI, `launch volumes`, `launch up`'s price and tests import the names below from this package;
other groups may also import `control` and `sdk` (launcher/__init__.py FACES).
"""

from __future__ import annotations

from .backend import SkyPilotBackend
from .run_state import merge_status
from .task import build_task, cluster_name
from .price import hourly_price
from .sdk import check_credentials_here, credentials_message, map_sky_error, record_field, sdk

# The backend's public face (the CLI, `launch volumes`, `launch plan` and tests import these from here).
__all__ = ["SkyPilotBackend", "build_task", "check_credentials_here", "cluster_name", "credentials_message",
           "hourly_price", "map_sky_error", "merge_status", "record_field", "sdk"]
