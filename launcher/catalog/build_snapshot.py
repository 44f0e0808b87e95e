"""Generate the offline SkyPilot catalog snapshot (`v8/`, SkyPilot's v8 CSV format) from the extract.

    python -m launcher.catalog.build_snapshot            # rewrite v8/ and snapshot.json
    python -m launcher.catalog.build_snapshot --check    # exit 1 if they differ from a fresh build

`extract/` holds rows copied unchanged from SkyPilot's published catalog (skypilot-org/skypilot-catalog,
the files SkyPilot's own optimizer downloads), each file opening with `#` lines that name the source
repo, path, commit and the date it was read. This script only selects, validates and re-serializes
those rows: there is no price in this file, and tests/launcher/catalog/test_catalog.py checks that a fresh build is
byte-identical to what is committed. To refresh prices: re-read the source files, replace the rows in
extract/ (keep the `#` header current), run this script, commit. See launcher/catalog/README.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXTRACT = HERE / "extract"
V8 = HERE / "v8"
SNAPSHOT_META = HERE / "snapshot.json"

# extract file -> (file under v8/, the header SkyPilot 0.14.1 reads there)
OUTPUTS = {
    "runpod_vms.csv": ("runpod/vms.csv", ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs",
                                          "MemoryGiB", "Region", "SpotPrice", "Price", "AvailabilityZone",
                                          "GpuInfo"]),
    "azure_vms.csv": ("azure/vms.csv", ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs",
                                        "MemoryGiB", "GpuInfo", "Price", "SpotPrice", "Region", "Generation"]),
    "azure_images.csv": ("azure/images.csv", ["Tag", "Region", "OS", "OSVersion", "ImageId"]),
    "accelerators.csv": ("common/accelerators.csv", ["AcceleratorName", "Clouds"]),
}
PRICE_COLUMNS = ("Price", "SpotPrice")


class ExtractError(ValueError):
    pass


def read_extract(path: Path) -> tuple[dict, list[str], list[list[str]]]:
    """(provenance from the `# key: value` header lines, CSV header, rows)."""
    meta: dict[str, str] = {}
    body = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("#"):
            key, sep, value = line[1:].strip().partition(": ")
            if sep and key.isidentifier() and key != "note":
                meta[key] = value.strip()
        else:
            body.append(line)
    rows = list(csv.reader(io.StringIO("".join(body))))
    if not rows:
        raise ExtractError(f"{path.name}: no CSV header")
    return meta, rows[0], rows[1:]


def _validate(name: str, meta: dict, header: list[str], rows: list[list[str]], expected: list[str]) -> None:
    where = f"launcher/catalog/extract/{name}"
    missing = [k for k in ("repo", "path", "commit", "read") if not meta.get(k)]
    if missing:
        raise ExtractError(f"{where}: the `#` header must name {', '.join(missing)} (where the rows come from)")
    if header != expected:
        raise ExtractError(f"{where}: header {header} is not SkyPilot's v8 header {expected}")
    for n, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise ExtractError(f"{where}: row {n} has {len(row)} fields, expected {len(header)}")
        for col in PRICE_COLUMNS:
            if col in header and row[header.index(col)]:
                try:
                    float(row[header.index(col)])
                except ValueError:
                    raise ExtractError(f"{where}: row {n}: {col} `{row[header.index(col)]}` is not a number") from None


def _csv_text(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def build() -> dict[Path, str]:
    """{path: text} of every generated file (v8/*.csv and snapshot.json), from extract/ alone."""
    files: dict[Path, str] = {}
    sources = []
    for name, (rel, expected) in OUTPUTS.items():
        meta, header, rows = read_extract(EXTRACT / name)
        _validate(name, meta, header, rows, expected)
        files[V8 / rel] = _csv_text(header, rows)
        sources.append({"file": f"v8/{rel}", "rows": len(rows), **{k: meta[k] for k in ("repo", "path", "commit", "read")}})
    snapshot = {"date": min(s["read"] for s in sources), "sources": sources,
                "storage_prices": "extract/storage_prices.csv"}
    files[SNAPSHOT_META] = json.dumps(snapshot, indent=2) + "\n"
    return files


def stale(files: dict[Path, str]) -> list[Path]:
    return [p for p, text in files.items() if not p.exists() or p.read_text(encoding="utf-8") != text]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.catalog.build_snapshot", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 when v8/ differs from a fresh build")
    args = ap.parse_args(argv)
    files = build()
    if args.check:
        diff = stale(files)
        for p in diff:
            print(f"stale: {p.relative_to(HERE)}", file=sys.stderr)
        return 1 if diff else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
