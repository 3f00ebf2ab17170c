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
