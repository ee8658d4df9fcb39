"""The systemd units shipped under packaging/ start programs the package installs, where docs/install.md puts
them (/opt/lark/bin), and the controller's unit reads the configuration path the condor_config example uses."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def console_scripts() -> set[str]:
    text = (REPO / "setup.py").read_text()
    return set(re.findall(r'"([a-z-]+)=lark\.', text))


def test_every_unit_starts_an_installed_console_script():
    units = sorted((REPO / "packaging").glob("*.service"))
    assert {u.name for u in units} >= {"larkd.service", "lark-controller.service"}
    for unit in units:
        exec_start = re.search(r"^ExecStart=(\S+)", unit.read_text(), re.M)
        assert exec_start, f"{unit.name} has no ExecStart"
        prog = exec_start.group(1)
        assert prog.startswith("/opt/lark/bin/") and prog.rsplit("/", 1)[1] in console_scripts(), (unit.name, prog)


def test_controller_unit_and_condor_example_read_the_same_config():
    unit = (REPO / "packaging/lark-controller.service").read_text()
    example = (REPO / "condor_config.d/60-lark-controller.conf.example").read_text()
    cfg = re.search(r"--config (\S+)", unit).group(1)
    assert f"--config {cfg}" in example
