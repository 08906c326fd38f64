"""Make an sdist byte-for-byte reproducible: ``python scripts/reproducible_sdist.py SDIST...``."""

from __future__ import annotations

import gzip
import io
import os
import sys
import tarfile


def source_date_epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH")
    if not value:
        raise SystemExit(
            "reproducible_sdist: SOURCE_DATE_EPOCH is not set; the dist session sets it to the "
            "last commit's time (git log -1 --format=%ct)"
        )
    return int(value)


def normalize(path: str, epoch: int) -> None:
    members = []
    with tarfile.open(path, "r:gz") as source:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            members.append((member, data))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target:
        for member, data in sorted(members, key=lambda item: item[0].name):
            member.mtime = epoch
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            # git keeps only whether a file is executable; the checkout's umask adds the rest
            member.mode = 0o755 if member.isdir() or member.mode & 0o100 else 0o644
            member.pax_headers = {}
            target.addfile(member, io.BytesIO(data) if data is not None else None)
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=epoch, compresslevel=9) as packed,
    ):
        packed.write(out.getvalue())


def main(argv: list[str]) -> int:
    epoch = source_date_epoch()
    for path in argv:
        normalize(path, epoch)
        print(f"reproducible_sdist: {os.path.basename(path)} stamped {epoch}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
