"""The emulated RunPod as one process: its API (runpod_api.FakeRunPod) and its pods (pods.Pods).

Started by the harness (tests/cloud/harness.py) as
    ip netns exec CLOUD_NS unshare --mount --propagation private python -m tests.cloud.emulator.serve ...
so that the bridge, the addresses and every mount it makes live only in namespaces of its own: the
host's network and mount tables never change. It loop-mounts the baked image read-only and a fresh
scratch disk for the pods' container disks, brings up the bridge at SUBNET.1, serves the API there,
serves the volumes' S3 API at SUBNET.1:443 (runpod_s3.py), writes READY_FILE (the API's URL), and on SIGTERM stops every pod and exits; its mounts go with it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.cloud.emulator.pods import Pods, sh
from tests.cloud.emulator.runpod_api import FakeRunPod
from tests.cloud.emulator.runpod_s3 import VolumeS3

BRIDGE = "cloudbr0"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--image", type=Path, required=True)
    ap.add_argument("--subnet", default="10.213.0")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--py310", type=Path, required=True)
    ap.add_argument("--catalog", type=Path, required=True)
    ap.add_argument("--hide", action="append", default=[])
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--s3-tls", type=Path, help="dir with s3.pem and s3.key: serve the volumes' S3 API on :443")
    ap.add_argument("--s3-access-key", default="")
    a = ap.parse_args()

    state = a.state
    (state / "logs").mkdir(parents=True, exist_ok=True)
    image_mnt, disks = state / "image", state / "disks"
    image_mnt.mkdir(exist_ok=True)
    disks.mkdir(exist_ok=True)
    sh("mount", "-o", "loop,ro", str(a.image), str(image_mnt))
    scratch = state / "disks.ext4"
    sh("truncate", "-s", "30G", str(scratch))
    sh("mkfs.ext4", "-q", "-F", str(scratch))
    sh("mount", "-o", "loop", str(scratch), str(disks))
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{a.subnet}.1/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")

    url = f"http://{a.subnet}.1:{a.port}"
    pods = Pods(prefix=a.prefix, subnet=a.subnet, bridge=BRIDGE, layer=image_mnt / "image", disks=disks,
                py310=a.py310, api_url=url, logs=state / "logs", hide=a.hide)
    api = FakeRunPod(pods, state / "api", bind=f"{a.subnet}.1", port=a.port,
                     catalog_csv=a.catalog / "runpod" / "vms.csv", api_key=a.api_key)
    api.start()
    s3 = None
    if a.s3_tls:  # RunPod's S3-compatible API over the same volumes (https://s3api-<dc>.runpod.io)
        s3 = VolumeS3(api.volume_dir, a.s3_access_key, api._log)  # one api.log
        s3.start(f"{a.subnet}.1", 443, a.s3_tls / "s3.pem", a.s3_tls / "s3.key")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    (state / "ready").write_text(api.url)
    print(f"emulated RunPod at {api.url}", flush=True)
    done.wait()
    try:
        if s3 is not None:
            s3.close()
        api.close()
    finally:
        pods.stop_all()
        subprocess.run(["umount", str(disks)], check=False)
        subprocess.run(["umount", str(image_mnt)], check=False)
        scratch.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
