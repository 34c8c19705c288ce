"""The parts of a pod spec's placement that a LAPSCluster passes on (tolerations, affinity,
topology spread, label selectors), with the API server's own rules, so that a value it would
refuse is an InvalidSpec naming the field rather than every write of a workload refused; and
the base model of every spec section (camelCase aliases, unknown keys refused).

What the CRD says of each field comes from here too (crd.py reads these models): pydantic's own
constraints (ge, max_length, pattern, ...) are checked by both; `json_schema_extra` holds what
only the API server checks by the schema, because the operator checks it in code with a message
naming the rule (a label value's pattern) or because it is the schema's business only (the
x-kubernetes-* markers).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from laps_operator.naming import role_selector
from laps_operator.spec.formats import (
    LABEL_VALUE_MAX_LENGTH,
    LABEL_VALUE_PATTERN,
    TOLERATION_KEY_MAX_LENGTH,
    TOLERATION_KEY_PATTERN,
    annotations_problem,
    label_value_problem,
    qualified_name_problem,
)


class SpecModel(BaseModel):
    """A section of the spec. camelCase in the CR, snake_case in Python; unknown keys are typos
    worth reporting. In the CRD (crd.py) a field's `default` is the API server's default too;
    a `default_factory` is the operator's alone (the server stores nothing for a field left out)."""
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


# Kubernetes' integer formats, as its own schemas give them.
Int32 = Annotated[int, Field(le=2**31 - 1, json_schema_extra={"format": "int32"})]
Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]


class Toleration(SpecModel):
    """Kubernetes' Toleration, its fields only (a typo such as `kee` is refused, not passed on for
    the API server to refuse every write of the workload) and its rules."""
    # {} is no toleration Kubernetes accepts; a server that pruned a lone misspelt key (no strict
    # field validation) would leave just that.
    model_config = ConfigDict(json_schema_extra={"minProperties": 1})
    key: str | None = Field(default=None, max_length=TOLERATION_KEY_MAX_LENGTH, pattern=TOLERATION_KEY_PATTERN)
    operator: Literal["Exists", "Equal"] | None = None  # unset: Equal
    value: str | None = Field(default=None, max_length=LABEL_VALUE_MAX_LENGTH, pattern=LABEL_VALUE_PATTERN)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None  # unset: every effect
    toleration_seconds: Int64 | None = None

    @field_validator("key")
    @classmethod
    def _name_part(cls, key: str | None) -> str | None:
        # The pattern cannot count the part after the prefix (a label key's rule: at most 63).
        if key and (problem := qualified_name_problem(key)):
            raise ValueError(problem)
        return key

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        # The API server's own (ValidateTolerations).
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator Exists (it then tolerates every taint)")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute (only NoExecute taints evict)")
        return self


def _labels(labels: dict[str, str]) -> dict[str, str]:
    # Keys and values the API server accepts: a bad one would get every write of the workload
    # refused, instead of an InvalidSpec naming it.
    for key, value in labels.items():
        if problem := qualified_name_problem(key):
            raise ValueError(problem)
        if problem := label_value_problem(value):
            raise ValueError(f"{key}: {problem}")
    return labels


# Label keys and values (pod labels, a nodeSelector, a selector's matchLabels).
LabelMap = Annotated[dict[str, str], AfterValidator(_labels)]
# A pod's labels: in the CRD their values carry the API server's pattern as well (_labels says
# what is wrong with one, naming it).
PodLabelMap = Annotated[
    dict[str, Annotated[str, Field(json_schema_extra={"maxLength": LABEL_VALUE_MAX_LENGTH,
                                                      "pattern": LABEL_VALUE_PATTERN})]],
    AfterValidator(_labels)]


class LabelSelectorRequirement(SpecModel):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        # The API server's own rules (ValidateLabelSelectorRequirement).
        if problem := qualified_name_problem(self.key):
            raise ValueError(problem)
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        for value in self.values or ():
            if problem := label_value_problem(value):
                raise ValueError(f"{self.key}: {problem}")
        return self


