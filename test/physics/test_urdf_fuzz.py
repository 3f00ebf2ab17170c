"""Fuzzing the URDF path: mutated URDFs either load or raise UrdfError, never anything else.

Start from the project's own URDFs and Panda, apply one to three random
mutations (seeded, so every run tests the same cases), and call the public
entry point ``diffsim_ros.physics.load_urdf`` (reader + model builder). Any
exception other than ``UrdfError``, or a case running past its time limit,
fails with the mutations that produced it.
"""
from __future__ import annotations

import copy
import functools
import random
import signal
import warnings
from typing import Callable, List, Tuple

import pytest
from lxml import etree

from conftest import PROJECT_URDFS, example_robot_data_dir
from diffsim_ros.physics import UrdfError, load_urdf

CASES_PER_BASE = 60
TIME_LIMIT_S = 5


def _bases():
    bases = {  # name: (text, floating_base as the robot is meant to be used)
        "arm": (PROJECT_URDFS["arm"].read_text(), False),
        "quadrotor": (PROJECT_URDFS["quadrotor"].read_text(), True),
        "quadruped": (PROJECT_URDFS["quadruped"].read_text(), True),
    }
    robots = example_robot_data_dir()
    if robots is not None:
        bases["panda"] = ((robots / "panda_description/urdf/panda.urdf").read_text(), False)
    return bases


BASES = _bases()

BAD_NUMBERS = ["nan", "inf", "-inf", "-1", "0", "1e308", "1e400", "-1e-300", "abc", "", "1 2", "1,2,3",
               "0x10", "1e", "--1", " ", "NaN 0 0", "0 0 0 0"]
JOINT_TYPES = ["planar", "floating", "unknown", "", "REVOLUTE", "revolute ", "hinge", "continuous",
               "prismatic", "fixed", "revolute"]


# ---------------------------------------------------------------------------
# mutations: (rng, text) -> (text, description)
# ---------------------------------------------------------------------------

def _tree(text):
    parser = etree.XMLParser(remove_comments=True)
    return etree.fromstring(text.encode(), parser)


def _dump(root):
    return etree.tostring(root, encoding="unicode")


def _elements(root, tag=None):
    return [e for e in root.iter() if isinstance(e.tag, str) and e is not root and (tag is None or e.tag == tag)]


def delete_element(rng, text):
    root = _tree(text)
    el = rng.choice(_elements(root))
    el.getparent().remove(el)
    return _dump(root), f"delete <{el.tag} {dict(el.attrib)}>"


def delete_attribute(rng, text):
    root = _tree(text)
    el = rng.choice([e for e in _elements(root) if e.attrib])
    key = rng.choice(sorted(el.attrib))
    del el.attrib[key]
    return _dump(root), f"delete {key}= of <{el.tag}>"


def _is_numeric(value):
    try:
        [float(v) for v in value.split()]
        return bool(value.split())
    except ValueError:
        return False


def bad_number(rng, text):
    root = _tree(text)
    slots = [(e, k) for e in _elements(root) for k, v in e.attrib.items() if _is_numeric(v)]
    el, key = rng.choice(slots)
    parts = el.get(key).split()
    bad = rng.choice(BAD_NUMBERS)
    if len(parts) > 1 and rng.random() < 0.5:
        parts[rng.randrange(len(parts))] = bad
        value = " ".join(parts)
    else:
        value = bad
    el.set(key, value)
    return _dump(root), f"<{el.tag} {key}={value!r}>"


def dangling_link_ref(rng, text):
    root = _tree(text)
    refs = [e for e in _elements(root) if e.tag in ("parent", "child")]
    el = rng.choice(refs)
    el.set("link", "no_such_link")
    return _dump(root), f"<{el.tag} link='no_such_link'> in joint {el.getparent().get('name')}"


def duplicate_element(rng, text, tag):
    root = _tree(text)
    els = _elements(root, tag)
    if not els:
        return text, f"(no <{tag}> to duplicate)"
    el = rng.choice(els)
    el.addnext(copy.deepcopy(el))
    return _dump(root), f"duplicate <{tag} name={el.get('name')!r}>"


def duplicate_joint(rng, text):
    return duplicate_element(rng, text, "joint")


def duplicate_link(rng, text):
    return duplicate_element(rng, text, "link")


def duplicate_child_element(rng, text):
    root = _tree(text)
    el = rng.choice([e for e in _elements(root) if e.getparent() is not root])
    el.addnext(copy.deepcopy(el))
    return _dump(root), f"repeat <{el.tag}> inside <{el.getparent().tag}>"


def truncate(rng, text):
    n = rng.randrange(len(text))
    return text[:n], f"truncate at {n} of {len(text)}"


