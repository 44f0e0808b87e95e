"""A fake RunPod API: the GraphQL API (api.runpod.io/graphql) and the network-volume REST API
(rest.runpod.io/v1/networkvolumes), answering in RunPod's own wire formats so that the real `runpod`
SDK and the real SkyPilot 0.14.1 RunPod provisioner run unchanged against it (as moto answers AWS's).

Pointing the real clients at it (what the harness does, never launcher/ or payload/):
- GraphQL: `RUNPOD_API_BASE_URL=<url>`. runpod/api/graphql.py reads it on every call (not at
  import) and posts to `<url>/graphql` with `Authorization: Bearer <key>`; that header is the only
  credential accepted here (401 otherwise, which the SDK raises as AuthenticationError).
- REST: `sky.adaptors.runpod._REST_BASE = <url>/v1` (hard-coded to https://rest.runpod.io/v1 in
  sky/adaptors/runpod.py:17), same Bearer header.
- SkyPilot's network check (sky/backends/backend_utils.py `_TEST_IP_LIST`) may be pointed here: HEAD
  on any path answers 200.

Pods are made by a `PodHost` (tests/cloud/emulator/pods.py: network namespaces; a fake one in the unit
tests): this module holds no namespace or network code and needs no root. A network volume is a host
directory, state_dir/volumes/<id>, handed to the host for each pod that mounts it.

Prices come from the shipped catalog snapshot (launcher/catalog/v8/runpod/vms.csv, SkyPilot's own
format), mapped from RunPod's gpuTypeId through SkyPilot's GPU_NAME_MAP. Every pod ever created is in
`ledger`, and `billed_usd()` adds up what RunPod would bill for the time each was alive.

Preemption, as RunPod shows it (`preempt()` or POST /admin/preempt/<id>?mode=...):
- `vanish`: host loss; the pod is gone from `myself.pods`.
- `exited`: a spot interruption; the pod stays listed with desiredStatus EXITED and no runtime.
  SkyPilot 0.14.1 has no EXITED in its status map (sky/provision/runpod/instance.py:259 raises
  KeyError 'EXITED'); tests/cloud/test_runpod_api.py shows it.

Where RunPod's answer is not documented, this is a guess, kept plain: the wording of "not found"
errors (pod, template, registry auth, network volume), the REST error body ({"error", "status"}),
DELETE /v1/networkvolumes/<id> answering 204, and refusing (400) to delete a volume a pod still uses.
Not answered (a "Cannot query field" error names them): podStop/podResume (SkyPilot 0.14.1 never
stops a RunPod pod: instance.py stop_instances raises NotImplementedError), endpoints, fragments.

Files in state_dir: api.log (one line a request: method, path, status, time, the GraphQL operation
and its identifying arguments; never a header, key or password) and state.json (the state, rewritten
after every change, for debugging).
"""

from __future__ import annotations

import json
import random
import shutil
import string
import threading
import time
import traceback
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Protocol

from . import gql
from .runpod_wire import SCHEMA, Catalog, args_summary, gpu_type_view, handler, pod_view, volume_view

REPO = Path(__file__).resolve().parents[3]
CATALOG_CSV = REPO / "launcher" / "catalog" / "v8" / "runpod" / "vms.csv"

# A CPU pod (deployCpuPod) costs this per hour, whatever its size: RunPod's smallest CPU pods
# (cpu3c-2-4, 2 vCPU / 4 GB) list at about $0.06/hr, and the shipped catalog has no CPU rows.
CPU_POD_COST_PER_HR = 0.06
# What RunPod answers when no machine fits a deploy, word for word as users quote it from the SDK's
# QueryError (runpod/runpodctl issue 189, mlabonne/llm-autoeval issue 3).
NO_CAPACITY = ("There are no longer any instances available with the requested specifications. "
               "Please refresh and try again.")
USER_ID = "emulated-user"
PREEMPT_MODES = ("vanish", "exited")


class PodHost(Protocol):
    """What makes pods real (tests/cloud/emulator/pods.py). `pod` is the pod's record: RunPod's
    fields (id, name, imageName, dockerArgs, ports, gpuTypeId, gpuCount, vcpuCount, memoryInGb,
    podType, dataCenterId, networkVolumeId, volumeMountPath, env: {KEY: VALUE}) and containerEnv, the
    variables RunPod sets in every pod (docs.runpod.io/pods/references/environment-variables)."""

    def start(self, pod: dict, volume_dir: str | None, mount_path: str | None) -> str:
        """Boot the pod in the background; return its IP."""
        ...

    def stop(self, pod_id: str) -> None:
        """Kill the pod and remove what it was made of; blocking, idempotent."""
        ...

    def ssh_ready(self, pod_id: str) -> bool:
        ...


