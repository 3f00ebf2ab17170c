"""Register this source tree in a venv's ament index, the layout colcon's install gives.

    python scripts/ament_register.py VENV

Makes, under the prefix VENV (what AMENT_PREFIX_PATH must then name):

    share/ament_index/resource_index/packages/diffsim_ros   the package's marker
    share/diffsim_ros/{package.xml, launch/, config/, urdf/, doc/, policies/<name>/}
    lib/diffsim_ros/<console script>                         what `ros2 run` and launch_ros look up

with exactly the files setup.py's ``data_files`` and ``console_scripts`` name (setup.py is read,
not duplicated). Folders are real; each file is a symbolic link to the source tree (``ros2 launch``
walks share/ with os.walk, which does not descend into linked folders), so an edit of a launch,
config or URDF file reaches the share folder at once; a file added or removed is picked up by the
next run. Each console script links to VENV/bin/<name> (the editable install's wrapper), so
``ros2 run diffsim_ros policy_controller`` and ``.venv/bin/policy_controller`` are one program.
Links that point into this tree but are no longer named are removed. Idempotent and cheap (stdlib
only, no import of the package): a run with nothing to change changes nothing and prints nothing.
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Dict, List, Tuple

PACKAGE = "diffsim_ros"


def setup_arguments(root: Path) -> dict:
    """Return the keyword arguments setup.py passes to setuptools.setup (run with setup() captured)."""
    import setuptools

    captured: dict = {}
    real = setuptools.setup
    setuptools.setup = lambda **kw: captured.update(kw)
    cwd = os.getcwd()
    try:
        os.chdir(root)
        runpy.run_path(str(root / "setup.py"), run_name="__main__")
    finally:
        os.chdir(cwd)
        setuptools.setup = real
    if "data_files" not in captured or "entry_points" not in captured:
        raise SystemExit(f"[ament_register] {root / 'setup.py'}: setup() got no data_files or entry_points")
    return captured


def wanted_links(root: Path, prefix: Path) -> Dict[Path, Path]:
    """Link path under prefix -> the file it points to."""
    args = setup_arguments(root)
    links: Dict[Path, Path] = {}
    for dest, files in args["data_files"]:
        for f in files:
            src = (root / f).resolve()
            if not src.is_file():
                raise SystemExit(f"[ament_register] setup.py data_files names {f}, which is not a file in {root}")
            links[prefix / dest / src.name] = src
    scripts = [s.split("=")[0].strip() for s in args["entry_points"].get("console_scripts", [])]
    for name in scripts:
        exe = prefix / "bin" / name
        if not exe.is_file():
            raise SystemExit(f"[ament_register] console script {exe} is missing: install the package into "
                             f"{prefix} first (pip install -e {root})")
        links[prefix / "lib" / PACKAGE / name] = exe
    return links


def sync(root: Path, prefix: Path) -> List[Tuple[str, Path]]:
    """Make the links; returns what changed as (verb, path)."""
    links = wanted_links(root, prefix)
    changed: List[Tuple[str, Path]] = []
    for link, target in sorted(links.items()):
        if link.is_symlink() and os.readlink(link) == str(target):
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()                      # a stale link or an earlier copy of the same file
        link.symlink_to(target)
        changed.append(("linked", link))
    # Stale links: in the package's own folders, links into this tree (or dangling) not named any more.
    own = [prefix / "share" / PACKAGE, prefix / "lib" / PACKAGE, prefix / "share" / "ament_index"]
    for top in own:
        if not top.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                p = Path(dirpath) / name
                if not p.is_symlink() or p in links:
                    continue
                target = Path(os.readlink(p))
                if not p.exists() or root in target.parents or target.parent == prefix / "bin":
                    if top.name == "ament_index" and name != PACKAGE:
                        continue               # other packages' markers are not ours
                    p.unlink()
                    changed.append(("removed", p))
    return changed


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    prefix = Path(argv[1]).resolve()
    if not (prefix / "bin").is_dir():
        print(f"[ament_register] {prefix} is not a prefix (no bin/ folder)", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent.parent
    changed = sync(root, prefix)
    if changed:
        print(f"[ament_register] {PACKAGE} in the ament index of {prefix}: {len(changed)} link(s) updated",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
