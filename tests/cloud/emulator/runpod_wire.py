"""How the emulated RunPod looks on the wire: the part of RunPod's GraphQL schema that is answered,
RunPod's shapes for a pod, its runtime ports, a GPU type and a network volume, the catalog prices
behind them, and the HTTP server (routes, auth, api.log lines). The cloud's state and behaviour are in
runpod_api.py."""

from __future__ import annotations

import ast
import csv
import json
import time
import traceback
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from .runpod_api import FakeRunPod

# ------------------------------------------------------------------------------------- schema
# The part of RunPod's GraphQL schema (graphql-spec.runpod.io) that the runpod SDK, SkyPilot 0.14.1
# and the launcher select; a field outside it is a "Cannot query field" error naming it.
S, I, F, B = "String", "Int", "Float", "Boolean"
SCHEMA: dict[str, dict[str, str]] = {
    "Query": {
        # runpod/api/queries/user.py QUERY_USER; runpod/api/queries/pods.py QUERY_POD (myself.pods);
        # sky/provision/runpod/utils.py _QUERY_POD (+containerRegistryAuthId) and
        # _QUERY_POD_TEMPLATE_WITH_REGISTRY_AUTH (myself.podTemplates); sky/provision/runpod/volume.py
        # get_volume_usedby (myself.pods { id name networkVolumeId }).
        "myself": "User",
        # runpod/api/queries/gpus.py QUERY_GPU_TYPES and generate_gpu_query (gpuTypes(input: {id}) with
        # lowestPrice(input: {gpuCount})); launcher/backends/skypilot/runpod_volumes.py gpu_stock
        # (aliased lowestPrice(input: {gpuCount, dataCenterId, secureCloud}) { stockStatus }).
        "gpuTypes": "[GpuType]",
        # runpod/api/queries/pods.py generate_pod_query: pod(input: {podId}).
        "pod": "Pod",
    },
    "Mutation": {
        # runpod/api/mutations/pods.py generate_pod_deployment_mutation: GPU pods (ctl_commands
        # create_pod with gpu_type_id) and CPU pods (without: deployCpuPod, instanceId, templateId).
        "podFindAndDeployOnDemand": "Pod",
        "deployCpuPod": "Pod",
        # sky/provision/runpod/api/pods.py generate_spot_pod_deployment_mutation (spot, bidPerGpu);
        # graphql-spec.runpod.io/#definition-PodRentInterruptableInput.
        "podRentInterruptable": "Pod",
        # runpod/api/mutations/pods.py generate_pod_terminate_mutation: podTerminate(input: {podId}).
        "podTerminate": "Void",
        # runpod/api/mutations/user.py generate_user_mutation: updateUserSettings(input: {pubKey}),
        # called by runpod/cli/groups/ssh/functions.py add_ssh_key (sky/authentication.py:370).
        "updateUserSettings": "User",
        # runpod/api/mutations/templates.py generate_pod_template, container_register_auth.py;
        # sky/provision/runpod/utils.py delete_pod_template: deleteTemplate(templateName) (SkyPilot's
        # docker-login path only).
        "saveTemplate": "PodTemplate",
        "deleteTemplate": "Void",
        "saveRegistryAuth": "ContainerRegistryAuth",
        "deleteRegistryAuth": "Void",
    },
    "User": {"id": S, "pubKey": S, "networkVolumes": "[NetworkVolume]", "pods": "[Pod]",
             "podTemplates": "[PodTemplate]"},
    "NetworkVolume": {"id": S, "name": S, "size": I, "dataCenterId": S},
    "Pod": {
        "id": S, "containerDiskInGb": I, "containerRegistryAuthId": S, "costPerHr": F,
        "desiredStatus": S, "dockerArgs": S, "dockerId": S, "env": "[String]", "gpuCount": I,
        "imageName": S, "lastStatusChange": S, "machineId": S, "memoryInGb": F, "name": S,
        "podType": S, "port": I, "ports": S, "uptimeSeconds": I, "vcpuCount": F, "volumeInGb": F,
        "volumeMountPath": S, "networkVolumeId": S, "templateId": S, "runtime": "PodRuntime",
        "machine": "PodMachineInfo",
    },
    "PodRuntime": {"uptimeInSeconds": I, "ports": "[PodRuntimePorts]", "gpus": "[PodRuntimeGpus]",
                   "container": "PodRuntimeContainer"},
    "PodRuntimePorts": {"ip": S, "isIpPublic": B, "privatePort": I, "publicPort": I, "type": S},
    "PodRuntimeGpus": {"id": S, "gpuUtilPercent": I, "memoryUtilPercent": I},
    "PodRuntimeContainer": {"cpuPercent": I, "memoryPercent": I},
    "PodMachineInfo": {"gpuDisplayName": S, "podHostId": S},
    "GpuType": {
        "id": S, "displayName": S, "manufacturer": S, "memoryInGb": I, "cudaCores": I,
        "secureCloud": B, "communityCloud": B, "securePrice": F, "communityPrice": F,
        "oneMonthPrice": F, "threeMonthPrice": F, "oneWeekPrice": F, "communitySpotPrice": F,
        "secureSpotPrice": F, "maxGpuCount": I, "lowestPrice": "LowestPrice",
    },
    "LowestPrice": {"minimumBidPrice": F, "uninterruptablePrice": F, "stockStatus": S,
                    "minVcpu": F, "minMemory": F},
    "PodTemplate": {"id": S, "name": S, "imageName": S, "dockerArgs": S, "containerDiskInGb": I,
                    "volumeInGb": I, "volumeMountPath": S, "ports": S, "env": "[EnvironmentVariable]",
                    "isServerless": B, "containerRegistryAuthId": S},
    "EnvironmentVariable": {"key": S, "value": S},
    "ContainerRegistryAuth": {"id": S, "name": S},
}


