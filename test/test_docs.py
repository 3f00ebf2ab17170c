"""The documentation's links and names hold (issue 42 item 5).

Every relative link (markdown link or image) in README.md, doc/*.md, launch/README.md and
policies/README.md resolves to a file of the repository, and a ``#anchor`` on a markdown page to
one of that page's headings (GitHub's slugs). In their code (fenced blocks and inline code),
every ``diffsim-ros COMMAND`` (and ``-m diffsim_ros.cli COMMAND``) is a command of the CLI's
parser, every ``ros2 run diffsim_ros NAME`` and ``.venv/bin/NAME`` a console script of setup.py
(or an executable of the environment: python, tensorboard, torchrun), every ``ros2 launch
diffsim_ros FILE`` a file of launch/, every ``python -m MODULE`` of the package a module, and
every repository path they show (bench/, scripts/, test/, config/, policies/, urdf/, launch/,
doc/, diffsim_ros/) exists, a ``test/FILE.py::name`` with its test.
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from typing import Optional

import pytest

from conftest import REPO_ROOT

PAGES = sorted([REPO_ROOT / "README.md", REPO_ROOT / "launch" / "README.md", REPO_ROOT / "policies" / "README.md",
                *(REPO_ROOT / "doc").glob("*.md")])
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
#: Executables of the environment (not of this package) the pages run from .venv/bin.
ENVIRONMENT_EXECUTABLES = {"python", "python3", "pip", "tensorboard", "torchrun", "ros2"}
#: Repository folders whose paths, named in code, must exist.
PATH_PREFIXES = ("bench/", "scripts/", "test/", "config/", "policies/", "urdf/", "launch/", "doc/", "diffsim_ros/")
PATH = re.compile(r"(?<![\w./~$-])((?:%s)[\w./*<>{}$-]*)(?:::([\w:\[\]-]+))?" % "|".join(map(re.escape, PATH_PREFIXES)))


def rel(page: Path) -> str:
    return page.relative_to(REPO_ROOT).as_posix()


def paragraphs(text: str):
    """Split a page into its paragraphs outside fenced code blocks, and the fenced blocks' lines.

    Returns (first line number, text) of every paragraph outside fenced code blocks (its lines
    joined by newlines; a heading or table row is a paragraph of its own where no blank line parts
    it, which does not matter here), and the fenced blocks' lines.
    """
    paras, block, code, fenced, start = [], [], [], False, 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            line = ""
        elif fenced:
            code.append(line)
            continue
        if line.strip():
            if not block:
                start = number
            block.append(line)
        elif block:
            paras.append((start, "\n".join(block)))
            block = []
    if block:
        paras.append((start, "\n".join(block)))
    return paras, code


def split_page(text: str):
    """Split a page into (prose lines, code text).

    The lines outside fenced blocks, and every fenced block's lines plus every inline code span
    (which may run over a line break), joined by newlines.
    """
    paras, code = paragraphs(text)
    prose = [line for _, para in paras for line in para.split("\n")]
    code = code + [m.group(2) for _, para in paras for m in INLINE_CODE.finditer(para)]
    return prose, "\n".join(code)


def links(text: str):
    """(line number, target) of every markdown link and image outside code."""
    found = []
    for start, para in paragraphs(text)[0]:
        para = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), para)    # keeps the offsets
        found.extend((start + para[:m.start()].count("\n"), m.group(1)) for m in LINK.finditer(para))
    return found


def slug(heading: str) -> str:
    """Return GitHub's anchor of a heading.

    Links reduced to their text, lower case, everything but letters, digits, '_', '-' and spaces
    dropped, spaces to hyphens.
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set:
    """Return the anchors of a page's headings (a repeated heading's get -1, -2, ... as on GitHub)."""
    prose, _ = split_page(text)
    seen, out = {}, set()
    for line in prose:
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path, text: Optional[str] = None) -> list:
    """'PAGE:LINE: TARGET (why)' for every relative link of ``page`` (its ``text``) that does not resolve."""
    text = page.read_text() if text is None else text
    bad = []
    for number, target in links(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):      # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = f"{rel(page)}:{number}: {target}"
        dest = (page.parent / path).resolve() if path else page
        try:
            dest.relative_to(REPO_ROOT)
        except ValueError:
            bad.append(f"{where} (outside the repository)")
            continue
        if dest != page and not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(text if dest == page else dest.read_text()):
            bad.append(f"{where} (no heading '#{anchor}' in {rel(dest)})")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    assert not broken_links(page)


