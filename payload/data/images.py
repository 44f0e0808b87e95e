"""Images of vision-language records, validated where they are read: at the data stage, not in training.

An image part references a local file (relative to the source's `image_root` or the data file's
directory) or carries the image itself: raw bytes, a base64 string (also as a `data:image/...;base64,`
URI), `{"bytes": ..., "path": ...}` as Parquet/HF store it, or a decoded PIL image. Every image is
opened with PIL, its size checked against `data.max_image_pixels` and the aspect ratio Qwen-VL's
processor accepts, then fully decoded (a truncated file fails here). A record whose image fails is
dropped with a reason (`bad image`, `image not found`) that the stats count.

Each distinct file is checked once per run (cached by path, size and mtime), and each distinct
embedded image once (by content hash); embedded images are stored once as `data/images/<hash>.<ext>`.
The content hash of every referenced file is kept for the data cache key, so replacing an image
with another of the same size and time still re-runs the stage.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from payload.config import DataConfig

from .problems import RecordError, tname

MAX_ASPECT = 200  # Qwen2/2.5/3-VL `smart_resize` refuses a longer side over 200x the shorter one
BYTES_PER_PIXEL = 8  # an encoded image larger than this x max pixels cannot be one we accept


def file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def unchanged(used: dict) -> bool:
    """Whether every image file a finished run used still has the content it had (cache check)."""
    try:
        return all(file_digest(path) == digest for path, digest in used.items())
    except OSError:
        return False


@dataclass
class ImageChecker:
    """Shared by every source of one data-stage run: the per-file and per-content caches."""

    max_pixels: int = DataConfig.model_fields["max_image_pixels"].default
    files: dict = field(default_factory=dict)  # (path, size, mtime_ns) -> None | reason
    embedded: dict = field(default_factory=dict)  # content digest -> stored path | reason
    used: dict = field(default_factory=dict)  # absolute path -> sha256 of the file (cache key)
    refs: dict = field(default_factory=dict)  # (base dir, path as written) -> path | (kind, detail)

    def check_file(self, path: Path, where: str) -> str:
        """The absolute path of a valid image file, or RecordError."""
        try:
            st = os.stat(path)
        except OSError:
            raise RecordError("image not found", f"{where}: {path}") from None
        if not os.path.isfile(path):
            raise RecordError("image not found", f"{where}: {path} is not a file")
        name = os.path.abspath(path)
        key = (name, st.st_size, st.st_mtime_ns)
        if key not in self.files:
            reason = self.too_big(st.st_size)
            if reason is None:
                with open(name, "rb") as f:
                    reason = self.inspect(f)[1]
            self.files[key] = reason
            if reason is None:
                self.used[name] = file_digest(name)
        reason = self.files[key]
        if reason is not None:
            raise RecordError("bad image", f"{where}: {path}: {reason}")
        return name

    def check_bytes(self, data: bytes, where: str, save_dir: Path) -> str:
        """Validate embedded image bytes and store them once under `save_dir`; return the path."""
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        if digest not in self.embedded:
            reason = self.too_big(len(data))
            if reason is None:
                fmt, reason = self.inspect(io.BytesIO(data))
            self.embedded[digest] = reason or _store(data, digest, fmt, save_dir)
        got = self.embedded[digest]
        if not os.path.isabs(got):
            raise RecordError("bad image", f"{where}: embedded bytes: {got}")
        return got

    def check_pil(self, img: Any, where: str, save_dir: Path) -> str:
        """A decoded PIL image (Hugging Face `Image` feature): bounds checked, stored as PNG."""
        reason = self._bounds(*img.size)
        if reason:
            raise RecordError("bad image", f"{where}: {reason}")
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return self.check_bytes(buf.getvalue(), where, save_dir)

    def inspect(self, fp) -> tuple[Optional[str], Optional[str]]:
        """(format, None) for a readable image within bounds, else (None, reason). Any exception from
        PIL is a reason: a damaged file raises many kinds."""
        from PIL import Image

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(fp) as img:
                    fmt, size = img.format, img.size
                    reason = self._bounds(*size)
                    if reason:
                        return None, reason
                    img.verify()
                fp.seek(0)
                with Image.open(fp) as img:
                    img.draft(img.mode, (max(1, size[0] // 8), max(1, size[1] // 8)))  # JPEG: decode at 1/8
                    img.load()
        except Image.UnidentifiedImageError:
            return None, "not an image (no format PIL can read)"
        except Exception as e:  # noqa: BLE001 - see docstring
            text = " ".join(str(e).split())[:120]
            return None, f"not a readable image ({type(e).__name__}{': ' + text if text else ''})"
        return (fmt or "png").lower(), None

    def _bounds(self, width: int, height: int) -> Optional[str]:
        if width < 1 or height < 1:
            return f"{width}x{height} pixels is empty"
        if width * height > self.max_pixels:
            return (f"{width}x{height} is {width * height:,} pixels > data.max_image_pixels "
                    f"{self.max_pixels:,}; downscale it")
        if max(width, height) / min(width, height) > MAX_ASPECT:
            return f"{width}x{height} has an aspect ratio over {MAX_ASPECT}, which the image processor refuses"
        return None

    def too_big(self, size: int) -> Optional[str]:
        limit = self.max_pixels * BYTES_PER_PIXEL
        if size > limit:
            return f"{size:,} bytes, more than an image within data.max_image_pixels needs ({limit:,})"
        if size == 0:
            return "0 bytes"
        return None


@dataclass
class ImageContext:
    """Where a source's relative image paths resolve and where embedded images are written."""

    base: Path
    save_dir: Path
    checker: ImageChecker = field(default_factory=ImageChecker)