# ------------------------------------------------------------------------------------ catalog
class Catalog:
    """The catalog snapshot's RunPod rows, seen by RunPod's gpuTypeId. A row's Price and SpotPrice
    are for AcceleratorCount GPUs (2x_H100-SXM_SECURE: 6.58 = 2 x 3.29)."""

    def __init__(self, csv_path: Path):
        from sky.provision.runpod.utils import GPU_NAME_MAP  # SkyPilot's instance type -> gpuTypeId

        self.gpu_type_id = dict(GPU_NAME_MAP)
        with Path(csv_path).open() as f:
            self.rows = [r for r in csv.DictReader(f) if r["AcceleratorName"] in GPU_NAME_MAP]
        self.ids = sorted({GPU_NAME_MAP[r["AcceleratorName"]] for r in self.rows})
        self.zones = sorted({r["AvailabilityZone"] for r in self.rows})

    def find(self, gpu_type_id: str, count: int | None = None, zone: str | None = None,
             cloud: str = "ALL") -> list[dict]:
        return [r for r in self.rows
                if self.gpu_type_id[r["AcceleratorName"]] == gpu_type_id
                and (count is None or int(float(r["AcceleratorCount"])) == count)
                and (zone is None or r["AvailabilityZone"] == zone)
                and (cloud == "ALL" or r["InstanceType"].endswith("_" + cloud))]

    @staticmethod
    def per_gpu(row: dict, column: str) -> float:
        return round(float(row[column]) / float(row["AcceleratorCount"]), 4)

    @staticmethod
    def gpu_info(row: dict) -> dict:
        info = ast.literal_eval(row["GpuInfo"]) if row.get("GpuInfo") else {}
        gpu = (info.get("Gpus") or [{}])[0]
        return {"displayName": gpu.get("Name"), "manufacturer": gpu.get("Manufacturer"),
                # SkyPilot's catalog writes RunPod's memoryInGb into a field named SizeInMiB.
                "memoryInGb": (gpu.get("MemoryInfo") or {}).get("SizeInMiB")}


