"""Run by the `sky` CLI's own Python (.tools/sky-cli), not by pytest: start a local SkyPilot API server
for tests/house/test_sky_cli.py under the test's HOME and port, and seed what SkyPilot would otherwise ask
the clouds for, offline:

- the enabled-clouds cache (RunPod by default; `--cloud` names others the shipped catalog snapshot
  covers), as launcher/catalog does for `launch plan`. It is seeded after the server's on-boot
  `sky check` has finished: that check finds no credentials here and empties the cache.
- a network volume record for each `--volume NAME:REGION:ZONE` (what `launch up` creates with
  `sky volumes apply`), since `sky launch` of a task that mounts one looks it up first.

Usage: python sky_cli_server.py [--cloud RunPod ...] [--volume NAME:REGION:ZONE ...]
       (HOME and SKYPILOT_API_SERVER_LOCAL_PORT set: the test's own; `sky api stop` there ends it)
"""

import argparse
import logging
import os

ap = argparse.ArgumentParser()
ap.add_argument("--cloud", action="append", default=[], help="a cloud to mark enabled (default RunPod)")
ap.add_argument("--volume", action="append", default=[], metavar="NAME:REGION:ZONE")
args = ap.parse_args()
assert os.environ.get("SKYPILOT_API_SERVER_LOCAL_PORT"), "a private port: never the user's server"

import sky  # noqa: E402
from sky import check, global_user_state, models, skypilot_config  # noqa: E402
from sky.clouds import cloud as sky_cloud  # noqa: E402
from sky.server import constants as server_constants  # noqa: E402
from sky.utils import status_lib  # noqa: E402

logging.getLogger("sky").setLevel(logging.ERROR)
sky.api_start()
try:
    sky.get(server_constants.ON_BOOT_CHECK_REQUEST_ID)
except Exception:  # noqa: BLE001  (no credentials: the check's outcome is what is replaced below)
    pass
ws = skypilot_config.get_active_workspace()
global_user_state.set_allowed_clouds(check._get_workspace_allowed_clouds(ws), ws)
global_user_state.set_enabled_clouds(args.cloud or ["RunPod"], sky_cloud.CloudCapability.COMPUTE, ws)
for spec in args.volume:
    name, region, zone = spec.split(":")
    config = models.VolumeConfig(name=name, type="runpod-network-volume", cloud="RunPod", region=region,
                                 zone=zone, name_on_cloud=name, size="420")
    global_user_state.add_volume(name, config, status_lib.VolumeStatus.READY)
print("seeded", global_user_state.get_cached_enabled_clouds(sky_cloud.CloudCapability.COMPUTE, ws))
