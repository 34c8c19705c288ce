"""What a LAPSCluster may not take back from the operator: the engines' flags it renders (an
occurrence in engine.extraArgs comes last, and the last wins), the variables it sets (a repeated
name in engine.env wins the same way), the paths it mounts (model.mountPath on one of them) and
the labels and annotations it sets (podLabels, podAnnotations, gateway.serviceAnnotations).
Each would be accepted and silently break the cluster: `--port 9000` leaves every Service and
probe on 30000, `LAPS_LENGTH_THRESHOLD` splits short from long unlike the gateway, a model
mounted at /tmp makes the API server refuse every pod, a `laps.io/prefill-group` in the template
would put every prefill pod in one group and roll the pool on each move.

Every answer is read off what the builders render (engine_args.py, workloads.py), so a flag or
mount added there is covered here without a second list; hence this lives beside them, and
spec/ imports none of render/. `parse_checked_spec` is spec.cluster.parse_spec and this check:
what the operator reconciles.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from laps_operator.naming import OPERATOR_KEY_PREFIX, ClusterRef, component_labels
from laps_operator.render.engine_args import owned_engine_flags, plugin_env_fields
from laps_operator.render.workloads import (
    USER_OVERRIDABLE_ENV,
    build_decode_deployment,
    build_gateway_deployment,
    build_prefill_statefulset,
    operator_env,
)
from laps_operator.spec.cluster import ClusterSpec, InvalidSpecError, parse_spec

ROLES = ("prefill", "decode")


def _flag_name(arg: str) -> str | None:
    # `--port 9000` and `--port=9000` alike; values (not starting with "-") are not flags.
    return arg.partition("=")[0] if arg.startswith("-") else None


def _abbreviated(name: str, owned: Iterable[str]) -> list[str]:
    """The owned flags `name` abbreviates: both engines' parsers (argparse) take any unambiguous
    prefix of a flag for it, so `--po 9000` is `--port 9000`. Sound because no real flag of
    either engine that is not owned itself is a prefix of an owned one (an exact flag wins
    over an abbreviation; the unit tests check the builtin engine's parser, and SGLang 0.5.23's
    own: only `--model`, owned, is a prefix of `--model-path`)."""
    if not name.startswith("--") or name == "--":  # `--` ends the options: no flag
        return []
    return sorted(flag for flag in owned if flag.startswith(name) and flag != name)


def _as_given(args: list[str], i: int, rendered: tuple[str, ...]) -> tuple[str, ...]:
    """extraArgs[i] with its value, shaped as the operator renders the flag: (`--x`,) for a
    switch, (`--x`, value) for an option, from `--x value` or `--x=value`."""
    name, eq, value = args[i].partition("=")
    if eq:
        return (name, value)
    if len(rendered) == 2 and i + 1 < len(args):
        return (name, args[i + 1])
    return (name,)


def extra_args_problem(spec: ClusterSpec) -> str | None:
    """engine.extraArgs naming a flag the operator sets on either role (extraArgs go to both),
    unless with the very value it renders there: `--enable-metrics` or `--host 0.0.0.0` written
    out as well is harmless, and such specs ran before this check existed."""
    owned: dict[str, list] = {}
    for role in ROLES:
        for flag in owned_engine_flags(spec, role):
            for name in flag.names:
                owned.setdefault(name, []).append(flag)
    args = list(spec.engine.extra_args)
    for i, arg in enumerate(args):
        if (name := _flag_name(arg)) is None:
            continue
        if name not in owned:
            if flags := _abbreviated(name, owned):
                return (f"engine.extraArgs: {name} would be read as {' or '.join(flags)} (the engine takes a "
                        f"flag's abbreviations), which the operator sets: write out in full the flag you mean")
            continue
        flags = owned[name]
        if all(f.tokens and _as_given(args, i, f.tokens) == f.tokens for f in flags):
            continue
        flag, rendered = flags[0], " ".join(next((f.tokens for f in flags if f.tokens), ()))
        if flag.field is None:
            sets = f"sets {rendered} itself" if rendered else "sets it itself"
            return f"engine.extraArgs: {name} is not yours to change: the operator {sets}; remove it"
        return f"engine.extraArgs: {name} is set by the operator from {flag.field}: set that instead"
    return None


def env_problem(spec: ClusterSpec) -> str | None:
    """engine.env naming a variable the operator sets on either role's engines."""
    fields = {name: field for role in ROLES for name, (field, _) in plugin_env_fields(spec, role).items()}
    owned = {e["name"] for role in ROLES for e in operator_env(spec, role)} - USER_OVERRIDABLE_ENV
    for entry in spec.engine.env:
        name = entry["name"]
        if name not in owned:
            continue
        if field := fields.get(name):
            return f"engine.env: {name} is set by the operator from {field}: set that instead"
        return f"engine.env: {name} is set by the operator, and the engines rely on the value it sets: remove it"
    return None


