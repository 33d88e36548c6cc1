"""Compare the installed packages with constraints.txt, or rewrite constraints.txt from them.

``python .ci/newer_than_constraints.py constraints.txt`` prints every installed distribution whose version
differs from its pin (the candidates when `make test-latest` fails); ``--write constraints.txt`` pins what
is installed now (the project itself, installed editable, is left out).
"""
from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

HEADER = (
    "# Versions `make test` and `make demo` install (pip install -c constraints.txt -e .[dev]).\n"
    "# Refresh with `make constraints` after `make test-latest` passes; `.ci/newer_than_constraints.py` compares.\n"
)


def installed() -> dict[str, str]:
    versions = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or name.lower() in ("repalign", "pip", "setuptools", "wheel"):
            continue
        versions[_normal(name)] = (name, dist.version)
    return versions


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[_normal(name)] = version.strip()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("constraints", type=Path)
    parser.add_argument("--write", action="store_true", help="pin the installed versions")
    args = parser.parse_args()
    now = installed()
    if args.write:
        lines = [f"{name}=={version}" for name, version in sorted(now.values(), key=lambda v: v[0].lower())]
        args.constraints.write_text(HEADER + "\n".join(lines) + "\n")
        print(f"pinned {len(lines)} packages in {args.constraints}")
        return 0
    pinned = pins(args.constraints)
    changed = [(now[key][0], pinned.get(key), now[key][1]) for key in sorted(now) if pinned.get(key) != now[key][1]]
    if not changed:
        print(f"every installed package matches {args.constraints}")
    else:
        print(f"{len(changed)} package(s) differ from {args.constraints} (a failure below is likely theirs):")
        for name, old, new in changed:
            print(f"  {name}: {old or 'not pinned'} -> {new}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
