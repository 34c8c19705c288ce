"""The user-facing docs (README.md, docs/contracts.md) name what the code really has: every
environment variable it reads, every `laps operator` flag, every chart value, every image
target, every source directory and the SGLang flags the operator renders. Each of these was
once missing from the docs while the code had it."""
from __future__ import annotations

import ast
import fnmatch
import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONTRACTS = (ROOT / "docs" / "contracts.md").read_text()
ENV_NAME = re.compile(r"LAPS_[A-Z0-9_]+")


def _section(text: str, heading: str) -> str:
    """From the line starting with `heading` to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index("\n" + heading) + 1
    rest = text[start + len(heading):]
    ends = [m.start() for m in re.finditer(r"^#{1,%d} " % len(level), rest, re.M)]
    return text[start:start + len(heading) + (ends[0] if ends else len(rest))]


def laps_env_names_in_code() -> set[str]:
    """String literals of the operator and the data plane that are a `LAPS_*` name: the
    variables they read (os.environ, the SGLang plugin's tables) or render into pods."""
    names = set()
    for path in [*(ROOT / "operator").rglob("*.py"), *(ROOT / "agent").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and ENV_NAME.fullmatch(node.value):
                names.add(node.value)
    return names


def test_every_laps_environment_variable_the_code_reads_is_documented():
    names = laps_env_names_in_code()
    # The scan finds what it must (an AST walk that found nothing would pass vacuously).
    assert {"LAPS_OPERATOR_RESYNC_SECONDS", "LAPS_LOG_LEVEL", "LAPS_SCHEDULER",
            "LAPS_METRICS_PORT"} <= names
    undocumented = {n for n in names if f"`{n}`" not in README + CONTRACTS}
    assert undocumented == set(), "read by the code, in neither README.md nor docs/contracts.md"


def test_every_laps_operator_flag_is_in_the_contract():
    from laps_operator.cli import build_parser

    section = _section(CONTRACTS, "## `laps operator` flags and environment")
    flags = {o for a in build_parser()._actions for o in a.option_strings
             if o.startswith("--") and o != "--help"}
    assert "--liveness-port" in flags
    assert {f for f in flags if not re.search(re.escape(f) + r"\b", section)} == set(), "flags the contract omits"


def _values_paths(values: dict, prefix: str = "") -> list[str]:
    """Top-level keys and the keys one level below them (`metrics.port`)."""
    paths = []
    for key, value in values.items():
        paths.append(prefix + key)
        if not prefix and isinstance(value, dict) and key not in (
                "resources", "podSecurityContext", "securityContext"):  # Kubernetes' own shapes
            paths += _values_paths(value, key + ".")
    return paths


def _named(text: str, path: str) -> bool:
    """`a.b` is named as `a.b...`, `a.{...,b,...}` or `a.*`; a top-level key as `key...`."""
    if "." not in path:
        return re.search(r"`%s\b" % re.escape(path), text) is not None
    top, key = path.split(".", 1)
    return re.search(r"`%s\.(%s\b|\*|\{[^}]*\b%s\b[^}]*\})" % (re.escape(top), re.escape(key), re.escape(key)),
                     text) is not None


def test_every_chart_value_is_in_the_readme():
    values = yaml.safe_load((ROOT / "charts" / "laps" / "values.yaml").read_text())
    paragraph = README.split("The chart's values (`charts/laps/values.yaml`", 1)[1].split("\n\n", 1)[0]
    missing = [p for p in _values_paths(values) if not _named(paragraph, p)]
    assert missing == [], "chart values the README's list does not name"


def test_the_readme_names_every_image_target_and_which_one_is_the_crd_default():
    from laps_operator.spec.cluster import GatewaySpec
    from laps_operator.spec.pods import EngineSpec

    dockerfile = (ROOT / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.M)) - {"source"}
    assert targets == {"operator", "gateway", "engine", "engine-sglang"}
    images = _section(README, "## On Kubernetes").split("**Images**", 1)[1].split("\n\n", 1)[1]
    table = {row.split("|")[1].strip(" `"): row for row in images.split("\n\n", 1)[0].splitlines()[2:]}
    assert set(table) == targets
    # The CRD's default engine and gateway image is the `engine` target's (it holds `laps
    # gateway` and the default model the minimal example names).
    assert EngineSpec().image == GatewaySpec().image
    assert EngineSpec().image in table["engine"]
    chart = yaml.safe_load((ROOT / "charts" / "laps" / "values.yaml").read_text())
    assert chart["image"]["repository"] in table["operator"]


def test_the_layout_names_every_top_level_directory_and_data_plane_package():
    layout = _section(README, "## Layout")
    ignored = [line.rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
               if line.endswith("/")]  # .venv/, build/, *.egg-info/, ...
    top = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
           and not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored)}
    assert {"agent", "operator", "charts", "tests"} <= top
    assert {d for d in top if f"{d}/" not in layout} == set(), "directories the Layout omits"
    packages = {p.parent.name for p in (ROOT / "agent" / "laps_agent").glob("*/__init__.py")}
    assert {"engine", "gateway", "sglang_plugin"} <= packages
    assert {p for p in packages if f"{p}/" not in layout} == set(), "laps_agent packages the Layout omits"
    tests = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert {t for t in tests if f"tests/{t}" not in layout} == set(), "test trees the Layout omits"


def test_the_readme_sglang_command_has_every_flag_the_operator_renders_and_no_other():
    from laps_operator.render.engine_args import sglang_engine_command
    from laps_operator.spec.cluster import ClusterSpec

    spec = ClusterSpec.model_validate({
        "model": {"name": "m", "path": "/models/m"},
        "engine": {"backend": "sglang", "device": "cuda"},
        "prefill": {"resources": {"limits": {"nvidia.com/gpu": 1}}},
        "decode": {"resources": {"limits": {"nvidia.com/gpu": 1}}},
        "laps": {"prefixCache": False},
    })
    rendered = {role: {a for a in sglang_engine_command(spec, role)[1] if a.startswith("--")}
                for role in ("prefill", "decode")}
    assert "--disaggregation-bootstrap-port" in rendered["prefill"] - rendered["decode"]
    section = _section(README, "## The SGLang backend")
    block = section.split("```sh\npython3 -m sglang.launch_server", 1)[1].split("```", 1)[0]
    documented = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", block))
    assert documented == rendered["prefill"] | rendered["decode"]
    # Each flag rendered for prefill alone says so on its line.
    for flag in rendered["prefill"] - rendered["decode"]:
        (line,) = [ln for ln in block.splitlines() if flag in ln]
        assert "prefill only" in line, flag
