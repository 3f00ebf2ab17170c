"""Where example-robot-data's robots are installed (the pip wheel, a ROS install, robotpkg).

Light on purpose (no torch): the command line's demo and the tests look robots up with it.
"""
from __future__ import annotations

import os
import sys
from typing import List

EXAMPLE_ROBOT_DATA_ROBOTS = os.path.join("share", "example-robot-data", "robots")


def example_robot_data_dirs() -> List[str]:
    """Directories that may hold example-robot-data's ``robots/`` folder, best first.

    The PyPI wheel installs it under ``<site-packages>/cmeel.prefix/share/...``
    (and puts ``cmeel.prefix/lib/python3.X/site-packages`` on sys.path); a ROS
    install puts it under ``<prefix>/share/example-robot-data/robots``.
    """
    found: List[str] = []

    def add(path: str) -> None:
        path = os.path.normpath(path)
        if os.path.isdir(path) and path not in found:
            found.append(path)

    env = os.environ.get("EXAMPLE_ROBOT_DATA_MODEL_DIR")
    if env:
        add(env)
    for entry in sys.path:
        if not entry:
            continue
        marker = "cmeel.prefix"
        if marker in entry:
            prefix = entry[: entry.index(marker) + len(marker)]
        else:
            prefix = os.path.join(entry, marker)
        add(os.path.join(prefix, EXAMPLE_ROBOT_DATA_ROBOTS))
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if prefix:
            add(os.path.join(prefix, EXAMPLE_ROBOT_DATA_ROBOTS))
    add(os.path.join("/opt/openrobots", EXAMPLE_ROBOT_DATA_ROBOTS))
    return found
