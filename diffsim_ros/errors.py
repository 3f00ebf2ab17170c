"""Errors that more than one layer raises alike (a leaf module: it imports nothing of the package)."""
from __future__ import annotations

__all__ = ["SetupError"]


class SetupError(ValueError):
    """A node parameter the node cannot start with; the text names it.

    The ROS-free start-up checks of policy_controller (control/controller_settings.py) and of the MuJoCo
    stand-in (plant/plant_settings.py) raise it; the node turns it into its StartupError (the message
    printed, exit status 2).
    """
