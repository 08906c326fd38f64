"""A release's notes, and the check that its tag names what it ships.

``python scripts/release_notes.py TAG``
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def version() -> str:
    namespace: dict[str, str] = {}
    with open(os.path.join(ROOT, "src", "vllm_rocm_aiter_plugin", "_version.py")) as f:
        exec(f.read(), namespace)
    return namespace["__version__"]


def section(changelog: str, release: str) -> str | None:
    """The text under ``## [release] - date``, up to the next ``## `` heading; None if absent."""
    heading = re.compile(rf"^## \[{re.escape(release)}\] - \d{{4}}-\d{{2}}-\d{{2}}\s*$", re.M)
    match = heading.search(changelog)
    if match is None:
        return None
    rest = changelog[match.end() :]
    following = re.search(r"^## ", rest, re.M)
    return rest[: following.start() if following else len(rest)].strip()


def main(argv: list[str]) -> int:
    (tag,) = argv
    release = version()
    if tag != f"v{release}":
        print(
            f"release: the tag {tag!r} is not v{release}, the version in _version.py",
            file=sys.stderr,
        )
        return 1
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        notes = section(f.read(), release)
    if not notes:
        print(f"release: CHANGELOG.md has no '## [{release}] - YYYY-MM-DD' section with entries",
              file=sys.stderr)  # fmt: skip
        return 1
    print(notes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
