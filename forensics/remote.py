"""Logs in object storage: ``s3://``, ``gs://`` and any other fsspec URL as a run path.

A URL names one log file or a prefix (a "folder") of them. Its objects are fetched in ranged
reads of :data:`BLOCK_SIZE` bytes into a local mirror under the user cache folder
(``~/.cache/forensics/remote/``), one block in memory at a time, so a multi-GB event file
never sits whole in memory on its way; the importers then read the mirror like any local
run. A second look at the same URL fetches only objects whose size or ETag changed.

Credentials come from where each backend looks for them: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE`` / ``AWS_ENDPOINT_URL`` (s3fs, botocore),
``GOOGLE_APPLICATION_CREDENTIALS`` (gcsfs), and fsspec's own ``FSSPEC_<PROTOCOL>_<OPTION>``
variables (``FSSPEC_S3_ENDPOINT_URL=http://localhost:9000`` for MinIO or a test server).
The backends are optional: ``pip install 'forensics[s3]'`` or ``'forensics[gcs]'``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from forensics.errors import ForensicsError, UnreadableInputError

BLOCK_SIZE = int(os.environ.get("FORENSICS_REMOTE_BLOCK_SIZE", str(8 << 20)))
MAX_FILES = 20000
_URL = re.compile(r"^(?P<proto>[A-Za-z][A-Za-z0-9+.-]*)://")
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
_MARKER = ".forensics-remote.json"  # hidden: list_files never reads it as a log


def is_url(path: object) -> bool:
    """True for ``scheme://...`` strings other than ``file://``."""
    m = _URL.match(str(path))
    return m is not None and m["proto"].lower() != "file"


def local_path(path: str | os.PathLike[str]) -> Path:
    """A path the importers can read: local paths as given, URLs fetched into the mirror."""
    text = os.fspath(path)
    if isinstance(text, str) and text.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(text).path))
    if isinstance(text, str) and is_url(text):
        return fetch(text)
    return Path(text)


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forensics" / "remote"


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise ForensicsError(
            f"{url}: reading URLs needs fsspec: pip install 'forensics[s3]'"
        ) from None
    proto = _URL.match(url)["proto"].lower()  # type: ignore[index]
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        extra = _EXTRAS.get(proto, proto)
        raise ForensicsError(
            f"{url}: the {proto}:// backend is not installed ({exc.name or exc}): "
            f"pip install 'forensics[{extra}]'"
        ) from None
    except ValueError as exc:
        raise ForensicsError(f"{url}: {exc}") from None


def _remote_error(url: str, exc: Exception) -> ForensicsError:
    if isinstance(exc, FileNotFoundError):
        return UnreadableInputError(f"{url}: no such object or prefix")
    if isinstance(exc, PermissionError):
        return UnreadableInputError(
            f"{url}: access denied (check the credentials in the environment)"
        )
    return UnreadableInputError(f"{url}: cannot be read ({type(exc).__name__}: {exc})")


def _signature(info: dict[str, Any]) -> list[Any]:
    """What tells an object changed: size plus ETag, generation or modification time."""
    tag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("mtime")
    tag = tag or info.get("LastModified") or info.get("updated")
    return [int(info.get("size") or 0), str(tag) if tag is not None else None]


def fetch(url: str, *, block_size: int | None = None, cache: Path | None = None) -> Path:
    """Mirror the object or prefix at ``url`` into the local cache; return the local path.

    Each object is read in ranges of ``block_size`` bytes and written to a temporary file
    that replaces the mirrored one when complete, so a cut transfer never leaves half a log.
    """
    block = block_size or BLOCK_SIZE
    url = url.rstrip("/")
    fs, root = _filesystem(url)
    try:
        info = fs.info(root)
        if info.get("type") == "directory":
            found = fs.find(root, detail=True)
            objects = {
                PurePosixPath(p).relative_to(PurePosixPath(root.rstrip("/"))).as_posix(): i
                for p, i in sorted(found.items())
                if i.get("type") != "directory" and not p.endswith("/")
            }
            if not objects:
                raise UnreadableInputError(f"{url}: the prefix holds no object")
        else:
            objects = {PurePosixPath(root).name: info}
    except ForensicsError:
        raise
    except Exception as exc:  # noqa: BLE001 - each backend raises its own types
        raise _remote_error(url, exc) from None
    if len(objects) > MAX_FILES:
        raise UnreadableInputError(f"{url}: more than {MAX_FILES} objects; point at one run")
    name = PurePosixPath(root.rstrip("/")).name or "run"
    base = (cache or _cache_root()) / hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    is_dir = info.get("type") == "directory"
    dest = base / name if is_dir else base
    marker_path = base / _MARKER
    try:
        known = json.loads(marker_path.read_text()) if marker_path.is_file() else {}
    except ValueError:
        known = {}
    fetched: dict[str, list[Any]] = {}
    for rel, obj in objects.items():
        parts = PurePosixPath(rel).parts
        if any(p in ("", ".", "..") for p in parts):
            continue  # a key that would escape the mirror
        target = dest.joinpath(*parts) if is_dir else base / name
        sig = _signature(obj)
        key = rel if is_dir else name
        if known.get(key) == sig and target.is_file() and target.stat().st_size == sig[0]:
            fetched[key] = sig
            continue
        remote = f"{root.rstrip('/')}/{rel}" if is_dir else root
        _copy_ranges(fs, remote, target, size=sig[0], block=block, url=url)
        fetched[key] = sig
    if is_dir:
        _prune(dest, set(fetched))
    base.mkdir(parents=True, exist_ok=True)
    marker_path.write_text(json.dumps({"url": url, **fetched}))
    return dest if is_dir else base / name


def _prune(dest: Path, keep: set[str]) -> None:
    """Remove mirrored files whose objects are gone: a deleted log must not be analysed."""
    for dirpath, _, files in os.walk(dest):
        for f in files:
            p = Path(dirpath) / f
            if p.relative_to(dest).as_posix() not in keep:
                p.unlink(missing_ok=True)


def _copy_ranges(fs: Any, remote: str, target: Path, *, size: int, block: int, url: str) -> None:
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            start = 0
            while start < size:
                end = min(size, start + block)
                chunk = fs.cat_file(remote, start=start, end=end)
                if not chunk:
                    break  # the object shrank while we read it: keep what there was
                out.write(chunk)
                start += len(chunk)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, (FileNotFoundError, PermissionError)) and exc.filename is None:
            raise _remote_error(url, exc) from None
        raise
    except Exception as exc:  # noqa: BLE001 - each backend raises its own types
        tmp.unlink(missing_ok=True)
        raise _remote_error(url, exc) from None
