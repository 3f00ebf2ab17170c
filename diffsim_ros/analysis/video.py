"""Videos of simulated rollouts: the robot drawn from the simulator's own states.

    episodes = [Episode(q=q_steps, target=[0.3, 0.1, 0.4], caption="target (0.30, 0.10, 0.40) m")]
    out = render_episodes(model, episodes, dt=0.02, renderer="auto", width=320, height=240,
                          mujoco_scene=lambda: MujocoScene(mj_model, mj_data, set_state))
    save_video("rollout.gif", out.frames, out.fps)             # .gif (Pillow) or .mp4 (imageio-ffmpeg)

Nothing is stepped here: every frame is a recorded configuration ``q`` (simulator
convention: ``[x y z qx qy qz qw, joints...]`` for a floating base), placed by

- ``mujoco``: MuJoCo's offscreen renderer on a compiled MuJoCo model of the robot
  (the caller supplies it with a function that sets ``qpos`` from ``q``; the project
  builds it with the MuJoCo stand-in, ``plant.MujocoPlant``), with an OpenGL context
  from EGL, else OSMesa (headless). ``MUJOCO_GL`` set to ``egl`` or ``osmesa`` before
  MuJoCo was imported is honoured; unset, EGL is tried first, then OSMesa.
- ``matplotlib``: a portable drawing (Agg, no display, no OpenGL) of the model's
  collision primitives (boxes, cylinders, spheres; meshes appear as their bounding
  boxes, as the simulator sees them) placed by the simulator's forward kinematics.
- ``auto``: ``mujoco`` where an OpenGL context can be made, else ``matplotlib``.

Both draw the links as bones (body origin to body origin, body origin to each fixed
link), a grid on the ground plane, a translucent sphere at the episode's target point
(reach target, hover setpoint) and an overlay: episode, time, a caption, and the
verdict over the last frames of each episode. The camera frames everything an episode
visits (links and target) from the front right, slightly above.

This module knows the physics model only (no task, no plant): ``evaluation`` builds the
episodes and the MuJoCo scene.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["RENDERERS", "VIDEO_SUFFIXES", "VideoError", "Episode", "MujocoScene", "Rendered", "check_video_path",
           "frame_steps", "gl_backend", "render_episodes", "save_video"]

RENDERERS = ("auto", "mujoco", "matplotlib")
VIDEO_SUFFIXES = (".gif", ".mp4")

#: Camera: the direction it looks along (MuJoCo's azimuth and elevation, degrees) and its
#: vertical field of view: from the front right (+x, -y), 20 degrees above the horizon.
AZIMUTH, ELEVATION, FOVY = 120.0, -20.0, 45.0
#: matplotlib: how much of the frame the framed sphere fills (its 3-D box is drawn small by default).
ZOOM = 1.7
BACKGROUND = (0.93, 0.94, 0.96)
GROUND = (0.80, 0.82, 0.85)
GRID = (0.55, 0.58, 0.62)
TARGET = (0.15, 0.75, 0.25, 0.45)
BONE = (0.20, 0.22, 0.26)
#: Link colours, cycled over the bodies (root first).
PALETTE = ((0.93, 0.55, 0.18), (0.22, 0.47, 0.78), (0.85, 0.33, 0.30), (0.35, 0.65, 0.40),
           (0.60, 0.45, 0.75), (0.90, 0.75, 0.25))
WORLD_COLOR = (0.45, 0.47, 0.50)


class VideoError(ValueError):
    """A video that cannot be made as asked.

    An unknown file type, a missing writer, the renderer asked for not available here, or nothing
    to draw.
    """


@dataclass
class Episode:
    """One rollout to draw.

    ``q`` (T+1, nq), the configuration at every control step (simulator convention); ``target``: a
    world point (m) drawn as a sphere of ``target_radius`` (m), or None; ``caption``: a second
    overlay line; ``verdict``: shown over the last frames (e.g. "success"), green when ``ok`` else
    red; ``label``: the first overlay word (default "episode i/n").
    """

    q: np.ndarray
    target: Optional[Sequence[float]] = None
    target_radius: float = 0.02
    caption: str = ""
    verdict: str = ""
    ok: bool = True
    label: str = ""


@dataclass
class MujocoScene:
    """A compiled MuJoCo model of the robot (``mujoco.MjModel``), its ``MjData``, and ``set_q(q)``.

    ``set_q(q)`` puts the robot at ``q`` (simulator convention) and runs MuJoCo's kinematics.
    """

    model: object
    data: object
    set_q: Callable[[np.ndarray], None]


@dataclass
class Rendered:
    """Frames (each (height, width, 3) uint8), their rate and the renderer that drew them.

    The rate is in frames/s (real time); when ``auto`` fell back to matplotlib, also why (else "").
    """

    frames: List[np.ndarray]
    fps: float
    renderer: str
    fallback_reason: str = ""
    steps: List[Tuple[int, int]] = field(default_factory=list)   # (episode, control step) per frame


# ---------------------------------------------------------------------------- files
def check_video_path(path: Union[str, os.PathLike]) -> Path:
    """``path`` as a Path if its type can be written.

    The types are .gif (Pillow) or .mp4 (imageio with imageio-ffmpeg); else :class:`VideoError`
    saying what is wrong.
    """
    p = Path(os.fspath(path))
    suffix = p.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise VideoError(f"{p}: unknown video type '{p.suffix or '(none)'}' (write .gif or .mp4)")
    if suffix == ".mp4":
        import importlib

        try:
            for name in ("imageio", "imageio_ffmpeg"):
                importlib.import_module(name)
        except ImportError as exc:
            raise VideoError(f"{p}: writing .mp4 needs imageio and imageio-ffmpeg ({exc.name} is not installed: "
                             "pip install imageio imageio-ffmpeg, see requirements.txt), or write a .gif") from None
    return p


def save_video(path: Union[str, os.PathLike], frames: Sequence[np.ndarray], fps: float) -> Path:
    """Write ``frames`` (uint8 (H, W, 3)) at ``fps`` frames/s to a .gif (looping) or an .mp4 (H.264)."""
    p = check_video_path(path)
    if not frames:
        raise VideoError(f"{p}: no frames to write")
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix.lower() == ".gif":
        from PIL import Image

        images = [Image.fromarray(np.ascontiguousarray(f)) for f in frames]
        # GIF times are whole centiseconds.
        duration = max(20, int(round(100.0 / fps)) * 10)
        images[0].save(p, save_all=True, append_images=images[1:], duration=duration, loop=0)
        return p
    import imageio.v2 as imageio

    h, w = frames[0].shape[:2]
    if h % 2 or w % 2:
        raise VideoError(f"{p}: H.264 needs an even frame size, got {w}x{h}")
    with imageio.get_writer(str(p), fps=float(fps), codec="libx264", pixelformat="yuv420p", quality=7,
                            macro_block_size=2, ffmpeg_log_level="error") as writer:
        for f in frames:
            writer.append_data(np.ascontiguousarray(f))
    return p


def frame_steps(steps: int, dt: float, fps: float, max_frames: Optional[int] = None) -> Tuple[List[int], float]:
    """Control steps 0..steps-1 to draw at about ``fps`` frames/s of simulated time, and their frame rate.

    Every k-th step is drawn, the last one always included, at most ``max_frames`` of them; the
    frame rate is the one that plays them in real time (1 / (k dt)).
    """
    if steps < 1:
        return [], fps
    stride = max(1, int(round(1.0 / (fps * dt))))
    if max_frames is not None and max_frames >= 1:
        stride = max(stride, math.ceil(steps / max_frames))
    idx = list(range(0, steps, stride))
    if idx[-1] != steps - 1:
        if max_frames is not None and len(idx) >= max_frames:
            idx[-1] = steps - 1
        else:
            idx.append(steps - 1)
    return idx, 1.0 / (stride * dt)


# ---------------------------------------------------------------------------- geometry
def _box_faces(size) -> List[np.ndarray]:
    sx, sy, sz = (float(s) / 2 for s in size)
    c = np.array([[x, y, z] for x in (-sx, sx) for y in (-sy, sy) for z in (-sz, sz)])
    quads = ((0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3))
    return [c[list(f)] for f in quads]


def _cylinder_faces(radius, length, n=12) -> List[np.ndarray]:
    a = np.linspace(0, 2 * np.pi, n, endpoint=False)
    ring = np.stack((radius * np.cos(a), radius * np.sin(a), np.zeros(n)), -1)
    lo, hi = ring + [0, 0, -length / 2], ring + [0, 0, length / 2]
    faces = [np.array([lo[i], lo[(i + 1) % n], hi[(i + 1) % n], hi[i]]) for i in range(n)]
    return faces + [lo[::-1], hi]


def _sphere_faces(radius, n_lat=6, n_lon=10) -> List[np.ndarray]:
    th = np.linspace(0, np.pi, n_lat + 1)
    ph = np.linspace(0, 2 * np.pi, n_lon + 1)
    pt = lambda t, p: radius * np.array([np.sin(t) * np.cos(p), np.sin(t) * np.sin(p), np.cos(t)])  # noqa: E731
    return [np.array([pt(th[i], ph[j]), pt(th[i + 1], ph[j]), pt(th[i + 1], ph[j + 1]), pt(th[i], ph[j + 1])])
            for i in range(n_lat) for j in range(n_lon)]


class _Geometry:
    """The model's collision primitives, bones and link origins placed for a sequence of q."""

    def __init__(self, model):
        import torch

        self.model = model.to(dtype=torch.float64, device="cpu")
        m = self.model
        self.prims = []        # (body, kind, size (np), R_local, p_local, colour)
        for c in m.collisions:
            colour = WORLD_COLOR if c.body < 0 else PALETTE[c.body % len(PALETTE)]
            self.prims.append((int(c.body), c.kind, c.size.numpy().astype(np.float64), c.R.numpy(), c.p.numpy(),
                               colour))
        # Bones: parent body origin -> body origin; body origin -> each fixed link off it.
        self.bones: List[Tuple[Tuple[str, int], Tuple[str, int]]] = []
        for b, parent in enumerate(m.parent):
            if parent >= 0:
                self.bones.append((("body", parent), ("body", b)))
        link_p = m.link_p.numpy()
        for i, b in enumerate(m.link_body):
            if b >= 0 and np.linalg.norm(link_p[i]) > 1e-3:
                self.bones.append((("body", b), ("link", i)))
        self.extent = self._size()

    def place(self, q: np.ndarray):
        """Body rotations (F, nb, 3, 3), body origins (F, nb, 3) and link origins (F, nl, 3)."""
        import torch

        from .. import physics

        qt = torch.as_tensor(np.asarray(q, dtype=np.float64))
        with torch.no_grad():
            R, p = physics.body_placements(self.model, qt)
            links = physics.forward_kinematics(self.model, qt)[..., 0:3, 3]
        return R.numpy(), p.numpy(), links.numpy()

    def _size(self) -> float:
        """Return the robot's size at its neutral configuration, m (its bounding box diagonal)."""
        q = self.model.neutral_configuration((1,)).numpy()
        pts = self.points(q)
        return float(max(np.linalg.norm(pts.max(0) - pts.min(0)), 0.05))

    def primitives(self, R: np.ndarray, p: np.ndarray, moving: bool = True, fixed: bool = True):
        """(kind, size, R (3, 3), p (3,), colour) in the world of the primitives to draw.

        The primitives are those on moving bodies (placed by one frame's body rotations ``R`` and
        origins ``p``) and/or those fixed to the world.
        """
        out = []
        for body, kind, size, Rl, pl, colour in self.prims:
            if body < 0 and fixed:
                out.append((kind, size, Rl, pl, colour))
            elif body >= 0 and moving:
                out.append((kind, size, R[body] @ Rl, p[body] + R[body] @ pl, colour))
        return out

    def bone_segments(self, p: np.ndarray, links: np.ndarray) -> List[Tuple[np.ndarray, np.ndarray]]:
        pick = lambda ref: p[ref[1]] if ref[0] == "body" else links[ref[1]]  # noqa: E731
        return [(pick(a), pick(b)) for a, b in self.bones]

    def points(self, q: np.ndarray) -> np.ndarray:
        """Every drawn point (body and link origins, primitive corners) over the frames of q: (N, 3)."""
        R, p, links = self.place(q)
        pts = [p.reshape(-1, 3), links.reshape(-1, 3)]
        for f in range(p.shape[0]):
            for kind, size, Rw, pw, _ in self.primitives(R[f], p[f]):
                half = (size / 2 if kind == "box" else np.array([size[0], size[0], size[1] / 2])
                        if kind == "cylinder" else np.full(3, size[0]))
                box = np.abs(Rw) @ half               # half extents of the primitive's world bounding box
                pts += [pw + box, pw - box]
        pts = np.concatenate([x.reshape(-1, 3) for x in pts])
        return pts[np.isfinite(pts).all(1)] if len(pts) else np.zeros((1, 3))