def test_a_broken_link_is_caught():
    """A broken link is caught.

    The check itself: a missing file, a missing heading and a path out of the repository
    fail; links in code do not count.
    """
    text = ("# Probe\n\n[ok](architecture.md#layers) [self](#probe) ![a](../policies/hover/learning_curve.png)\n"
            "[gone](no_such_page.md) [anchor](architecture.md#no-such-heading) [out](../../outside.md)\n"
            "`[not a link](nowhere.md)`\n```\n[in code](nowhere.md)\n```\n")
    bad = broken_links(REPO_ROOT / "doc" / "_probe_.md", text)
    assert [b.split(": ", 1)[1] for b in bad] == [
        "no_such_page.md (no such file)",
        "architecture.md#no-such-heading (no heading '#no-such-heading' in doc/architecture.md)",
        "../../outside.md (outside the repository)"], bad


def test_slugs_follow_github():
    assert slug("Excitation mode (`mode: excite`)") == "excitation-mode-mode-excite"
    assert slug("Replay (published by `replay`, read from a bag)") == "replay-published-by-replay-read-from-a-bag"
    assert slug("Sample efficiency: gradients through the simulator against PPO") == \
        "sample-efficiency-gradients-through-the-simulator-against-ppo"


# ------------------------------------------------------------------------------------ names in code

def cli_commands() -> dict:
    """{command: {subcommand: {}}} of diffsim-ros's parser."""
    from diffsim_ros.cli import build_parser

    def walk(parser: argparse.ArgumentParser) -> dict:
        out = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out[name] = walk(sub)
        return out

    return walk(build_parser())


def console_scripts() -> dict:
    """{name: 'module:function'} of setup.py's console_scripts."""
    text = (REPO_ROOT / "setup.py").read_text()
    return dict(re.findall(r"[\"']([\w-]+)\s*=\s*(diffsim_ros[\w.]*:\w+)[\"']", text))