def runpod_id(n: int = 14) -> str:
    """RunPod's ids are lowercase alphanumerics: pods 14 chars (e.g. "4uy8bkg7l9w2ri"), network
    volumes 10."""
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=n))


# ---------------------------------------------------------------------------------- the fake
class FakeRunPod:
    def __init__(self, host: PodHost, state_dir: Path, bind: str = "127.0.0.1", port: int = 0,
                 catalog_csv: Path = CATALOG_CSV, api_key: str = "emulated-key",
                 pod_vcpus: int | None = None, clock: Callable[[], float] = time.time):
        """pod_vcpus: the vcpuCount every pod reports (None: the catalog row's vCPUs for a GPU pod,
        the instanceId's for a CPU pod). SkyPilot hands it to Ray as num-cpus
        (sky/provision/runpod/instance.py get_cluster_info), so a harness on a small machine may
        report what an emulated pod really has. clock: the time source of the ledger."""
        self.host = host
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "volumes").mkdir(exist_ok=True)
        self.bind, self.port, self.api_key = bind, port, api_key
        self.catalog = Catalog(catalog_csv)
        self.pod_vcpus = pod_vcpus
        self.clock = clock
        self.url = ""
        self.ledger: list[dict] = []
        self._lock = threading.RLock()
        self._log_lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._pods: dict[str, dict] = {}
        self._volumes: dict[str, dict] = {}
        self._templates: dict[str, dict] = {}
        self._registry_auths: dict[str, dict] = {}
        self._pub_key = ""
        self._stock: dict[tuple[str, str | None], str | None] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._resolvers: dict[str, dict[str, Callable[[dict], Any]]] = {
            "Query": {"myself": self._myself, "gpuTypes": self._gpu_types, "pod": self._pod},
            "Mutation": {
                "podFindAndDeployOnDemand": lambda a: self._deploy("podFindAndDeployOnDemand", a),
                "deployCpuPod": lambda a: self._deploy("deployCpuPod", a),
                "podRentInterruptable": lambda a: self._deploy("podRentInterruptable", a),
                "podTerminate": self._terminate, "updateUserSettings": self._update_user,
                "saveTemplate": self._save_template, "deleteTemplate": self._delete_template,
                "saveRegistryAuth": self._save_registry_auth,
                "deleteRegistryAuth": self._delete_registry_auth,
            },
        }

    # ------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._server = ThreadingHTTPServer((self.bind, self.port), handler(self))
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="fake-runpod", daemon=True)
        self._thread.start()
        self._log(f"listening on {self.url}")
        self._save()

    def close(self) -> None:
        """Stop answering, then stop every pod still there (listed RUNNING or EXITED)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with self._lock:
            left = list(self._pods)
        for pod_id in left:
            try:
                self.host.stop(pod_id)
            except Exception:  # noqa: BLE001 -- every pod gets its stop, whatever one raises
                self._log(f"close: stopping {pod_id} failed\n{traceback.format_exc()}")
            with self._lock:
                self._end(pod_id, "emulator-closed")
                self._pods.pop(pod_id, None)
        self._log(f"closed; stopped {len(left)} pod(s)")
        self._save()

    def __enter__(self) -> FakeRunPod:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------ test handles
    def preempt(self, pod_id: str, mode: str) -> None:
        """The host kills the pod, then RunPod shows it: `vanish` drops it from the list (host loss),
        `exited` keeps it listed as EXITED with no runtime (a spot interruption)."""
        if mode not in PREEMPT_MODES:
            raise ValueError(f"mode must be one of {PREEMPT_MODES}, not {mode!r}")
        with self._lock:
            if pod_id not in self._pods:
                raise KeyError(pod_id)
        self.host.stop(pod_id)
        with self._lock:
            self._end(pod_id, f"preempted-{mode}")
            if mode == "vanish":
                self._pods.pop(pod_id, None)
            elif pod_id in self._pods:
                self._pods[pod_id].update(desiredStatus="EXITED", ssh_ready=False,
                                          lastStatusChange=self._status_change("Exited by RunPod"))
        self._log(f"admin preempt {pod_id} mode={mode}")
        self._save()

    def set_stock(self, gpu_type_id: str, status: str | None, data_center_id: str | None = None) -> None:
        """RunPod's stockStatus ("High" | "Medium" | "Low") for a GPU type (in one data center, or
        all); None: out of stock, so a deploy there gets RunPod's no-capacity error."""
        with self._lock:
            self._stock[(gpu_type_id, data_center_id)] = status

    def pods(self) -> list[dict]:
        with self._lock:
            return [json.loads(json.dumps(p)) for p in self._pods.values()]

    def volumes(self) -> list[dict]:
        with self._lock:
            return [dict(v) for v in self._volumes.values()]

    def volume_dir(self, volume_id: str) -> Path | None:
        """The host directory of network volume `volume_id` (its S3 bucket, runpod_s3.py), None if none."""
        with self._lock:
            vol = self._volumes.get(volume_id)
        return Path(vol["dir"]) if vol else None

    def billed_usd(self, name_prefix: str | None = None) -> float:
        """What RunPod bills for the pods' time alive: costPerHr x hours, created to ended (or now)."""
        now = self.clock()
        with self._lock:
            return round(sum(e["costPerHr"] * ((e["ended"] or now) - e["created"]) / 3600
                             for e in self.ledger
                             if name_prefix is None or (e["name"] or "").startswith(name_prefix)), 6)

    def state(self) -> dict:
        with self._lock:
            return {"url": self.url, "pods": self.pods(), "volumes": self.volumes(),
                    "templates": list(self._templates.values()),
                    "registryAuths": list(self._registry_auths.values()),
                    "pubKey": self._pub_key, "ledger": [dict(e) for e in self.ledger],
                    "billed_usd": self.billed_usd()}

    # ---------------------------------------------------------------------- state helpers
    def _save(self) -> None:
        with self._save_lock:  # one writer at a time: requests are served on many threads
            with self._lock:
                text = json.dumps(self.state(), indent=1, default=str)
            tmp = self.state_dir / "state.json.tmp"
            tmp.write_text(text)
            tmp.replace(self.state_dir / "state.json")

    def _log(self, line: str) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}"
        with self._log_lock, (self.state_dir / "api.log").open("a") as f:
            f.write(f"{stamp} {line}\n")

    def _end(self, pod_id: str, reason: str) -> None:
        for e in reversed(self.ledger):
            if e["id"] == pod_id and e["ended"] is None:
                e.update(ended=self.clock(), end_reason=reason)

    def _status_change(self, what: str) -> str:
        # RunPod's lastStatusChange reads like "Rented by User: Fri Nov 28 2026 10:00:00 GMT+0000".
        return f"{what}: " + time.strftime("%a %b %d %Y %H:%M:%S GMT+0000", time.gmtime(self.clock()))
    # ------------------------------------------------------------------------- GraphQL views
    def _pods_view(self) -> list[dict]:
        with self._lock:
            booting = [i for i, p in self._pods.items() if p["desiredStatus"] == "RUNNING"
                       and not p.get("ssh_ready") and p.get("ip")]
        for pod_id in booting:  # outside the lock: a host may take a moment to answer
            try:
                ready = self.host.ssh_ready(pod_id)
            except Exception:  # noqa: BLE001 -- a host that cannot tell is a pod not ready yet
                ready = False
            if ready:
                with self._lock:
                    if pod_id in self._pods and self._pods[pod_id]["desiredStatus"] == "RUNNING":
                        self._pods[pod_id]["ssh_ready"] = True
                self._log(f"pod {pod_id} ssh ready")
        with self._lock:
            return [pod_view(p, self.clock()) for p in self._pods.values()]
    def _myself(self, args: dict) -> dict:
        # Fields that cost something are computed only when selected (gql.shape calls them).
        return {"id": USER_ID, "pubKey": self._pub_key,
                "networkVolumes": lambda _: [volume_view(v) for v in self.volumes()],
                "pods": lambda _: self._pods_view(),
                "podTemplates": lambda _: list(self._templates.values())}

    def _pod(self, args: dict) -> dict | None:
        pod_id = (args.get("input") or {}).get("podId")
        return next((p for p in self._pods_view() if p["id"] == pod_id), None)

    def _stock_status(self, gpu_type_id: str, zone: str | None) -> str | None:
        with self._lock:
            for key in ((gpu_type_id, zone), (gpu_type_id, None)):
                if key in self._stock:
                    return self._stock[key]
        return "High"
    def _gpu_types(self, args: dict) -> list[dict]:
        # GpuTypeFilter: {id} (runpod/api/queries/gpus.py) or {ids}; a type outside the catalog is not
        # offered here, so the SDK's get_gpu raises its own "No GPU found" ValueError.
        inp = args.get("input") or {}
        wanted = [inp["id"]] if inp.get("id") else inp.get("ids") or self.catalog.ids
        return [gpu_type_view(self.catalog, g, self._stock_status) for g in wanted if g in self.catalog.ids]

    # ------------------------------------------------------------------------- mutations
    def _deploy(self, kind: str, args: dict) -> dict:
        inp = dict(args.get("input") or {})
        spot = kind == "podRentInterruptable"
        name = inp.get("name")
        if not name:
            raise gql.GraphQLError("name is required")
        template = self._templates.get(inp.get("templateId") or "")
        image = inp.get("imageName") or (template or {}).get("imageName")
        if not image:
            raise gql.GraphQLError("imageName or templateId is required")
        zone = inp.get("dataCenterId")
        instance_id = inp.get("instanceId")
        volume_id = inp.get("networkVolumeId")
        volume = None
        if volume_id:
            with self._lock:
                volume = self._volumes.get(volume_id)
            if volume is None:
                raise gql.GraphQLError(f"Network volume {volume_id} not found")
            if zone and zone != volume["dataCenterId"]:
                raise gql.GraphQLError(f"Network volume {volume_id} is in {volume['dataCenterId']}, "
                                       f"not in {zone}")
            zone = volume["dataCenterId"]
        if kind == "deployCpuPod":
            parts = (instance_id or "cpu3c-2-4").split("-")  # cpu{generation}{c|g|m}-{vCPUs}-{memory GB}
            vcpus, memory = (float(parts[1]), float(parts[2])) if len(parts) == 3 else (2.0, 4.0)
            gpu_type_id, count, cost, display = None, 0, CPU_POD_COST_PER_HR, "CPU"
        else:
            gpu_type_id = inp.get("gpuTypeId")
            count = int(inp.get("gpuCount") or 1)
            rows = [r for r in self.catalog.find(gpu_type_id, count, zone, inp.get("cloudType") or "ALL")
                    if self._stock_status(gpu_type_id, r["AvailabilityZone"])]
            if not rows:
                raise gql.GraphQLError(NO_CAPACITY)
            row = min(rows, key=lambda r: (float(r["SpotPrice" if spot else "Price"]), r["AvailabilityZone"]))
            zone = row["AvailabilityZone"]
            vcpus, memory = float(row["vCPUs"]), float(row["MemoryGiB"])
            # costPerHr: the catalog's price for `count` GPUs (spot: its SpotPrice).
            cost = round(Catalog.per_gpu(row, "SpotPrice" if spot else "Price") * count, 4)
            display = Catalog.gpu_info(row)["displayName"] or gpu_type_id
        now = self.clock()
        pod_id = runpod_id()
        env = {e["key"]: e["value"] for e in inp.get("env") or []}
        pod = {
            "id": pod_id, "name": name, "imageName": image, "dockerArgs": inp.get("dockerArgs") or "",
            "dockerId": None, "ports": inp.get("ports") or (template or {}).get("ports") or "",
            "port": None, "env": env, "gpuTypeId": gpu_type_id, "gpuCount": count,
            "gpuDisplayName": display, "cloudType": str(inp.get("cloudType") or "ALL"),
            "podType": "INTERRUPTABLE" if spot else "RESERVED", "bidPerGpu": inp.get("bidPerGpu"),
            "costPerHr": cost, "desiredStatus": "RUNNING", "dataCenterId": zone,
            "networkVolumeId": volume_id, "volumeMountPath": inp.get("volumeMountPath"),
            "containerDiskInGb": inp.get("containerDiskInGb"), "volumeInGb": inp.get("volumeInGb") or 0,
            "vcpuCount": float(self.pod_vcpus) if self.pod_vcpus else vcpus, "memoryInGb": memory,
            "templateId": inp.get("templateId"),
            "containerRegistryAuthId": (template or {}).get("containerRegistryAuthId") or None,
            "machineId": runpod_id(12), "instanceId": inp.get("instanceId"),
            "lastStatusChange": self._status_change("Rented by User"), "started": now,
            "ip": None, "ssh_ready": False,
        }
        pod["containerEnv"] = {"RUNPOD_POD_ID": pod_id, "RUNPOD_DC_ID": zone or "",
                               "RUNPOD_GPU_COUNT": str(count), "RUNPOD_CPU_COUNT": str(int(pod["vcpuCount"])),
                               "PUBLIC_KEY": self._pub_key, **env}
        with self._lock:
            self._pods[pod_id] = pod
        try:
            ip = self.host.start(json.loads(json.dumps(pod)), volume["dir"] if volume else None,
                                 pod["volumeMountPath"] if volume else None)
        except Exception as e:
            with self._lock:
                self._pods.pop(pod_id, None)
            self._log(f"pod {pod_id} failed to start\n{traceback.format_exc()}")
            raise gql.GraphQLError(f"Failed to start pod: {e}") from e
        with self._lock:
            pod["ip"] = ip
            self.ledger.append({"id": pod_id, "name": name, "podType": pod["podType"],
                                "gpuTypeId": gpu_type_id, "gpuCount": count, "costPerHr": cost,
                                "dataCenterId": zone, "created": now, "ended": None, "end_reason": None})
        self._log(f"pod {pod_id} {name!r} {pod['podType']} {gpu_type_id or instance_id} x{count} "
                  f"in {zone} ip {ip} ${cost}/hr volume {volume_id}")
        self._save()
        with self._lock:
            return pod_view(pod, self.clock())

    def _terminate(self, args: dict) -> None:
        pod_id = (args.get("input") or {}).get("podId")
        with self._lock:
            if pod_id not in self._pods:
                raise gql.GraphQLError(f"Pod {pod_id} not found")
            self._pods.pop(pod_id)
            self._end(pod_id, "terminated")  # an EXITED (preempted) pod keeps its end
        self.host.stop(pod_id)
        self._save()
        return None

    def _update_user(self, args: dict) -> dict:
        with self._lock:
            self._pub_key = (args.get("input") or {}).get("pubKey") or ""
        self._save()
        return {"id": USER_ID, "pubKey": self._pub_key}

    def _save_template(self, args: dict) -> dict:
        inp = args.get("input") or {}
        t = {"id": runpod_id(10), "name": inp.get("name"), "imageName": inp.get("imageName"),
             "dockerArgs": inp.get("dockerArgs") or "", "containerDiskInGb": inp.get("containerDiskInGb"),
             "volumeInGb": inp.get("volumeInGb"), "volumeMountPath": inp.get("volumeMountPath"),
             "ports": inp.get("ports") or "", "env": inp.get("env") or [],
             "isServerless": bool(inp.get("isServerless")),
             "containerRegistryAuthId": inp.get("containerRegistryAuthId") or None}
        with self._lock:
            self._templates[t["id"]] = t
        self._save()
        return t

    def _delete_template(self, args: dict) -> None:
        name = args.get("templateName")
        with self._lock:
            found = [i for i, t in self._templates.items() if t["name"] == name]
            if not found:
                raise gql.GraphQLError(f"Template {name} not found")
            for i in found:
                del self._templates[i]
        self._save()

    def _save_registry_auth(self, args: dict) -> dict:
        inp = args.get("input") or {}
        auth = {"id": runpod_id(10), "name": inp.get("name"), "username": inp.get("username")}
        with self._lock:  # the password is not kept: nothing reads it back
            self._registry_auths[auth["id"]] = auth
        self._save()
        return auth

    def _delete_registry_auth(self, args: dict) -> None:
        with self._lock:
            if self._registry_auths.pop(args.get("registryAuthId"), None) is None:
                raise gql.GraphQLError(f"Registry auth {args.get('registryAuthId')} not found")
        self._save()

    # ---------------------------------------------------------------------------- GraphQL
    def graphql(self, body: dict) -> tuple[int, dict, str]:
        """(HTTP status, response, summary for the log). Parse and validation errors answer 400 with
        no data, as GraphQL servers do; an error while resolving a field nulls that field."""
        try:
            op = gql.parse(body.get("query") or "", body.get("variables"), body.get("operationName"))
            root = {"query": "Query", "mutation": "Mutation"}.get(op.kind)
            if root is None:
                raise gql.GraphQLError(f"{op.kind} operations are not supported by the emulated RunPod API.")
            gql.validate(SCHEMA, root, op.selections)
        except gql.GraphQLError as e:
            return 400, {"errors": [e.as_dict()]}, f"REJECTED {e.message}"
        data: dict = {}
        errors: list[dict] = []
        for f in op.selections:
            try:
                value = self._resolvers[root][f.name](f.args)
                data[f.key] = gql.shape(SCHEMA, SCHEMA[root][f.name], value, f.selections, [f.key])
            except gql.GraphQLError as e:
                errors.append({"message": e.message, "path": [f.key]})
                data[f.key] = None
            except Exception as e:  # noqa: BLE001 -- an emulator bug answers an error, never a crash
                self._log(f"resolver {f.name} raised\n{traceback.format_exc()}")
                errors.append({"message": f"Internal server error: {e!r}", "path": [f.key]})
                data[f.key] = None
        summary = op.kind + " " + " ".join(
            f.name + args_summary(f.args)
            + ("{" + ",".join(sub.name for sub in f.selections if sub.selections) + "}"
               if f.selections and any(sub.selections for sub in f.selections) else "")
            for f in op.selections)
        if errors:
            summary += " ERRORS " + "; ".join(e["message"] for e in errors)
        return 200, ({"data": data, "errors": errors} if errors else {"data": data}), summary

    # ------------------------------------------------------------------------------ REST
    def rest(self, method: str, parts: list[str], body: Any) -> tuple[int, Any]:
        """/v1/networkvolumes[/<id>] (docs.runpod.io/api-reference/network-volumes: ListNetworkVolumes,
        CreateNetworkVolume, GetNetworkVolume, UpdateNetworkVolume, DeleteNetworkVolume)."""
        if parts[:2] != ["v1", "networkvolumes"] or len(parts) > 3:
            return 404, {"error": "not found", "status": 404}
        if len(parts) == 2:
            if method == "GET":
                return 200, [volume_view(v) for v in self.volumes()]
            if method == "POST":
                return self._create_volume(body if isinstance(body, dict) else {})
            return 405, {"error": f"{method} not allowed", "status": 405}
        vid = parts[2]
        with self._lock:
            vol = self._volumes.get(vid)
            if vol is None:
                return 404, {"error": f"network volume {vid} not found", "status": 404}
            if method == "GET":
                return 200, volume_view(vol)
            if method == "PATCH":
                size = (body or {}).get("size")
                if size is not None and int(size) < vol["size"]:
                    return 400, {"error": "size can only grow", "status": 400}
                vol.update({k: v for k, v in (body or {}).items() if k in ("name", "size") and v is not None})
                view = volume_view(vol)
            elif method == "DELETE":
                users = [p["id"] for p in self._pods.values() if p.get("networkVolumeId") == vid]
                if users:
                    return 400, {"error": f"network volume {vid} is in use by pods {users}", "status": 400}
                del self._volumes[vid]
                view = None
            else:
                return 405, {"error": f"{method} not allowed", "status": 405}
        if method == "DELETE":
            shutil.rmtree(vol["dir"], ignore_errors=True)
            self._save()
            return 204, None
        self._save()
        return 200, view

    def _create_volume(self, body: dict) -> tuple[int, Any]:
        name, size, zone = body.get("name"), body.get("size"), body.get("dataCenterId")
        if not name or not isinstance(size, int) or not 1 <= size <= 4000 or not zone:
            return 400, {"error": "name, size (1-4000 GB) and dataCenterId are required", "status": 400}
        if zone not in self.catalog.zones:
            return 400, {"error": f"unknown dataCenterId {zone}", "status": 400}
        vid = runpod_id(10)
        vdir = self.state_dir / "volumes" / vid
        vdir.mkdir(parents=True)
        vol = {"id": vid, "name": name, "size": size, "dataCenterId": zone, "dir": str(vdir)}
        with self._lock:
            self._volumes[vid] = vol
        self._save()
        return 200, volume_view(vol)

    # ----------------------------------------------------------------------------- admin
    def admin(self, method: str, parts: list[str], query: dict) -> tuple[int, Any]:
        """GET /admin/state; POST /admin/preempt/<pod id>?mode=vanish|exited;
        POST /admin/stock/<gpuTypeId>?status=High|Medium|Low|none[&dataCenterId=...]."""
        if method == "GET" and parts == ["admin", "state"]:
            return 200, self.state()
        if method == "POST" and len(parts) == 3 and parts[1] == "preempt":
            mode = (query.get("mode") or ["vanish"])[0]
            try:
                self.preempt(parts[2], mode)
            except KeyError:
                return 404, {"error": f"pod {parts[2]} not found"}
            except ValueError as e:
                return 400, {"error": str(e)}
            return 200, {"id": parts[2], "mode": mode}
        if method == "POST" and len(parts) == 3 and parts[1] == "stock":
            status = (query.get("status") or ["none"])[0]
            self.set_stock(parts[2], None if status.lower() == "none" else status,
                           (query.get("dataCenterId") or [None])[0])
            return 200, {"gpuTypeId": parts[2], "stockStatus": status}
        return 404, {"error": "not found"}