# -------------------------------------------------------------------------------------- shapes
def pod_view(p: dict, now: float) -> dict:
    """A pod as RunPod's `Pod` type shows it (runpod/api/queries/pods.py QUERY_POD fields)."""
    running = p["desiredStatus"] == "RUNNING"
    view = {k: p.get(k) for k in SCHEMA["Pod"] if k not in ("runtime", "machine", "env")}
    view.update(
        env=[f"{k}={v}" for k, v in (p.get("env") or {}).items()],
        uptimeSeconds=int(now - p["started"]) if running else 0,
        machine={"gpuDisplayName": p["gpuDisplayName"], "podHostId": f"{p['id']}-{p['machineId']}"},
        # RunPod answers runtime: null until the container is up; here until sshd answers.
        runtime=runtime(p, now) if running and p.get("ssh_ready") else None,
    )
    return view


def runtime(p: dict, now: float) -> dict:
    """runtime.ports as RunPod lists them: each tcp port of `ports` on the public address
    (isIpPublic true; SkyPilot takes external_ip and ssh_port from 22's), and entries with
    isIpPublic false on the pod's private address (SkyPilot's internal_ip; sky/provision/runpod/
    utils.py list_instances), where RunPod also lists the http ports it proxies. On RunPod a public
    port is NAT'd to a high publicPort on another address; an emulated pod has one address, its
    namespace's, and its ports are not mapped (publicPort == privatePort)."""
    ports = []
    for spec in filter(None, (p.get("ports") or "").split(",")):
        num, _, proto = spec.partition("/")
        n = int(num)
        if proto == "tcp":
            ports.append({"ip": p["ip"], "isIpPublic": True, "privatePort": n, "publicPort": n,
                          "type": "tcp"})
        if proto != "tcp" or n == 22:
            ports.append({"ip": p["ip"], "isIpPublic": False, "privatePort": n, "publicPort": n,
                          "type": proto or "tcp"})
    return {"uptimeInSeconds": int(now - p["started"]), "ports": ports,
            "gpus": [{"id": f"GPU-{i}", "gpuUtilPercent": 0, "memoryUtilPercent": 0}
                     for i in range(p.get("gpuCount") or 0)],
            "container": {"cpuPercent": 0, "memoryPercent": 0}}


def volume_view(v: dict) -> dict:
    # RunPod's NetworkVolume (runpod/api/queries/user.py; REST: docs.runpod.io/api-reference/
    # network-volumes): id, name, size (GB), dataCenterId.
    return {k: v[k] for k in ("id", "name", "size", "dataCenterId")}


def gpu_type_view(catalog: Catalog, gpu_type_id: str, stock: Callable[[str, str | None], str | None]) -> dict:
    """RunPod's GpuType from the catalog; stock(gpu_type_id, dataCenterId) gives stockStatus."""
    rows = catalog.find(gpu_type_id)
    secure = [r for r in rows if r["InstanceType"].endswith("_SECURE")]
    community = [r for r in rows if r["InstanceType"].endswith("_COMMUNITY")]

    def lowest(column: str, among: list[dict]) -> float | None:
        return min((Catalog.per_gpu(r, column) for r in among), default=None)

    def lowest_price(args: dict) -> dict:
        # LowestPrice for `gpuCount` GPUs, optionally in one data center / cloud; prices per GPU.
        inp = args.get("input") or {}
        cloud = {True: "SECURE", False: "COMMUNITY"}.get(inp.get("secureCloud"), "ALL")
        zone = inp.get("dataCenterId")
        found = catalog.find(gpu_type_id, int(inp.get("gpuCount") or 1), zone, cloud)
        status = stock(gpu_type_id, zone) if found else None
        return {"minimumBidPrice": lowest("SpotPrice", found) if status else None,
                "uninterruptablePrice": lowest("Price", found) if status else None,
                "stockStatus": status,
                "minVcpu": min((float(r["vCPUs"]) for r in found), default=None),
                "minMemory": min((float(r["MemoryGiB"]) for r in found), default=None)}

    return {"id": gpu_type_id, **Catalog.gpu_info(rows[0]), "cudaCores": None,
            "secureCloud": bool(secure), "communityCloud": bool(community),
            "securePrice": lowest("Price", secure), "communityPrice": lowest("Price", community),
            "secureSpotPrice": lowest("SpotPrice", secure),
            "communitySpotPrice": lowest("SpotPrice", community),
            "oneWeekPrice": None, "oneMonthPrice": None, "threeMonthPrice": None,
            "maxGpuCount": max(int(float(r["AcceleratorCount"])) for r in rows),
            "lowestPrice": lowest_price}