def _framing(points: np.ndarray, min_radius: float) -> Tuple[np.ndarray, float]:
    """Centre and radius (m) of a sphere around ``points``."""
    pts = points[np.isfinite(points).all(1)]
    if not len(pts):
        return np.zeros(3), min_radius
    lo, hi = pts.min(0), pts.max(0)
    return (lo + hi) / 2, float(max(np.linalg.norm(hi - lo) / 2, min_radius))


def _grid_lines(centre: np.ndarray, radius: float, height: float) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Lines of a square grid on the ground plane z = height under ``centre``, about 6 per side."""
    step = 10 ** math.floor(math.log10(radius / 3))
    for m in (1, 2, 5, 10):
        if radius / (step * m) <= 4:
            step *= m
            break
    half = 1.6 * radius
    x0, x1 = centre[0] - half, centre[0] + half
    y0, y1 = centre[1] - half, centre[1] + half
    lines = []
    for x in np.arange(math.ceil(x0 / step) * step, x1, step):
        lines.append((np.array([x, y0, height]), np.array([x, y1, height])))
    for y in np.arange(math.ceil(y0 / step) * step, y1, step):
        lines.append((np.array([x0, y, height]), np.array([x1, y, height])))
    return lines


# ---------------------------------------------------------------------------- overlay
def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, AttributeError):      # an old Pillow or no FreeType: the bitmap font
        return ImageFont.load_default()


def _overlay(img: np.ndarray, lines: Sequence[str], verdict: str = "", ok: bool = True) -> np.ndarray:
    from PIL import Image, ImageDraw

    h = img.shape[0]
    size = max(8, int(round(h / 17)))
    font = _font(size)
    im = Image.fromarray(img)
    draw = ImageDraw.Draw(im)
    y = 2
    for text in lines:
        if text:
            draw.text((4, y), text, fill=(20, 22, 26), font=font, stroke_width=0)
            y += size + 2
    if verdict:
        colour = (20, 140, 50) if ok else (200, 40, 30)
        draw.text((4, h - size - 4), verdict, fill=colour, font=font)
    return np.asarray(im).copy()


# ---------------------------------------------------------------------------- OpenGL
def gl_backend():
    """(name, GLContext class) for MuJoCo's offscreen rendering without a display.

    The backend is the one MuJoCo chose from ``MUJOCO_GL`` when that names egl or osmesa, else EGL,
    else OSMesa. Raises :class:`VideoError` saying why neither loads.
    """
    import importlib

    if "mujoco" not in sys.modules and not os.environ.get("MUJOCO_GL"):
        # MuJoCo picks its GL backend when first imported; a headless default.
        import ctypes.util

        for name, lib in (("egl", "EGL"), ("osmesa", "OSMesa")):
            if ctypes.util.find_library(lib):
                os.environ["MUJOCO_GL"] = name
                break
    importlib.import_module("mujoco")
    from mujoco.rendering.classic import gl_context

    chosen = str(getattr(gl_context, "_MUJOCO_GL", "")).lower()
    if chosen in ("egl", "osmesa", "glfw", "glx") and getattr(gl_context, "GLContext", None) is not None:
        if chosen in ("egl", "osmesa") or os.environ.get("DISPLAY"):
            return chosen, gl_context.GLContext
    errors = []
    platform = os.environ.get("PYOPENGL_PLATFORM", "").lower()
    for name in ("egl", "osmesa"):
        if platform and platform != name:
            errors.append(f"{name}: PyOpenGL is already set to '{platform}'")
            continue
        try:
            return name, importlib.import_module(f"mujoco.{name}").GLContext
        except Exception as exc:  # noqa: BLE001 - any loader failure means: not this backend
            errors.append(f"{name}: {exc}")
    raise VideoError("no OpenGL context for MuJoCo's offscreen renderer (" + "; ".join(errors) + ")")


class _MujocoDrawer:
    """MuJoCo's offscreen renderer on a :class:`MujocoScene`, plus bones, grid and target."""

    def __init__(self, scene: MujocoScene, width: int, height: int, body_names: Sequence[str] = ()):
        import mujoco

        self.mj = mujoco
        self.scene = scene
        name, context_cls = gl_backend()
        self.backend = name
        m = scene.model
        m.vis.global_.offwidth = max(int(m.vis.global_.offwidth), width)
        m.vis.global_.offheight = max(int(m.vis.global_.offheight), height)
        m.vis.global_.fovy = FOVY
        m.vis.headlight.ambient[:] = (0.55, 0.55, 0.55)
        m.vis.headlight.diffuse[:] = (0.5, 0.5, 0.5)
        m.vis.headlight.specular[:] = (0.1, 0.1, 0.1)
        m.vis.rgba.haze[:] = (*BACKGROUND, 1.0)
        # The colours of the matplotlib drawing: by the physics model's body, found by name.
        bodies = {name: i for i, name in enumerate(body_names)}
        for g in range(m.ngeom):
            if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_PLANE:
                m.geom_rgba[g] = (1.0, 1.0, 1.0, 1.0)      # lit from the camera at a grazing angle: keep it light
            else:
                b = bodies.get(m.body(int(m.geom_bodyid[g])).name)
                m.geom_rgba[g] = (*(WORLD_COLOR if b is None else PALETTE[b % len(PALETTE)]), 1.0)
        self.width, self.height = width, height
        self.ctx = None
        self.con = None
        self.ctx = context_cls(width, height)
        self.ctx.make_current()
        self.con = mujoco.MjrContext(m, mujoco.mjtFontScale.mjFONTSCALE_100)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.con)
        self.scn = mujoco.MjvScene(m, maxgeom=m.ngeom + 400)
        self.opt = mujoco.MjvOption()
        self.pert = mujoco.MjvPerturb()
        self.cam = mujoco.MjvCamera()
        self.cam.type = mujoco.mjtCamera.mjCAMERA_FREE
        self.rect = mujoco.MjrRect(0, 0, width, height)
        self.rgb = np.zeros((height, width, 3), dtype=np.uint8)
        self.depth = np.zeros((height, width), dtype=np.float32)
        self.background = np.array([round(255 * c) for c in BACKGROUND], dtype=np.uint8)

    def _geom(self):
        if self.scn.ngeom >= self.scn.maxgeom:
            return None
        g = self.scn.geoms[self.scn.ngeom]
        self.scn.ngeom += 1
        return g

    def _connector(self, a, b, width, rgba, kind=None):
        mj = self.mj
        g = self._geom()
        if g is None:
            return
        kind = mj.mjtGeom.mjGEOM_CAPSULE if kind is None else kind
        mj.mjv_initGeom(g, kind, np.zeros(3), np.zeros(3), np.eye(3).ravel(), np.asarray(rgba, dtype=np.float32))
        mj.mjv_connector(g, kind, width, np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))

    def _primitive(self, kind, size, R, p, colour, alpha=1.0):
        mj = self.mj
        g = self._geom()
        if g is None:
            return
        t = {"box": mj.mjtGeom.mjGEOM_BOX, "cylinder": mj.mjtGeom.mjGEOM_CYLINDER,
             "sphere": mj.mjtGeom.mjGEOM_SPHERE}[kind]
        s = (size / 2 if kind == "box" else np.array([size[0], size[1] / 2, 0.0]) if kind == "cylinder"
             else np.array([size[0], 0.0, 0.0]))
        mj.mjv_initGeom(g, t, np.asarray(s, dtype=np.float64), np.asarray(p, dtype=np.float64),
                        np.asarray(R, dtype=np.float64).ravel(), np.array([*colour[:3], alpha], dtype=np.float32))

    def draw(self, q, view) -> np.ndarray:
        mj = self.mj
        self.scene.set_q(np.asarray(q, dtype=np.float64))
        self.cam.lookat[:] = view.centre
        self.cam.distance = view.distance
        self.cam.azimuth, self.cam.elevation = AZIMUTH, ELEVATION
        mj.mjv_updateScene(self.scene.model, self.scene.data, self.opt, self.pert, self.cam,
                           mj.mjtCatBit.mjCAT_ALL, self.scn)
        for a, b in view.grid:
            self._connector(a, b, 1.0, (*GRID, 1.0), kind=mj.mjtGeom.mjGEOM_LINE)
        for kind, size, R, p, colour in view.static:
            self._primitive(kind, size, R, p, colour)
        for a, b in view.bones:
            self._connector(a, b, view.bone_radius, (*BONE, 1.0))
        if view.target is not None:
            self._primitive("sphere", np.array([view.target_radius]), np.eye(3), view.target, TARGET[:3], TARGET[3])
        mj.mjr_render(self.rect, self.scn, self.con)
        mj.mjr_readPixels(self.rgb, self.depth, self.rect, self.con)
        img = self.rgb.copy()
        img[self.depth >= 1.0 - 1e-6] = self.background       # nothing drawn there (no skybox): the backdrop
        return np.flipud(img).copy()

    def close(self):
        try:
            if self.con is not None:
                self.con.free()
            if self.ctx is not None:
                self.ctx.free()
        except Exception:  # noqa: BLE001 - releasing a context at the end is best effort
            pass
        self.con = self.ctx = None


