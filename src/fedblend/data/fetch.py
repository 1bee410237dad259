"""Where dataset files are and how they get there: the data directory (an explicit argument, ``FEDBLEND_DATA``,
or ``~/.fedblend/data``), each file checked against its md5, and a missing one downloaded from its canonical URL;
a failure names the file, where it was looked for and where to get it."""

from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fedblend.common.errors import FedblendError

ENV_VAR = "FEDBLEND_DATA"


class DataNotFoundError(FedblendError, FileNotFoundError):
    """A dataset file is missing and could not be downloaded."""


class ChecksumError(FedblendError, ValueError):
    """A dataset file exists but its md5 is not the canonical one."""


@dataclass(frozen=True)
class FileSpec:
    name: str
    md5: str | None
    url: str | None


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    if data_dir is not None:
        return Path(data_dir).expanduser()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return Path("~/.fedblend/data").expanduser()


def md5sum(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def download_verified(url: str, path: Path, md5: str | None) -> None:
    """Download ``url`` to ``path`` through a temporary name (``<name>.part``) that is renamed to ``path`` only
    after its md5 matches, so a failed or corrupt download never sits under the real name."""
    tmp = path.with_suffix(path.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            path.parent.mkdir(parents=True, exist_ok=True)  # only once the source answers
            with open(tmp, "wb") as f:
                while block := r.read(1 << 20):
                    f.write(block)
        if md5 is not None and (got := md5sum(tmp)) != md5:
            raise ChecksumError(f"the download of {path.name} from {url} has md5 {got}, expected {md5}; it was "
                                f"discarded (nothing was written to {path}). Try again or fetch it yourself.")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def fetch(data_dir: Path, folder: str, spec: FileSpec, download: bool = True) -> Path:
    """Path to a verified dataset file; download it when missing; raise with a clear message otherwise."""
    path = data_dir / folder / spec.name
    if not path.exists() and download and spec.url:
        try:
            download_verified(spec.url, path, spec.md5)
        except OSError as exc:  # URLError is an OSError
            where = spec.url or "the dataset's home page"
            raise DataNotFoundError(
                f"dataset file {spec.name!r} not found at {path} and the download from {where} failed ({exc}). "
                f"Download it yourself into {path.parent}, or point --data-dir / ${ENV_VAR} at a directory "
                f"holding {folder}/{spec.name}."
            ) from exc
    if not path.exists():
        raise DataNotFoundError(
            f"dataset file {spec.name!r} not found at {path}. Get it from {spec.url or 'its home page'} into "
            f"{path.parent}, or point --data-dir / ${ENV_VAR} at a directory holding {folder}/{spec.name}."
        )
    if spec.md5 is not None:
        got = md5sum(path)
        if got != spec.md5:
            raise ChecksumError(
                f"{path} has md5 {got}, expected {spec.md5}: the file is corrupt or not the canonical one. "
                f"Delete it and fetch it again from {spec.url or 'its home page'}."
            )
    return path
