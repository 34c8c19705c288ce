"""The user-facing docs (README.md and docs/) name what the code really has: every environment
variable it reads, every flag of `laps operator`, `laps engine`, `laps gateway`, `laps local` and
of the measurement commands, every chart value, every image target, every source directory, the
SGLang flags the operator renders, the modules the architecture walks through. Each of these was
once missing from the docs while the code had it. And the docs hold together: README stays a
short entry point that links every document, and no link (or code comment) names a document or
a heading that is not there."""
from __future__ import annotations

import ast
import fnmatch
import json
import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
CONTRACTS = (DOCS / "contracts.md").read_text()
KUBERNETES = (DOCS / "kubernetes.md").read_text()
DEVELOPMENT = (DOCS / "development.md").read_text()
MEASURING = (DOCS / "measuring.md").read_text()
SGLANG = (DOCS / "sglang.md").read_text()
ARCHITECTURE = (DOCS / "architecture.md").read_text()
ENV_NAME = re.compile(r"LAPS_[A-Z0-9_]+")
# Written by the CRD's generator (laps_operator.spec.crd), checked by its own test.
GENERATED = {"docs/spec.md"}
README_MAX_LINES = 200


def _section(text: str, heading: str) -> str:
    """From the line starting with `heading` to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index("\n" + heading) + 1
    rest = text[start + len(heading):]
    ends = [m.start() for m in re.finditer(r"^#{1,%d} " % len(level), rest, re.M)]
    return text[start:start + len(heading) + (ends[0] if ends else len(rest))]


def _table(section: str) -> list[list[str]]:
    """The cells of the first Markdown table in `section`, header and separator left out."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _flags(parser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def _missing(flags: set[str], text: str) -> set[str]:
    return {f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", text)}


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
    table = _section(CONTRACTS, "## Environment variables")
    undocumented = {n for n in names if f"`{n}`" not in table}
    assert undocumented == set(), "read by the code, not in docs/contracts.md's Environment variables"


def test_every_laps_operator_flag_is_in_the_contract():
    from laps_operator.cli import build_parser

    flags = _flags(build_parser())
    assert "--liveness-port" in flags
    assert _missing(flags, _section(CONTRACTS, "### `laps operator`")) == set(), "flags the contract omits"


def test_every_engine_gateway_and_local_flag_is_in_the_contract():
    from laps_agent.engine.flags import build_parser as engine  # both backends' parser
    from laps_agent.gateway.cli import build_parser as gateway
    from laps_agent.local.stack import build_parser as local

    for command, parser, must in (("laps engine", engine, "--bootstrap-timeout"),
                                  ("laps gateway", gateway, "--max-decode-share"),
                                  ("laps local", local, "--single-pool")):
        flags = _flags(parser())
        assert must in flags, command
        assert _missing(flags, _section(CONTRACTS, f"### `{command}`")) == set(), f"{command} flags the contract omits"


def test_every_flag_of_bench_run_bench_compare_and_sim_is_in_measuring():
    from laps_agent.lab.bench.compare import build_parser as compare
    from laps_agent.lab.bench.run import build_parser as run
    from laps_agent.lab.sim import build_parser as sim

    for heading, parser, must in (("## `laps bench run`", run, "--slo"),
                                  ("## `laps bench compare`", compare, "--warmup-s"),
                                  ("## `laps sim`", sim, "--hop-ms")):
        flags = _flags(parser())
        assert must in flags, heading
        assert _missing(flags, _section(MEASURING, heading)) == set(), f"{heading}: flags docs/measuring.md omits"


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


def test_every_chart_value_is_in_the_chart_values_table():
    values = yaml.safe_load((ROOT / "charts" / "laps" / "values.yaml").read_text())
    schema = json.loads((ROOT / "charts" / "laps" / "values.schema.json").read_text())
    named = " ".join(row[0] for row in _table(_section(KUBERNETES, "## Chart values")))
    missing = [p for p in _values_paths(values) + list(schema["properties"]) if not _named(named, p)]
    assert missing == [], "chart values the first column of docs/kubernetes.md's table does not name"


def test_the_docs_name_every_image_target_and_which_one_is_the_crd_default():
    from laps_operator.spec.cluster import GatewaySpec
    from laps_operator.spec.pods import EngineSpec

    dockerfile = (ROOT / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.M)) - {"source"}
    assert targets == {"operator", "gateway", "engine", "engine-sglang"}
    table = {row[0].strip("`"): " | ".join(row) for row in _table(_section(KUBERNETES, "## Images"))}
    assert set(table) == targets
    # The CRD's default engine and gateway image is the `engine` target's (it holds `laps
    # gateway` and the default model the minimal example names).
    assert EngineSpec().image == GatewaySpec().image
    assert EngineSpec().image in table["engine"]
    chart = yaml.safe_load((ROOT / "charts" / "laps" / "values.yaml").read_text())
    assert chart["image"]["repository"] in table["operator"]