def swap_parent_child(rng, text):
    root = _tree(text)
    joint = rng.choice(_elements(root, "joint"))
    p, c = joint.find("parent"), joint.find("child")
    if p is None or c is None:
        return text, "(no parent/child to swap)"
    pl, cl = p.get("link"), c.get("link")
    p.set("link", cl)
    c.set("link", pl)
    return _dump(root), f"swap parent/child of joint {joint.get('name')}"


def random_joint_type(rng, text):
    root = _tree(text)
    joint = rng.choice(_elements(root, "joint"))
    t = rng.choice(JOINT_TYPES)
    joint.set("type", t)
    return _dump(root), f"joint {joint.get('name')} type={t!r}"


def rename_link(rng, text):
    root = _tree(text)
    link = rng.choice(_elements(root, "link"))
    old = link.get("name")
    link.set("name", rng.choice(["renamed", "", old + " ", old.upper()]))
    return _dump(root), f"rename link {old!r} to {link.get('name')!r}"


def add_mimic(rng, text):
    root = _tree(text)
    joint = rng.choice(_elements(root, "joint"))
    names = [j.get("name") for j in _elements(root, "joint")] + ["ghost_joint"]
    target = rng.choice(names)
    etree.SubElement(joint, "mimic", joint=target, multiplier=rng.choice(["1", "-1", "nan", "2"]))
    return _dump(root), f"joint {joint.get('name')} mimics {target!r}"


def corrupt_char(rng, text):
    n = rng.randrange(len(text))
    ch = rng.choice(["<", ">", "&", '"', "'", "\x00", "\u00e9", " ", "/"])
    return text[:n] + ch + text[n + 1:], f"character {n} -> {ch!r}"


def orphan_link(rng, text):
    return text.replace("</robot>", '<link name="orphan"/></robot>'), "add an orphan link"


MUTATIONS: List[Callable[[random.Random, str], Tuple[str, str]]] = [
    delete_element, delete_attribute, bad_number, bad_number, bad_number, dangling_link_ref, duplicate_joint,
    duplicate_link, duplicate_child_element, truncate, swap_parent_child, random_joint_type, rename_link,
    add_mimic, corrupt_char, orphan_link,
]


def make_case(base: str, i: int):
    rng = random.Random(f"urdf-fuzz/{base}/{i}")       # str seeds are stable across runs and platforms
    text, floating = BASES[base]
    steps = []
    for _ in range(1 if rng.random() < 0.7 else rng.randint(2, 3)):
        mutation = rng.choice(MUTATIONS)
        try:
            text, what = mutation(rng, text)
        except (etree.XMLSyntaxError, IndexError, ValueError):
            break   # an earlier step (truncate, corrupt) left text the next tree mutation cannot read
        steps.append(f"{mutation.__name__}: {what}")
    if rng.random() < 0.25:
        floating = not floating
    return text, floating, steps


class CaseTimeout(BaseException):
    """Not an Exception: the reader's blanket ``except Exception`` must not swallow it."""


def _on_alarm(signum, frame):
    raise CaseTimeout()


@functools.lru_cache(maxsize=None)
def run_case(base: str, i: int):
    """('ok' | 'UrdfError' | 'other' | 'timeout', description)."""
    text, floating, steps = make_case(base, i)
    what = f"{base} #{i} (floating_base={floating}): " + "; ".join(steps)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(TIME_LIMIT_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = load_urdf(text, floating_base=floating)
        assert model.nv >= 0
        return "ok", what
    except UrdfError as e:
        return "UrdfError", f"{what} -> {e}"
    except CaseTimeout:
        return "timeout", f"{what} -> still running after {TIME_LIMIT_S} s"
    except Exception as e:  # noqa: BLE001 - this is what the test looks for
        return "other", f"{what} -> {type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


CASES = [(b, i) for b in BASES for i in range(CASES_PER_BASE)]


@pytest.mark.parametrize("base,i", CASES, ids=[f"{b}-{i}" for b, i in CASES])
def test_mutated_urdf_loads_or_raises_urdf_error(base, i):
    outcome, what = run_case(base, i)
    assert outcome in ("ok", "UrdfError"), what


def test_fuzz_cases_are_meaningful():
    """Enough cases, and both outcomes well represented (the mutations bite, but not always)."""
    assert len(CASES) >= 200 or "panda" not in BASES
    outcomes = [run_case(b, i)[0] for b, i in CASES]
    assert outcomes.count("UrdfError") >= 0.3 * len(CASES)
    assert outcomes.count("ok") >= 0.1 * len(CASES)


def test_fuzz_is_deterministic():
    assert make_case("arm", 7) == make_case("arm", 7)
    assert make_case("arm", 7) != make_case("arm", 8)
