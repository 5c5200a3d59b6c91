"""Splits an image's virtualenv into a dependency layer and a layer of Ebbflow's own packages.

The images install their third-party dependencies from the project files alone (no sources in the
build context yet), so that layer is cached until a pin or a dependency changes; Ebbflow's own
packages are installed after it and copied into the final image as a layer of their own, so a
source change rebuilds a few hundred kilobytes instead of the whole virtualenv.

  venv_layers.py requirements PYPROJECT[EXTRAS]...   the [project] dependencies (and those of the
      named extras) of each file, less the projects named by the files themselves, one per line
  venv_layers.py stage PREFIX DEST   copies every file pip recorded for the installed distributions
      whose names start with PREFIX (their packages, metadata, bytecode and console scripts) to DEST,
      keeping absolute paths, so `COPY --from=stage DEST/ /` puts them back where pip put them

Standard library only: it runs in the image's build stage before anything is installed.
"""

import re
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path

_EXTRAS = re.compile(r"^(?P<path>[^\[]+)(?:\[(?P<extras>[^\]]*)\])?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(specs: list[str]) -> list[str]:
    """Third-party requirements of the given pyproject files (with extras), in file order."""
    projects, wanted = set(), []
    for spec in specs:
        match = _EXTRAS.match(spec)
        if match is None:
            raise SystemExit(f"venv_layers: {spec!r} is not PYPROJECT or PYPROJECT[EXTRA,...]")
        project = tomllib.loads(Path(match["path"]).read_text())["project"]
        projects.add(_normalized(project["name"]))
        wanted += project.get("dependencies", [])
        for extra in filter(None, (match["extras"] or "").split(",")):
            wanted += project["optional-dependencies"][extra.strip()]
    return [req for req in wanted if _requirement_name(req) not in projects]


def _requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if match is None:
        raise SystemExit(f"venv_layers: cannot read a project name from requirement {requirement!r}")
    return _normalized(match[0])


def stage(prefix: str, dest: Path) -> int:
    """Copies the recorded files of the installed distributions named PREFIX*; returns their count."""
    site = Path(sysconfig.get_paths()["purelib"])
    copied = 0
    for record in sorted(site.glob(f"{prefix}*.dist-info/RECORD")):
        for line in record.read_text().splitlines():
            source = (site / line.split(",")[0]).resolve()
            if not source.is_file():
                continue  # RECORD lists bytecode pip may not have written
            target = dest / source.relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            copied += 1
    if copied == 0:
        raise SystemExit(f"venv_layers: no installed distribution named {prefix}* in {site}")
    return copied


def main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "requirements":
        print("\n".join(requirements(argv[1:])))
    elif len(argv) == 3 and argv[0] == "stage":
        print(f"venv_layers: staged {stage(argv[1], Path(argv[2]))} files under {argv[2]}", file=sys.stderr)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