class _MatplotlibDrawer:
    """The collision primitives as shaded polygons in a matplotlib 3-D axes (Agg)."""

    def __init__(self, width: int, height: int):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        dpi = 100
        self.fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor=BACKGROUND)
        self.canvas = FigureCanvasAgg(self.fig)
        self.ax = self.fig.add_axes((0, 0, 1, 1), projection="3d")
        self.width, self.height = width, height
        el, az = math.radians(ELEVATION), math.radians(AZIMUTH)
        look = np.array([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)])
        self.light = -look + np.array([0.0, 0.0, 0.8])
        self.light /= np.linalg.norm(self.light)
        self.cache = {}

    def _faces(self, kind, size):
        key = (kind, tuple(np.round(size, 6)))
        if key not in self.cache:
            self.cache[key] = (_box_faces(size) if kind == "box" else
                               _cylinder_faces(size[0], size[1]) if kind == "cylinder" else _sphere_faces(size[0]))
        return self.cache[key]

    def _shade(self, faces: List[np.ndarray], colour) -> List[Tuple[float, ...]]:
        out = []
        for f in faces:
            n = np.cross(f[1] - f[0], f[2] - f[0])
            if np.linalg.norm(n) < 1e-12 and len(f) > 3:
                n = np.cross(f[2] - f[0], f[3] - f[0])
            n = n / max(np.linalg.norm(n), 1e-12)
            k = 0.5 + 0.5 * abs(float(n @ self.light))
            out.append(tuple(min(1.0, c * k) for c in colour[:3]) + (1.0,))
        return out

    def draw(self, prims, view) -> np.ndarray:
        from mpl_toolkits.mplot3d.art3d import Line3DCollection, Poly3DCollection

        ax = self.ax
        ax.cla()
        ax.set_axis_off()
        ax.set_facecolor(BACKGROUND)
        c, r = view.centre, view.radius
        ax.set_xlim(c[0] - r, c[0] + r)
        ax.set_ylim(c[1] - r, c[1] + r)
        ax.set_zlim(c[2] - r, c[2] + r)
        ax.set_box_aspect((1, 1, 1), zoom=ZOOM)
        ax.set_proj_type("persp", focal_length=1.0 / math.tan(math.radians(FOVY) / 2))
        # matplotlib's azimuth and elevation place the eye; MuJoCo's give the viewing direction.
        ax.view_init(elev=-ELEVATION, azim=AZIMUTH + 180.0)
        if view.grid:
            ax.add_collection3d(Line3DCollection([np.array(seg) for seg in view.grid], colors=[GRID],
                                                 linewidths=0.5))
        faces, colours = [], []
        for kind, size, R, p, colour in list(prims) + list(view.static):
            local = self._faces(kind, size)
            world = [f @ R.T + p for f in local]
            faces += world
            colours += self._shade(world, colour)
        if view.target is not None:
            world = [f + np.asarray(view.target) for f in _sphere_faces(view.target_radius, 5, 8)]
            faces += world
            colours += [TARGET] * len(world)
        if faces:
            ax.add_collection3d(Poly3DCollection(faces, facecolors=colours, edgecolors=(0.2, 0.2, 0.2, 0.35),
                                                 linewidths=0.2))
        if view.bones:
            ax.add_collection3d(Line3DCollection([np.array(seg) for seg in view.bones], colors=[BONE],
                                                 linewidths=max(1.0, self.height / 120)))
        self.canvas.draw()
        return np.asarray(self.canvas.buffer_rgba())[..., :3].copy()

    def close(self):
        self.fig.clear()