def _inside(path: str, parent: str) -> bool:
    parent = parent.rstrip("/")
    return path.startswith(parent + "/")


def _clash(mounts: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Two mounts of one container that cannot both be: the same path (the API server refuses
    the pod), or one inside a read-only one (the runtime cannot create its mount point there)."""
    mounts = list(mounts)
    for a in mounts:
        for b in mounts:
            if a is b:
                continue
            if a["mountPath"].rstrip("/") == b["mountPath"].rstrip("/") or (
                    b.get("readOnly") and _inside(a["mountPath"], b["mountPath"])):
                return a, b
    return None


def mount_problem(spec: ClusterSpec) -> str | None:
    """model.mountPath on or inside (or around) a path the operator mounts in some pod. The
    operator's own mounts never clash with each other, so one of the pair is the model's."""
    if spec.model.volume is None:
        return None  # the model is in the image: nothing is mounted at mountPath
    cluster = ClusterRef("check", "default", "")
    for workload in (build_prefill_statefulset(cluster, spec), build_decode_deployment(cluster, spec),
                     build_gateway_deployment(cluster, spec)):
        role = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        for container in workload["spec"]["template"]["spec"]["containers"]:
            if (pair := _clash(container.get("volumeMounts") or ())) is None:
                continue
            inner, outer = pair
            model, other = pair if inner["name"] == "model" else pair[::-1]
            where = f"the operator's {other['name']} volume, mounted at {other['mountPath']} in the {role} pods"
            if inner["mountPath"].rstrip("/") == outer["mountPath"].rstrip("/"):
                return f"model.mountPath: {model['mountPath']} is the path of {where}: choose another path"
            return (f"model.mountPath: {model['mountPath']} and {where}: {inner['mountPath']} would lie inside "
                    f"the read-only {outer['mountPath']}, where no mount point can be made: choose another path")
    return None


def _owned_key_problem(field: str, key: str, operator_labels: dict[str, str]) -> str | None:
    if key in operator_labels:
        return (f"{field}: {key} is one of the labels the operator sets on these pods, which select and "
                "group them (Services, the gateway's discovery, the workload's selector): remove it")
    # Lower-cased: a DNS name, whatever its case, and the API server's own check of annotation
    # keys lower-cases them (label keys with capitals in the prefix never get this far).
    if key.lower().startswith(OPERATOR_KEY_PREFIX):
        return (f"{field}: {key}: keys under {OPERATOR_KEY_PREFIX} are the operator's (its labels, the "
                f"short/long group it moves prefill pods between, {OPERATOR_KEY_PREFIX}last-applied): "
                "choose another prefix")
    return None


def metadata_problem(spec: ClusterSpec) -> str | None:
    """A pod label or annotation, or a gateway Service annotation, with a key the operator sets:
    the operator's value would silently win (workloads.py merges its labels last)."""
    for role in ("prefill", "decode", "gateway"):
        placement = getattr(spec, role)
        labels = component_labels("check", role)  # what the templates carry (workloads.py)
        for field, keys, owned in (("podLabels", placement.pod_labels, labels),
                                   ("podAnnotations", placement.pod_annotations, {})):
            for key in keys:
                if problem := _owned_key_problem(f"{role}.{field}", key, owned):
                    return problem
    for key in spec.gateway.service_annotations:
        if problem := _owned_key_problem("gateway.serviceAnnotations", key, {}):
            return problem
    return None


def override_problem(spec: ClusterSpec) -> str | None:
    return extra_args_problem(spec) or env_problem(spec) or mount_problem(spec) or metadata_problem(spec)


def parse_checked_spec(raw: dict[str, Any] | None) -> ClusterSpec:
    """A CR's `spec` validated and defaulted (parse_spec), then checked for what it may not take
    back from the operator; InvalidSpecError, with a message naming the field, otherwise."""
    spec = parse_spec(raw)
    if problem := override_problem(spec):
        raise InvalidSpecError(f"spec.{problem}")
    return spec