class LabelSelector(SpecModel):
    """Kubernetes' LabelSelector, these keys only: the API server drops a misspelt one
    (`matchLable`), which leaves {}, a selector of everything."""
    # In the CRD unknown keys are kept, not pruned: a misspelt one reaches the operator
    # (InvalidSpec) instead of leaving {}, which would select everything.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    match_labels: LabelMap | None = None
    match_expressions: tuple[LabelSelectorRequirement, ...] | None = None


class PodAffinityTerm(SpecModel):
    # Its selectors are checked (see LabelSelector); topologyKey, namespaces and the rest pass
    # through as written. Unknown keys allowed: the CRD keeps the whole term as written.
    model_config = ConfigDict(extra="allow")
    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None


class WeightedPodAffinityTerm(SpecModel):
    model_config = ConfigDict(extra="allow")  # weight
    pod_affinity_term: PodAffinityTerm | None = None


class NodeAffinity(SpecModel):
    # Checked down to the scheduling terms, where a misspelt key is likeliest; the node terms
    # (NodeSelector, PreferredSchedulingTerm) pass through as written.
    required_during_scheduling_ignored_during_execution: dict[str, Any] | None = None
    preferred_during_scheduling_ignored_during_execution: tuple[dict[str, Any], ...] | None = None


class PodAffinity(SpecModel):
    required_during_scheduling_ignored_during_execution: tuple[PodAffinityTerm, ...] | None = None
    preferred_during_scheduling_ignored_during_execution: tuple[WeightedPodAffinityTerm, ...] | None = None


class Affinity(SpecModel):
    # Kubernetes' Affinity, these keys only: a misspelt one is an InvalidSpec naming it, not a
    # workload the API server refuses on every write.
    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class TopologySpreadConstraint(SpecModel):
    """Kubernetes' TopologySpreadConstraint, its fields only and the API server's rules. Left out,
    labelSelector is the role's own pods (in_pod)."""
    max_skew: Int32 = Field(ge=1)
    topology_key: str = Field(min_length=1)
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    label_selector: LabelSelector | None = Field(default=None,
                                                 description="a LabelSelector (matchLabels, matchExpressions)")
    min_domains: Int32 | None = Field(default=None, ge=1)
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    node_taints_policy: Literal["Honor", "Ignore"] | None = None
    match_label_keys: tuple[str, ...] | None = None

    def in_pod(self, own_pods: dict[str, str]) -> dict[str, Any]:
        """As the role's pods carry it. Without a labelSelector Kubernetes would count no pod and
        the constraint would spread nothing: it counts `own_pods`, the role's selector, instead."""
        return {"labelSelector": {"matchLabels": dict(own_pods)},
                **self.model_dump(mode="json", by_alias=True, exclude_none=True)}

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> TopologySpreadConstraint:
        for key in (self.topology_key, *(self.match_label_keys or ())):
            if problem := qualified_name_problem(key):
                raise ValueError(problem)
        if self.min_domains is not None and self.when_unsatisfiable != "DoNotSchedule":
            raise ValueError("minDomains needs whenUnsatisfiable DoNotSchedule")
        # The API server refuses a matchLabelKeys key that the selector the pods get holds too
        # (the workload, or since 1.34 each pod as it is created). Its keys, not its values,
        # matter here: the role selector's are the same for every cluster and role.
        selector = self.in_pod(role_selector("", ""))["labelSelector"]
        keys = {*selector.get("matchLabels", {}), *(e["key"] for e in selector.get("matchExpressions", ()))}
        for key in self.match_label_keys or ():
            if key in keys:
                given = "" if self.label_selector else f" (left out: the role's own pods, {', '.join(sorted(keys))})"
                raise ValueError(f"matchLabelKeys: {key} is also a key of labelSelector{given}, which Kubernetes "
                                 "refuses (matchLabelKeys adds the pod's own value of it): name it in one only")
        return self


def _annotations(annotations: dict[str, str]) -> dict[str, str]:
    if problem := annotations_problem(annotations):
        raise ValueError(problem)
    return annotations


# A pod's or a Service's annotations (keys checked by rules of their own).
AnnotationMap = Annotated[dict[str, str], AfterValidator(_annotations)]
