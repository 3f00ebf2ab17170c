"""Rollout videos (diffsim_ros.analysis.video, ``eval --video``, train's rollout.gif).

Every file is read back with an independent reader (Pillow for GIF, imageio-ffmpeg for MP4):
frame count and size as planned, frames that show something, that change when the robot
moves and do not when it stands still, and the two renderers agree on where the robot is.
The MuJoCo renderer is tested where an OpenGL context (EGL or OSMesa) can be made here.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from diffsim_ros import config
from diffsim_ros.workflows import evaluation
from diffsim_ros.analysis import video
from diffsim_ros.cli import main

REPO = Path(__file__).resolve().parents[2]
BACKGROUND = np.array([round(255 * c) for c in video.BACKGROUND])


def gif_frames(path: Path):
    im = Image.open(path)
    out = []
    for i in range(im.n_frames):
        im.seek(i)
        out.append(np.asarray(im.convert("RGB")))
    return out


def drawn(img: np.ndarray) -> np.ndarray:
    """Mask of the pixels that are neither backdrop nor ground-grid grey."""
    diff = np.abs(img.astype(int) - BACKGROUND).max(-1)
    grey = (np.ptp(img.astype(int), axis=-1) < 12)        # backdrop, ground, grid and shadows are grey
    return (diff > 40) & ~grey


def mujoco_works() -> bool:
    try:
        video.gl_backend()
        return True
    except video.VideoError:
        return False


@pytest.fixture(scope="module")
def arm():
    """Record the project arm's two episodes: one moving, one at rest.

    Returns the project arm, its MuJoCo parameters, and the two recorded episodes.
    """
    params = config.load_yaml(REPO / "config" / "reach_arm.yaml")
    params["task"]["horizon"] = 20
    task, model = config.build_task(params, "reach_arm.yaml")
    n = task.action_dim
    moving = evaluation.rollout(task, lambda o: torch.ones(o.shape[0], n, dtype=o.dtype), 1, seed=1)
    q_rest = moving.q[0, 0].numpy()
    rest = np.repeat(q_rest[None], moving.q.shape[0], 0)
    return task, params, moving.q[:, 0].numpy(), rest


def scene_of(params):
    return lambda: evaluation.mujoco_scene(params, "reach_arm.yaml")


def test_frame_steps_plays_in_real_time():
    idx, fps = video.frame_steps(101, 0.02, 25.0)
    assert idx == list(range(0, 101, 2)) and fps == pytest.approx(25.0)
    idx, fps = video.frame_steps(101, 0.02, 25.0, max_frames=40)
    assert len(idx) <= 40 and idx[0] == 0 and idx[-1] == 100 and fps == pytest.approx(1 / 0.06)
    idx, fps = video.frame_steps(9, 0.01, 25.0)
    assert idx == [0, 4, 8] and fps == pytest.approx(25.0)


@pytest.mark.parametrize("renderer", ["matplotlib", "mujoco"])
def test_frames_show_the_robot_and_change_only_when_it_moves(arm, renderer):
    if renderer == "mujoco" and not mujoco_works():
        pytest.skip("no OpenGL context (EGL or OSMesa) for MuJoCo's offscreen renderer on this machine")
    task, params, q_move, q_rest = arm
    eps = [video.Episode(q=q_move), video.Episode(q=q_rest)]
    out = video.render_episodes(task.model, eps, task.dt, renderer=renderer, width=160, height=120,
                                mujoco_scene=scene_of(params), overlay=False)
    assert out.renderer == renderer and out.fallback_reason == ""
    idx, _ = video.frame_steps(q_move.shape[0], task.dt, 25.0)
    assert len(out.frames) == 2 * len(idx)
    moving, resting = out.frames[:len(idx)], out.frames[len(idx):]
    for f in out.frames:
        assert f.shape == (120, 160, 3) and f.dtype == np.uint8
        assert drawn(f).mean() > 0.02                          # the robot covers a fair part of the frame
    assert all(np.array_equal(resting[0], f) for f in resting[1:])
    changed = [np.abs(a.astype(int) - b.astype(int)).max(-1).astype(bool).mean() for a, b in zip(moving, moving[1:])]
    assert min(changed[:3]) > 0.002                            # it moves between the first frames
    assert np.abs(moving[-1].astype(int) - moving[0].astype(int)).max(-1).astype(bool).mean() > 0.01


def test_the_two_renderers_put_the_robot_in_the_same_place(arm):
    if not mujoco_works():
        pytest.skip("no OpenGL context (EGL or OSMesa) for MuJoCo's offscreen renderer on this machine")
    task, params, q_move, _ = arm
    ep = [video.Episode(q=q_move[[0, -1]])]
    centres = {}
    for renderer in ("mujoco", "matplotlib"):
        out = video.render_episodes(task.model, ep, task.dt, renderer=renderer, width=160, height=120,
                                    mujoco_scene=scene_of(params), overlay=False, ground_height=None)
        for k, f in enumerate(out.frames):
            ys, xs = np.nonzero(drawn(f))
            centres[renderer, k] = np.array([xs.mean(), ys.mean()])
    for k in (0, 1):
        assert np.linalg.norm(centres["mujoco", k] - centres["matplotlib", k]) < 0.08 * 160, centres
    # ... and both see it move the same way.
    shift = {r: centres[r, 1] - centres[r, 0] for r in ("mujoco", "matplotlib")}
    assert np.linalg.norm(shift["mujoco"] - shift["matplotlib"]) < 0.06 * 160, shift


def test_gif_and_mp4_read_back(arm, tmp_path):
    task, params, q_move, _ = arm
    out = video.render_episodes(task.model, [video.Episode(q=q_move, target=[0.3, 0.0, 0.3], caption="target")],
                                task.dt, renderer="matplotlib", width=160, height=120)
    gif = video.save_video(tmp_path / "a.gif", out.frames, out.fps)
    frames = gif_frames(gif)
    assert len(frames) == len(out.frames) and frames[0].shape == (120, 160, 3)
    assert Image.open(gif).info["duration"] == 40                       # 25 frames/s
    assert not np.array_equal(frames[0], frames[-1])
    imageio = pytest.importorskip("imageio.v2")
    mp4 = video.save_video(tmp_path / "a.mp4", out.frames, out.fps)
    reader = imageio.get_reader(str(mp4))
    back = [f for f in reader]
    assert reader.get_meta_data()["fps"] == pytest.approx(out.fps)
    reader.close()
    assert len(back) == len(out.frames) and back[0].shape == (120, 160, 3)
    # Lossy, but the same pictures: every frame closest to its own original.
    for i in (0, len(back) - 1):
        errs = [np.abs(back[i].astype(int) - f.astype(int)).mean() for f in out.frames]
        assert int(np.argmin(errs)) == i and errs[i] < 8


def test_bad_requests_are_video_errors(arm, tmp_path):
    task, params, q_move, _ = arm
    for name in ("v.avi", "v", "v.gif.txt"):
        with pytest.raises(video.VideoError, match="unknown video type"):
            video.check_video_path(tmp_path / name)
    with pytest.raises(video.VideoError, match="MuJoCo renderer is not available"):
        video.render_episodes(task.model, [video.Episode(q=q_move)], task.dt, renderer="mujoco", mujoco_scene=None)
    with pytest.raises(video.VideoError, match="unknown renderer"):
        video.render_episodes(task.model, [video.Episode(q=q_move)], task.dt, renderer="opengl")
    with pytest.raises(video.VideoError, match="q must be"):
        video.render_episodes(task.model, [video.Episode(q=q_move[:, :2])], task.dt, renderer="matplotlib")
    out = video.render_episodes(task.model, [video.Episode(q=q_move)], task.dt, renderer="auto", mujoco_scene=None,
                                width=64, height=48)
    assert out.renderer == "matplotlib" and "no MuJoCo model" in out.fallback_reason


def test_a_non_finite_state_keeps_the_last_frame(arm):
    task, _, q_move, _ = arm
    q = q_move.copy()
    q[10:] = np.nan
    out = video.render_episodes(task.model, [video.Episode(q=q)], task.dt, renderer="matplotlib", width=80,
                                height=60, overlay=False)
    idx, _ = video.frame_steps(q.shape[0], task.dt, 25.0)
    assert len(out.frames) == len(idx)
    last_good = max(k for k, s in enumerate(idx) if s < 10)
    assert all(np.array_equal(out.frames[last_good], f) for f in out.frames[last_good + 1:])


def test_cli_eval_writes_a_video_of_the_first_episodes(tmp_path, capsys):
    path = tmp_path / "hover.gif"
    rc = main(["eval", str(REPO / "policies" / "hover"), "--episodes", "4", "--video", str(path), "--video-episodes",
               "2", "--size", "96x72", "--renderer", "matplotlib", "--json", str(tmp_path / "e.json")])
    text = capsys.readouterr().out
    assert rc == 0, text
    frames = gif_frames(path)
    idx, _ = video.frame_steps(101, 0.02, 25.0)
    assert len(frames) == 2 * len(idx) and frames[0].shape == (72, 96, 3)
    assert "renderer matplotlib" in text and str(path) in text
    import json

    v = json.loads((tmp_path / "e.json").read_text())["video"]
    assert v["frames"] == len(frames) and v["episodes"] == [1, 2] and v["renderer"] == "matplotlib"


def small_training(tmp_path):
    params = config.load_yaml(REPO / "config" / "reach_arm.yaml")
    params["task"]["horizon"] = 8
    params["training"].update(iterations=1, num_envs=2, eval_envs=2, window=4, stop_at_success=False)
    return params


def test_train_writes_a_small_rollout_video(tmp_path, monkeypatch, capsys):
    from diffsim_ros.workflows.training import train_from_params

    monkeypatch.delenv("DIFFSIM_NO_VIDEO", raising=False)
    params = small_training(tmp_path)
    _, _, files = train_from_params(params, "reach_arm.yaml", tmp_path / "run")
    path = tmp_path / "run" / "rollout.gif"
    assert files["video"] == path and path.is_file()
    frames = gif_frames(path)
    idx, _ = video.frame_steps(9, 0.02, 25.0, max_frames=40)
    assert len(frames) == len(idx) and frames[0].shape == (120, 160, 3)
    assert min(drawn(f).mean() for f in frames) > 0.01

    monkeypatch.setenv("DIFFSIM_NO_VIDEO", "1")
    _, _, files = train_from_params(params, "reach_arm.yaml", tmp_path / "quiet")
    assert "video" not in files and not (tmp_path / "quiet" / "rollout.gif").exists()
    assert (tmp_path / "quiet" / "policy.pt").is_file()


def test_a_failing_video_is_a_warning_not_a_failed_training(tmp_path, monkeypatch, capsys):
    from diffsim_ros.workflows.training import train_from_params

    monkeypatch.delenv("DIFFSIM_NO_VIDEO", raising=False)

    def broken(*args, **kwargs):
        raise RuntimeError("no pixels today")
    monkeypatch.setattr(evaluation, "training_video", broken)
    _, result, files = train_from_params(small_training(tmp_path), "reach_arm.yaml", tmp_path / "run")
    err = capsys.readouterr().err
    assert "warning: no rollout video" in err and "no pixels today" in err
    assert files["policy"].is_file() and "video" not in files