def test_the_layout_names_every_top_level_directory_and_data_plane_package():
    layout = _section(DEVELOPMENT, "## Layout")
    ignored = [line.rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
               if line.endswith("/")]  # .venv/, build/, *.egg-info/, ...
    top = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
           and not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored)}
    assert {"agent", "operator", "charts", "tests"} <= top
    assert {d for d in top if f"{d}/" not in layout} == set(), "directories the Layout omits"
    packages = {p.parent.name for p in (ROOT / "agent" / "laps_agent").glob("*/__init__.py")}
    assert {"engine", "gateway", "sglang_plugin", "policy"} <= packages
    assert {p for p in packages if f"{p}/" not in layout} == set(), "laps_agent packages the Layout omits"
    operator = {p.parent.name for p in (ROOT / "operator" / "laps_operator").glob("*/__init__.py")}
    assert {p for p in operator if f"{p}/" not in layout} == set(), "laps_operator packages the Layout omits"
    tests = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert {t for t in tests if f"tests/{t}" not in layout} == set(), "test trees the Layout omits"


def test_the_sglang_command_has_every_flag_the_operator_renders_and_no_other():
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
    section = _section(SGLANG, "## What the operator renders")
    block = section.split("```sh\npython3 -m sglang.launch_server", 1)[1].split("```", 1)[0]
    documented = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", block))
    assert documented == rendered["prefill"] | rendered["decode"]
    # Each flag rendered for prefill alone says so on its line.
    for flag in rendered["prefill"] - rendered["decode"]:
        (line,) = [ln for ln in block.splitlines() if flag in ln]
        assert "prefill only" in line, flag


def test_every_module_the_architecture_names_exists():
    named = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*\.py)`", ARCHITECTURE))
    assert {"gateway/http/app.py", "policy/routing.py", "reconcile/cycle.py", "sglang_plugin/hooks.py"} <= named
    roots = [ROOT, ROOT / "agent" / "laps_agent", ROOT / "operator" / "laps_operator"]
    assert {m for m in named if not any((r / m).is_file() for r in roots)} == set(), \
        "modules docs/architecture.md names that are not there (moved? renamed?)"


def test_the_readme_is_a_short_entry_point_that_links_every_document():
    assert len(README.splitlines()) <= README_MAX_LINES, "README.md grew back into a manual: move it to docs/"
    linked = set(re.findall(r"\]\((docs/[^)#]+)", README))
    docs = {f"docs/{p.name}" for p in DOCS.glob("*.md")} | GENERATED
    assert docs - linked == set(), "documents README.md does not link"


def _without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _without_code(text: str) -> str:
    """Fenced blocks and inline code left out: `](x)` in a pattern is no link."""
    return re.sub(r"`[^`\n]*`", "", _without_fences(text))


def _anchors(text: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", _without_fences(text), re.M)}


def test_every_link_between_the_documents_resolves():
    pages = [ROOT / "README.md", *DOCS.rglob("*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue   # http(s), mailto
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            name = file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else str(file)
            if name in GENERATED and not file.exists():
                continue
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_every_document_the_code_names_exists():
    """Code comments send readers to `docs/<name>.md`: a document deleted or renamed (as the
    internal-APIs document was) must not leave them pointing at nothing."""
    sources = [p for d in ("agent", "operator", "tests", "scripts", "charts", "examples")
               for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".tpl", ".sh", ".txt")]
    sources += [ROOT / name for name in ("Dockerfile", "Makefile", "pyproject.toml", ".importlinter")]
    named = {(m, p.relative_to(ROOT).as_posix()) for p in sources
             for m in re.findall(r"docs/[\w/-]+\.md", p.read_text(errors="replace"))}
    assert any(m == "docs/contracts.md" for m, _ in named)   # the scan finds what it must
    assert {(m, where) for m, where in named if not (ROOT / m).exists() and m not in GENERATED} == set()
