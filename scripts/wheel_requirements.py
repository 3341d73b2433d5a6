"""Check carried wheels against each other and a machine's installed packages, before a one-shot call carries them.

    python scripts/wheel_requirements.py WHEEL_DIR [WHEEL_DIR ...] --have name[==version] ... [--ignore name ...]

Every wheel's ``Requires-Dist`` (markers evaluated for Linux x86-64 CPython 3.12, no extras) must be met by a wheel in
the folders (its version inside the specifier) or by a package the machine already has (``--have``; a version there is
checked too). ``--ignore`` names requirements known not to be imported on the path that runs (vLLM declares its
kernels' and servers' packages for every install). Prints one line per unmet requirement and exits 1 if any: a lent
GPU once lost two calls to an ``openai`` that imports ``httpx2`` and an ``xgrammar`` too new for the carried
``apache-tvm-ffi``.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version


def metadata(wheel: Path) -> tuple[str, Version, list[str]]:
    """(name, version, requirements) of one wheel, read from its METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        member = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(member).decode("utf-8"))
    return canonicalize_name(message["Name"]), Version(message["Version"]), message.get_all("Requires-Dist") or []


def unmet(folders: list[Path], have: dict[str, Version | None], python: str = "3.12",
          ignore: frozenset[str] = frozenset()) -> list[str]:
    """Each requirement that neither the folders nor ``have`` meets, as a line naming the wheel that asks for it."""
    found_wheels = sorted(wheel for folder in folders for wheel in folder.glob("*.whl"))
    wheels = {name: (version, requires) for name, version, requires in map(metadata, found_wheels)}
    environment = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                   "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    problems = []
    for name, (version, requires) in sorted(wheels.items()):
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            wanted = canonicalize_name(requirement.name)
            if wanted in ignore:
                continue
            found = wheels[wanted][0] if wanted in wheels else have.get(wanted, False)
            if found is False:
                problems.append(f"{name} {version} needs {requirement}: neither carried nor on the machine")
            elif found is not None and not requirement.specifier.contains(found, prereleases=True):
                where = "carried" if wanted in wheels else "on the machine"
                problems.append(f"{name} {version} needs {requirement}: {wanted} {found} {where}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--have", nargs="*", default=[], help="packages the machine has: name or name==version")
    parser.add_argument("--ignore", nargs="*", default=[], help="requirements not imported where the wheels run")
    parser.add_argument("--python", default="3.12")
    args = parser.parse_args(argv)
    have: dict[str, Version | None] = {}
    for item in args.have:
        name, _, version = item.partition("==")
        have[canonicalize_name(name)] = Version(version) if version else None
    ignore = frozenset(canonicalize_name(name) for name in args.ignore)
    problems = unmet(args.folders, have, args.python, ignore)
    for line in problems:
        print(f"wheel_requirements: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
