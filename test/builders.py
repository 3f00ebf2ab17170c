"""URDF text of the simple bodies several test files drop on the ground (one definition each)."""
from __future__ import annotations


def box_urdf(mass: float, size) -> str:
    """A free box of ``mass`` kg and edge lengths ``size`` (x, y, z) m: its inertia about the centre,
    its collision box."""
    sx, sy, sz = size
    return f"""<robot name="box"><link name="box">
  <inertial><mass value="{mass}"/><inertia ixx="{mass * (sy**2 + sz**2) / 12}" iyy="{mass * (sx**2 + sz**2) / 12}"
     izz="{mass * (sx**2 + sy**2) / 12}" ixy="0" ixz="0" iyz="0"/></inertial>
  <collision><geometry><box size="{sx} {sy} {sz}"/></geometry></collision>
</link></robot>"""


def ball_urdf(mass: float, radius: float) -> str:
    """A free solid ball of ``mass`` kg and ``radius`` m."""
    i = 0.4 * mass * radius ** 2
    return f"""<robot name="ball"><link name="ball">
  <inertial><mass value="{mass}"/><inertia ixx="{i}" iyy="{i}" izz="{i}" ixy="0" ixz="0" iyz="0"/></inertial>
  <collision><geometry><sphere radius="{radius}"/></geometry></collision>
</link></robot>"""
