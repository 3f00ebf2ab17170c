"""package.xml is a well-formed format 3 manifest that agrees with setup.py."""
import re
from pathlib import Path

from lxml import etree

ROOT = Path(__file__).resolve().parents[1]

# Child elements of <package> in the order the format 3 schema requires
# (the dependency tags may come in any order among themselves).
ORDER = ["name", "version", "description", "maintainer", "license", "url", "author", "depend",
         "export"]
DEPENDS = {"build_depend", "build_export_depend", "buildtool_depend", "buildtool_export_depend",
           "exec_depend", "depend", "doc_depend", "test_depend", "conflict", "replace",
           "group_depend", "member_of_group"}


def _manifest():
    return etree.parse(str(ROOT / "package.xml")).getroot()


def test_format_3_and_element_order():
    pkg = _manifest()
    assert pkg.tag == "package" and pkg.get("format") == "3"
    tags = [c.tag for c in pkg if isinstance(c.tag, str)]
    ranks = [ORDER.index("depend" if t in DEPENDS else t) for t in tags]
    assert ranks == sorted(ranks), tags
    for required in ("name", "version", "description", "maintainer", "license"):
        assert required in tags
    assert tags.count("name") == tags.count("version") == tags.count("description") == 1
    assert re.fullmatch(r"\d+\.\d+\.\d+", pkg.findtext("version"))
    assert pkg.find("maintainer").get("email")


def test_ament_python_and_dependencies():
    pkg = _manifest()
    assert pkg.findtext("name") == "diffsim_ros"
    assert pkg.findtext("export/build_type") == "ament_python"
    exec_deps = {e.text for e in pkg.findall("exec_depend")}
    for dep in ("rclpy", "std_msgs", "sensor_msgs", "geometry_msgs", "nav_msgs",
                "trajectory_msgs", "diagnostic_msgs", "std_srvs", "urdfdom_py", "xacro",
                "python3-numpy"):
        assert dep in exec_deps
    assert "python3-pytest" in {e.text for e in pkg.findall("test_depend")}
    deps = [e.text for e in pkg if isinstance(e.tag, str) and e.tag.endswith("depend")]
    assert len(deps) == len(set(deps)), "a dependency is listed twice"


def test_version_matches_setup_py():
    setup = (ROOT / "setup.py").read_text()
    m = re.search(r"version\s*=\s*['\"]([^'\"]+)['\"]", setup)
    assert m and m.group(1) == _manifest().findtext("version")


def test_package_marker_and_setup_cfg():
    assert (ROOT / "resource" / "diffsim_ros").is_file()
    cfg = (ROOT / "setup.cfg").read_text()
    assert "script_dir=$base/lib/diffsim_ros" in cfg
    assert "install_scripts=$base/lib/diffsim_ros" in cfg


def test_interfaces_page_names_every_topic():
    """The interfaces page names every topic.

    doc/interfaces.md documents every default topic of diffsim_ros/interfaces.py, and every
    node parameter naming a topic defaults to one of them (or, for an input or output that only
    that node has, is named on the page).
    """
    import diffsim_ros.interfaces as ifc
    from diffsim_ros.nodes import mujoco_plant, policy_controller, train_node

    doc = (ROOT / "doc" / "interfaces.md").read_text()
    topics = set()
    for name, value in vars(ifc).items():
        for v in (value if isinstance(value, tuple) else (value,)):
            if name.isupper() and isinstance(v, str) and v.startswith("/"):
                topics.add(v)
    assert len(topics) >= 20, topics
    missing = sorted(t for t in topics if f"`{t}`" not in doc)
    assert not missing, f"doc/interfaces.md does not name {missing}"
    params = dict((k, v[0]) for k, v in policy_controller.PARAMETERS.items())
    params.update((k, v[0]) for k, v in train_node.PARAMETERS.items())
    params.update((p[0], p[1]) for p in mujoco_plant.PARAMETERS)
    for key, default in params.items():
        if key.endswith("_topic") and default:
            assert default in topics or f"`{default}`" in doc, (key, default)