@dataclass
class _View:
    centre: np.ndarray
    radius: float
    distance: float
    grid: list
    static: list
    bones: list = field(default_factory=list)
    bone_radius: float = 0.005
    target: Optional[np.ndarray] = None
    target_radius: float = 0.02


# ---------------------------------------------------------------------------- render
def render_episodes(model, episodes: Sequence[Episode], dt: float, renderer: str = "auto", width: int = 320,
                    height: int = 240, fps: float = 25.0, max_frames: Optional[int] = None,
                    mujoco_scene: Optional[Callable[[], MujocoScene]] = None, ground_height: Optional[float] = 0.0,
                    overlay: bool = True) -> Rendered:
    """Draw ``episodes`` of the robot ``model`` (a physics Model).

    dt: s between recorded configurations (the control step). renderer: ``auto`` | ``mujoco`` |
    ``matplotlib`` (see the module doc); ``mujoco`` needs ``mujoco_scene``, a function building the
    :class:`MujocoScene` (called once, only when MuJoCo draws). width, height: pixels (default
    320 x 240). fps: frames per second of simulated time wanted (default 25; the result plays in
    real time at 1 / (k dt) for the k-th step drawn). max_frames: at most this many frames in all
    (split between the episodes; default no limit). ground_height: m, height of the ground grid
    (None: no grid). overlay: episode, time, caption and verdict text. A non-finite configuration
    repeats the last drawable frame with the note "non-finite state".
    """
    if renderer not in RENDERERS:
        raise VideoError(f"unknown renderer '{renderer}' (one of {', '.join(RENDERERS)})")
    if not episodes:
        raise VideoError("no episodes to draw")
    if width < 16 or height < 16:
        raise VideoError(f"a frame of {width}x{height} pixels is too small (at least 16x16)")
    geo = _Geometry(model)
    per_episode = None if max_frames is None else max(1, max_frames // len(episodes))
    drawer, reason, used = None, "", "matplotlib"
    if renderer in ("auto", "mujoco"):
        try:
            if mujoco_scene is None:
                raise VideoError("no MuJoCo model of the robot was given")
            drawer = _MujocoDrawer(mujoco_scene(), width, height, model.body_names)
            used = "mujoco"
        except Exception as exc:  # noqa: BLE001 - auto falls back; an explicit request reports why
            if drawer is not None:
                drawer.close()
            drawer = None
            if renderer == "mujoco":
                raise VideoError(f"the MuJoCo renderer is not available here: {exc}") from None
            reason = f"{type(exc).__name__}: {exc}"
    if drawer is None:
        drawer = _MatplotlibDrawer(width, height)
    frames: List[np.ndarray] = []
    where: List[Tuple[int, int]] = []
    rate = fps
    try:
        for e, ep in enumerate(episodes):
            q = np.asarray(ep.q, dtype=np.float64)
            if q.ndim != 2 or q.shape[1] != model.nq:
                raise VideoError(f"episode {e + 1}: q must be (steps, {model.nq}), got {tuple(q.shape)}")
            idx, rate = frame_steps(q.shape[0], dt, fps, per_episode)
            finite = np.isfinite(q).all(1)
            shown = q[idx][finite[idx]]
            R, p, links = geo.place(shown) if len(shown) else (None, None, None)
            pts = geo.points(shown) if len(shown) else np.zeros((1, 3))
            target = None if ep.target is None else np.asarray(ep.target, dtype=np.float64).reshape(3)
            if target is not None:
                pts = np.concatenate((pts, target[None] + ep.target_radius, target[None] - ep.target_radius))
            centre, radius = _framing(pts, 0.6 * geo.extent)
            radius *= 1.08
            view = _View(centre=centre, radius=radius, distance=0.9 * radius / math.sin(math.radians(FOVY) / 2),
                         grid=(_grid_lines(centre, radius, ground_height) if ground_height is not None else []),
                         static=geo.primitives(None, None, moving=False), bone_radius=0.012 * geo.extent,
                         target=target, target_radius=float(ep.target_radius))
            last = None
            j = 0
            label = ep.label or f"episode {e + 1}/{len(episodes)}"
            for n, step in enumerate(idx):
                note = ""
                if finite[step]:
                    Rf, pf, lf = R[j], p[j], links[j]
                    j += 1
                    view.bones = geo.bone_segments(pf, lf)
                    if used == "mujoco":
                        img = drawer.draw(q[step], view)
                    else:
                        img = drawer.draw(geo.primitives(Rf, pf, fixed=False), view)
                    last = img
                else:
                    img = last if last is not None else np.full((height, width, 3), 255, dtype=np.uint8)
                    note = "non-finite state"
                if overlay:
                    late = n >= 0.7 * (len(idx) - 1)
                    img = _overlay(img, [f"{label}  t {step * dt:.2f} s", ep.caption, note],
                                   ep.verdict if late else "", ep.ok)
                frames.append(img)
                where.append((e, step))
    finally:
        drawer.close()
    return Rendered(frames=frames, fps=rate, renderer=used, fallback_reason=reason, steps=where)