def test_console_scripts_point_at_functions():
    scripts = console_scripts()
    assert {"diffsim-ros", "policy_controller", "mujoco_plant", "trajectory_recorder", "train_node",
            "replay"} <= set(scripts)
    for name, target in scripts.items():
        module, function = target.split(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, (name, module)
        assert re.search(rf"^def {function}\(", Path(spec.origin).read_text(), re.M), (name, target)


def named_commands(code: str):
    """[(command, next word or None)] of every diffsim-ros command in ``code``."""
    out = []
    for m in re.finditer(r"(?:(?<![\w.-])diffsim-ros|-m\s+diffsim_ros\.cli)[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?",
                         code):
        out.append((m.group(1), m.group(2)))
    return out


def wrong_names(page: Path, commands: dict, scripts: dict, text: Optional[str] = None) -> list:
    """List what the code of ``page`` names that does not exist.

    'PAGE: what' for every command, script, launch file, module or path the code of ``page``
    (its ``text``) names that does not exist.
    """
    text = page.read_text() if text is None else text
    _, code = split_page(text)
    bad = []
    for command, following in named_commands(code):
        if command not in commands:
            bad.append(f"diffsim-ros {command}: no such command")
        elif commands[command] and following not in commands[command]:
            bad.append(f"diffsim-ros {command} {following}: no such subcommand ({', '.join(commands[command])})")
    executables = Path(sys.executable).parent
    for name in re.findall(r"ros2 run diffsim_ros ([\w-]+)", code):
        if name not in scripts:
            bad.append(f"ros2 run diffsim_ros {name}: no such console script")
    for name in re.findall(r"(?<![\w/])\.venv/bin/([\w.-]+)", code):
        if name not in scripts and name not in ENVIRONMENT_EXECUTABLES:
            bad.append(f".venv/bin/{name}: not a console script of setup.py")
        elif name in ENVIRONMENT_EXECUTABLES - {"ros2"} and not (executables / name).exists():
            bad.append(f".venv/bin/{name}: not in this environment")
    for name in re.findall(r"ros2 launch diffsim_ros (\w[\w.-]*)", code):
        if not (REPO_ROOT / "launch" / name).is_file():
            bad.append(f"ros2 launch diffsim_ros {name}: no such launch file")
    for module in re.findall(r"python3? -m (diffsim_ros[\w.]*)", code):
        if importlib.util.find_spec(module) is None:
            bad.append(f"python -m {module}: no such module")
    for path, test in PATH.findall(code):
        path = path.rstrip(".")
        if any(c in path for c in "<>{}$") or path.startswith("config/my_"):     # a placeholder, a user's file
            continue
        matches = list(REPO_ROOT.glob(path)) if "*" in path else [REPO_ROOT / path]
        if not any(p.exists() for p in matches):
            bad.append(f"{path}: no such file or folder")
        elif test:
            name = test.split("::")[-1].split("[")[0]
            if not any(re.search(rf"^\s*def {re.escape(name)}\(", p.read_text(), re.M) for p in matches if p.is_file()):
                bad.append(f"{path}::{test}: no such test")
    # the nodes a table of nodes names (| node | ... |)
    for table in re.findall(r"^\| node \|.*\n\|[-| ]+\|\n((?:\|.*\n)+)", text, re.M):
        for name in re.findall(r"^\| `([\w-]+)` \|", table, re.M):
            if name not in scripts:
                bad.append(f"node table: {name} is no console script")
    return [f"{rel(page)}: {b}" for b in bad]


@pytest.fixture(scope="module")
def commands():
    return cli_commands()


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_named_commands_scripts_and_paths_exist(page, commands):
    assert not wrong_names(page, commands, console_scripts())


def test_a_wrong_name_is_caught(commands):
    text = ("```bash\ndiffsim-ros trian --config config/hover.yaml\ndiffsim-ros bag mend BAG\n"
            "ros2 run diffsim_ros policy_controler\n.venv/bin/diffsim-ros eval policies/hover\n"
            "python bench/no_such_bench.py\n```\n`test/test_docs.py::test_no_such_test` `diffsim-ros sysid`\n\n"
            "| node | what |\n|---|---|\n| `mujoco_plant` | the stand-in |\n| `teleop_node` | not ours |\n")
    bad = wrong_names(REPO_ROOT / "doc" / "_probe_.md", commands, console_scripts(), text)
    assert [b.split(": ", 1)[1] for b in bad] == [
        "diffsim-ros trian: no such command",
        "diffsim-ros bag mend: no such subcommand (repair)",
        "ros2 run diffsim_ros policy_controler: no such console script",
        "bench/no_such_bench.py: no such file or folder",
        "test/test_docs.py::test_no_such_test: no such test",
        "node table: teleop_node is no console script"], bad


def test_the_readme_and_evaluate_page_show_one_preset_table():
    """The README and the evaluate page show one preset table.

    README.md's table of the hardware preset (checked against plant.PRESETS by
    test/plant/test_perturbation.py) and doc/evaluate.md's are the same rows.
    """
    def rows(path):
        return [line for line in path.read_text().splitlines() if re.match(r"\| (arm|legged|multirotor) \|", line)]

    readme = rows(REPO_ROOT / "README.md")
    assert len(readme) == 3 and readme == rows(REPO_ROOT / "doc" / "evaluate.md")


def test_the_readme_keeps_its_two_commands_and_stays_short():
    """The set-up's two commands (.ci/run runs the second) and the 300-line limit of issue 42."""
    text = (REPO_ROOT / "README.md").read_text()
    assert "scripts/run.sh     # the main job" in text and "scripts/test.sh    # the tests" in text
    assert "scripts/test.sh" in (REPO_ROOT / ".ci" / "run").read_text()
    assert len(text.splitlines()) < 300