def resolve_image(ref: Any, where: str, images: ImageContext) -> str:
    """A path (checked) or an embedded image (checked and saved) -> absolute path string."""
    checker = images.checker
    if isinstance(ref, str):
        if ref.startswith("data:"):
            return checker.check_bytes(_data_uri(ref, where, checker), where, images.save_dir)
        if ref.startswith(("http://", "https://")):
            raise RecordError("bad image", f"{where}: remote URL {ref[:80]!r}; download images and use local paths")
        got = checker.refs.get((images.base, ref))  # most records repeat a reference: no stat, no Path
        if got is None:
            path = Path(ref)
            try:
                got = checker.check_file(path if path.is_absolute() else images.base / path, "")
            except RecordError as e:
                got = (e.kind, e.detail)
            checker.refs[(images.base, ref)] = got
        if type(got) is tuple:
            raise RecordError(got[0], where + got[1])
        return got
    if isinstance(ref, dict):
        data = ref.get("bytes")
        if data is not None and data != b"" and data != "":
            return checker.check_bytes(_raw_bytes(data, where, checker), where, images.save_dir)
        if ref.get("path"):
            return resolve_image(ref["path"], where, images)
        raise RecordError("bad image", f"{where}: image object has neither 'bytes' nor 'path'")
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return checker.check_bytes(bytes(ref), where, images.save_dir)
    if hasattr(ref, "save") and hasattr(ref, "size") and hasattr(ref, "mode"):  # a decoded PIL image
        return checker.check_pil(ref, where, images.save_dir)
    raise RecordError("wrong type", f"{where}.image is {tname(ref)}, expected a path or an image")


def _raw_bytes(data: Any, where: str, checker: ImageChecker) -> bytes:
    """`bytes` of an image object: bytes as they are, a string as base64; nothing else (a number
    there must never become an allocation of that many bytes)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return _base64(data, where, checker)
    raise RecordError("wrong type", f"{where}: image 'bytes' is {tname(data)}, expected bytes or a base64 string")


def _data_uri(ref: str, where: str, checker: ImageChecker) -> bytes:
    head, comma, body = ref.partition(",")
    if not comma or not head.endswith(";base64"):
        raise RecordError("bad image", f"{where}: a data: URI must be `data:image/...;base64,...`")
    return _base64(body, where, checker)


def _base64(text: str, where: str, checker: ImageChecker) -> bytes:
    text = "".join(text.split())
    reason = checker.too_big(len(text) * 3 // 4)
    if reason:
        raise RecordError("bad image", f"{where}: embedded bytes: {reason}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RecordError("bad image", f"{where}: image 'bytes' is a string that is not base64") from None


def _store(data: bytes, digest: str, fmt: str, save_dir: Path) -> str:
    ext = "jpg" if fmt == "jpeg" else "".join(c for c in fmt if c.isalnum()) or "img"
    path = save_dir / f"{digest}.{ext}"
    if not path.is_file():
        save_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return os.path.abspath(path)
