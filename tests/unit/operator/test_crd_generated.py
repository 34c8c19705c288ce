"""The committed CRD and its reference are the generator's output (laps_operator.spec.crd), byte
for byte, and what the generator reads off the typed spec is what the operator enforces: one
place for each default, bound and rule."""
from __future__ import annotations

import pathlib
from typing import Annotated

import pytest
import yaml
from pydantic import BaseModel, Field

from laps_agent.policy.allocation import AllocationConfig
from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD
from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_operator.spec import crd as generator
from laps_operator.spec.cluster import RULES
from laps_operator.spec.status import HISTORY

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("path", "make"), [(generator.CRD_FILE, generator.crd_yaml),
                                            (generator.DOCS_FILE, generator.docs_markdown)])
def test_the_committed_file_is_the_generators_output(path, make):
    committed = (ROOT / path).read_text(encoding="utf-8")
    assert committed == make(), (
        f"{path} is not what the typed spec (operator/laps_operator/spec/) generates: regenerate it, "
        f"from the repository's root: .venv/bin/{generator.REGENERATE}")


def test_the_yaml_reads_back_as_the_generated_manifest():
    # The sha256 annotation is of the dict; the file must load as that very dict.
    assert yaml.safe_load(generator.crd_yaml()) == generator.crd()


def test_the_main_writes_both_files_where_the_repository_keeps_them(tmp_path, monkeypatch, capsys):
    (tmp_path / "charts" / "laps" / "crds").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    monkeypatch.chdir(tmp_path)
    assert generator.main(["--write"]) == 0
    assert (tmp_path / generator.CRD_FILE).read_text() == generator.crd_yaml()
    assert (tmp_path / generator.DOCS_FILE).read_text() == generator.docs_markdown()
    assert generator.main([]) == 0
    assert capsys.readouterr().out == generator.crd_yaml()
    assert generator.main(["--docs"]) == 0
    assert capsys.readouterr().out == generator.docs_markdown()


def _spec_schema() -> dict:
    return generator.openapi_schema()["properties"]["spec"]


def test_defaults_the_data_plane_also_has_come_from_it():
    # A knob left out of the CR runs the engines and the allocation policy as laps local does.
    laps = _spec_schema()["properties"]["laps"]["properties"]
    scheduler, allocation = laps["scheduler"]["properties"], laps["allocation"]["properties"]
    config, policy = SchedulerConfig(), AllocationConfig()
    assert scheduler["waitWindowMs"]["default"] == config.wait_window_ms == 5.0
    assert scheduler["waitMaxBatch"]["default"] == config.wait_max_batch
    # Unset, the starvation bound follows spec.slo (ClusterSpec.max_long_wait_ms): no fixed default.
    assert "default" not in scheduler["maxLongWaitMs"]
    assert scheduler["maxLongBatchTokens"]["default"] == config.max_long_batch_tokens
    assert scheduler["enabled"]["default"] is config.enabled
    assert scheduler["adaptiveWindow"]["default"] is config.adaptive_window
    assert laps["lengthThreshold"]["default"] == DEFAULT_LENGTH_THRESHOLD
    assert (allocation["ratio"]["default"], allocation["minPerGroup"]["default"]) == (policy.ratio, policy.min_per_group)
    assert (allocation["cooldownSeconds"]["default"], allocation["confirmIntervals"]["default"]) == (
        policy.pod_cooldown_s, policy.confirm)


def test_the_rules_and_the_history_bound_come_from_the_operators_code():
    spec = _spec_schema()
    assert [(r["rule"], r["message"]) for r in spec["x-kubernetes-validations"]] == [(r.cel, r.message) for r in RULES]
    status = generator.openapi_schema()["properties"]["status"]["properties"]
    assert status["allocation"]["properties"]["history"]["maxItems"] == HISTORY


def test_an_unknown_constraint_is_an_error_not_a_silent_drop():
    class Odd(BaseModel):
        x: Annotated[float, Field(multiple_of=2)] = 2.0

    with pytest.raises(TypeError):
        generator._type(Odd, status=False)