# ---------------------------------------------------------------------------------------- HTTP
_LOGGED_ARGS = ("podId", "name", "gpuTypeId", "gpuCount", "cloudType", "bidPerGpu", "dataCenterId",
                "networkVolumeId", "instanceId", "id", "templateName")


def args_summary(args: dict) -> str:
    """The arguments that identify a call, for api.log (never a password, key or docker args)."""
    flat = dict(args)
    if isinstance(args.get("input"), dict):
        flat.update(args["input"])
    shown = [f"{k}={flat[k]!r}" for k in dict.fromkeys(_LOGGED_ARGS) if flat.get(k) is not None]
    return f"({', '.join(shown)})" if shown else ""


def handler(fake: FakeRunPod) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "emulated-runpod"

        def log_message(self, fmt: str, *args: Any) -> None:  # api.log instead of stderr
            pass

        def _send(self, code: int, obj: Any) -> None:
            body = b"" if obj is None and (code == 204 or self.command == "HEAD") else json.dumps(obj).encode()
            self.send_response(code)
            if body:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

        def _authorized(self) -> bool:
            # The runpod SDK (runpod/api/graphql.py) and SkyPilot's REST adaptor
            # (sky/adaptors/runpod.py rest_request) both send `Authorization: Bearer <key>`.
            return self.headers.get("Authorization") == f"Bearer {fake.api_key}"

        def _handle(self) -> None:
            t0 = time.monotonic()
            url = urlsplit(self.path)
            parts = [p for p in url.path.split("/") if p]
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            note = ""
            try:
                code, out, note = self._answer(parts, query, raw)
            except Exception as e:  # noqa: BLE001 -- answer 500, log it, keep serving
                code, out = 500, {"errors": [{"message": f"Internal server error: {e!r}"}]}
                note = f"{e!r}\n{traceback.format_exc()}"
            if code >= 400 and not note and isinstance(out, dict):
                note = json.dumps(out)
            shown_path = url.path + ("?" + "&".join(f"{k}={v[0]}" for k, v in query.items()
                                                     if "key" not in k.lower()) if query else "")
            # logged before the reply: whoever holds the reply finds its line in api.log
            fake._log(f"{self.client_address[0]} {self.command} {shown_path} {code} "
                      f"{(time.monotonic() - t0) * 1000:.0f}ms {note}".rstrip())
            try:
                self._send(code, out)
            except OSError:
                pass  # the client went away

        def _answer(self, parts: list, query: dict, raw: bytes) -> tuple[int, Any, str]:
            """(status, JSON body or None, note for api.log) for this request."""
            if self.command == "HEAD":  # SkyPilot's network check, when pointed here
                return 200, None, ""
            if parts[:1] == ["admin"]:
                return (*fake.admin(self.command, parts, query), "")
            if parts[:1] in (["graphql"], ["v1"]) and not self._authorized():
                return 401, ({"errors": [{"message": "Unauthorized"}]} if parts[0] == "graphql"
                             else {"error": "Unauthorized", "status": 401}), ""
            if parts == ["graphql"] and self.command == "POST":
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    return 400, {"errors": [{"message": "POST body sent invalid JSON."}]}, "bad JSON"
                return fake.graphql(body if isinstance(body, dict) else {})
            if parts[:1] == ["v1"]:
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    return 400, {"error": "invalid JSON body", "status": 400}, ""
                code, out = fake.rest(self.command, parts, body)
                note = json.dumps(out) if code < 400 and self.command != "GET" and out is not None else ""
                return code, out, note
            return 404, {"error": "not found"}, ""

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = do_HEAD = _handle

    return Handler
