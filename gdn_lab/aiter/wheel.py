"""A trimmed amd-aiter wheel: the `aiter` Python package alone, for machines that only run its Triton kernels.

The PyPI wheel (40 MB) is mostly `aiter_meta/`: prebuilt HSA code objects, CK and other C++
sources for ROCm JIT builds. Off ROCm only the Python package `aiter/` is ever imported (1.5 MB
compressed), so a GPU machine reached by copying files (64 MiB per carry) needs only that. The
trimmed wheel keeps every file under the kept top-level folders byte for byte, rewrites RECORD
with their hashes, and marks itself with the local version label `+trimmed`, so the fingerprint's
aiter version says which wheel ran.

Usage:
    python -m gdn_lab.aiter.wheel .whl/amd_aiter-0.1.7.post2.dev18-py3-none-any.whl .whl-aiter/
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

KEEP = ("aiter/",)
LABEL = "trimmed"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def trim_wheel(src: str | Path, out_dir: str | Path, keep: Sequence[str] = KEEP, label: str = LABEL) -> Path:
    """Write a copy of wheel `src` holding only the files under `keep`, versioned `<version>+<label>`.

    Args:
        src: the wheel file.
        out_dir: where the trimmed wheel goes (created if missing).
        keep: top-level folder prefixes to keep (the .dist-info folder is always rewritten).
        label: the local version label added to the version.

    Returns:
        The trimmed wheel's path.

    Raises:
        ValueError: `src` is not a wheel with one .dist-info folder, or nothing matches `keep`.
    """
    src = Path(src)
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        infos = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")})
        if len(infos) != 1:
            raise ValueError(f"src: {src} is not a wheel with one .dist-info folder (found {infos})")
        info = infos[0]
        dist, version = info.removesuffix(".dist-info").rsplit("-", 1)
        new_version = f"{version.split('+')[0]}+{label}"
        new_info = f"{dist}-{new_version}.dist-info"
        kept = [n for n in names if n.startswith(tuple(keep)) and not n.endswith("/")]
        if not kept:
            raise ValueError(f"keep: no file of {src.name} is under {list(keep)}")
        files: dict[str, bytes] = {n: zin.read(n) for n in kept}
        for n in names:
            if n.startswith(info + "/") and not n.endswith("/RECORD"):
                data = zin.read(n)
                if n.endswith("/METADATA"):
                    data = re.sub(rb"(?m)^Version: .*$", f"Version: {new_version}".encode(), data, count=1)
                if n.endswith("/top_level.txt"):
                    tops = {k.rstrip("/").split("/")[0] for k in keep}
                    data = "".join(f"{t}\n" for t in sorted(tops)).encode()
                files[new_info + n[len(info) :]] = data
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{new_info}/RECORD,,\n"
    files[f"{new_info}/RECORD"] = record.encode()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / src.name.replace(f"-{version}-", f"-{new_version}-", 1)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for n, d in files.items():
                zout.writestr(n, d)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a wheel is read by whoever installs it
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gdn_lab.aiter.wheel", description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", help="the amd-aiter wheel (pip download --no-deps amd-aiter==0.1.7.post2.dev18)")
    parser.add_argument("out_dir", help="where to write the trimmed wheel")
    args = parser.parse_args(argv)
    path = trim_wheel(args.wheel, args.out_dir)
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
