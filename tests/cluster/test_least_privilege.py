"""Least privilege, proven by the real RBAC authoriser: without any one rule of the chart's
ClusterRole, the user's story (story.py) fails at a named step with the API server's own 403, and
the 403 names a permission of the rule removed: the request itself, or a check the API server made
on the operator's behalf (RBAC escalation prevention when it creates the gateway's Role; the
OwnerReferencesPermissionEnforcement admission plugin when it sets blockOwnerDeletion)."""
from __future__ import annotations

import pytest

from tests.cluster.story import STORY, StepDenied, Story, chart_rules, rule_label, triples

RULES = chart_rules()


@pytest.mark.parametrize("index", range(len(RULES)), ids=[rule_label(r) for r in RULES])
def test_without_any_one_chart_rule_a_named_step_is_refused(control_plane, cluster_namespace, programs, index):
    removed = RULES[index]
    story = Story(control_plane, cluster_namespace, *programs)
    story.install(edit_rules=lambda rules: [r for r in rules if r != removed])
    try:
        with pytest.raises(StepDenied) as denied:
            story.run([getattr(story, step) for step in STORY])
    finally:
        story.uninstall()
    refused = denied.value
    print(f"without {rule_label(removed)}: {refused}")
    message = refused.entry["responseStatus"].get("message", "")
    named = refused.triple in triples([removed]) or any(
        f'APIGroups:["{g}"], Resources:["{r}"]' in message for g, r, _ in triples([removed])) or (
        "finalizers" in message and any(r.endswith("/finalizers") for r in removed["resources"]))
    assert named, f"the 403 does not name a permission of {rule_label(removed)}: {message!r}"
