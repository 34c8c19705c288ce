"""Formats of spec values that the API server or the operator itself would refuse later (pure).

A quantity the API server refuses ("2 GB", "two", "-1") would get the workloads refused one
write at a time, a Prometheus URL that does not parse would fail every allocation interval;
checked when the spec is parsed, either gets the InvalidSpec condition naming the field. The
CRD carries the same patterns: the models put them in its schema (crd.py).

The patterns are matched whole here (re.fullmatch): Python's `$` also matches before a final
newline, so re.match would let `team\n` through, which the API server (Go's `$`: the end of the
text; pydantic's `pattern=`, Rust's: the same) refuses.
"""
from __future__ import annotations

import ipaddress
import re
from decimal import Decimal
from urllib.parse import urlsplit

from kubernetes.utils.quantity import parse_quantity  # the official client's parser

# The serialized form of resource.Quantity (what controller-gen writes into CRDs), without the
# sign a container's resources may not have.
QUANTITY_PATTERN = (r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
# A base URL: the allocation loop appends /api/v1/query.
PROMETHEUS_URL_PATTERN = r"^(https?://[^\s/?#]+(/[^\s?#]*)?)?$"
# A label key (and an annotation's, lower-cased) is a qualified name: an optional DNS-subdomain
# prefix (at most 253 characters) and '/', then a name of at most 63. A toleration's key is one, or
# empty (with operator Exists: every taint); its value a label value. The lengths are checked apart
# (TOLERATION_KEY_MAX_LENGTH is the CRD's maxLength).
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_QUALIFIED_NAME = rf"({_DNS_SUBDOMAIN}/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
DNS_SUBDOMAIN_PATTERN = rf"^{_DNS_SUBDOMAIN}$"  # e.g. a PriorityClass's name, at most 253
# The chart's values.schema.json carries this one, where no code counts the name's 63 characters.
LABEL_KEY_PATTERN = rf"^({_DNS_SUBDOMAIN}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
# The API server lower-cases an annotation's key before it checks it as a label key
# (qualified_name_problem's fold_case): its prefix may hold capitals. The chart's schema carries it.
ANNOTATION_KEY_PATTERN = (rf"^({_DNS_SUBDOMAIN.replace('a-z0-9', 'A-Za-z0-9')}/)?"
                          r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
TOLERATION_KEY_PATTERN = rf"^({_QUALIFIED_NAME})?$"
TOLERATION_KEY_MAX_LENGTH = 253 + 1 + 63
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_VALUE_MAX_LENGTH = 63
# Kubernetes' TotalAnnotationSizeLimitB: the bytes of an object's annotation keys and values.
ANNOTATIONS_MAX_BYTES = 256 * 1024


def qualified_name_problem(key: str, *, fold_case: bool = False) -> str | None:
    """Why the API server would refuse `key` as a label key (or a topology key), or None. With
    `fold_case`, as an annotation key: the API server lower-cases those first (ValidateAnnotations;
    label keys it does not), so `Example.com/x` is a fine annotation but no label."""
    prefix, slash, name = key.rpartition("/")
    if not re.fullmatch(_QUALIFIED_NAME, key.lower() if fold_case else key):
        return (f"{key!r} is not a label or annotation key (an optional DNS-subdomain prefix and '/', then "
                "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)")
    if len(name) > 63 or len(prefix) > 253:
        return f"{key!r}: at most 253 characters before the '/' and 63 after it"
    return None


def annotations_problem(annotations: dict[str, str]) -> str | None:
    """Why the API server would refuse `annotations` on an object, or None."""
    for key in annotations:
        if problem := qualified_name_problem(key, fold_case=True):
            return problem
    size = sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        return f"{size} bytes of keys and values: Kubernetes takes at most {ANNOTATIONS_MAX_BYTES} (256 KiB)"
    return None


def label_value_problem(value: str) -> str | None:
    """Why the API server would refuse `value` as a label value, or None."""
    if len(value) > LABEL_VALUE_MAX_LENGTH or not re.fullmatch(LABEL_VALUE_PATTERN, value):
        return (f"{value!r} is not a label value (at most 63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit)")
    return None


def quantity_problem(value: int | str) -> str | None:
    """Why `value` is no valid container resource quantity, or None."""
    if isinstance(value, bool) or (isinstance(value, int) and value < 0):
        return f"{value!r} is not a quantity (e.g. 500m, 2, 16Gi)"
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        return f"{value!r} is not a quantity (e.g. 500m, 2, 16Gi; no spaces, no sign)"
    return None


def quantity(value: int | str) -> Decimal:
    return Decimal(parse_quantity(value))


def _native(name: str) -> bool:
    # Kubernetes' IsNativeResource: cpu, memory, ephemeral-storage, hugepages-* (no domain) or
    # kubernetes.io/...; anything else (nvidia.com/gpu) is an extended resource.
    return "/" not in name or "kubernetes.io/" in name


def overcommittable(name: str) -> bool:
    """Kubernetes' IsOvercommitAllowed: only native resources other than hugepages may have a
    request below their limit. Extended resources such as nvidia.com/gpu are handed out whole,
    never shared, so their request must equal their limit."""
    return _native(name) and not name.startswith("hugepages-")


# A container's standard resources (IsStandardContainerResourceName); any other name must be
# fully qualified (nvidia.com/gpu), else the API server refuses the workload.
STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
# What an env var's name may be on Kubernetes 1.32 and later (RelaxedEnvironmentVariableValidation,
# on by default): printable ASCII but '='. An older server's stricter rule (a C identifier, '-'
# and '.' allowed) is left to it: the operator's dry run reports its refusal with nothing changed.
ENV_NAME_PATTERN = r"^[ -<>-~]+$"
# resource_name_problem's rule as one pattern, for the chart's schema (the operator's own resources).
RESOURCE_NAME_PATTERN = (rf"^({'|'.join(STANDARD_CONTAINER_RESOURCES)}|hugepages-.+|"
                         rf"{_DNS_SUBDOMAIN}/[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?)$")


def resource_name_problem(name: str) -> str | None:
    """Why the API server would refuse `name` as a container resource, or None."""
    if name in STANDARD_CONTAINER_RESOURCES or (name.startswith("hugepages-") and name != "hugepages-"):
        return None
    if "/" not in name:
        return (f"{name!r} is not a container resource: cpu, memory, ephemeral-storage, hugepages-<size>, "
                "or a fully qualified name such as nvidia.com/gpu")
    return qualified_name_problem(name)


def env_name_problem(name: str) -> str | None:
    """Why a current API server would refuse `name` as an env var's name, or None."""
    if not re.fullmatch(ENV_NAME_PATTERN, name):
        return f"{name!r} is not an environment variable name (printable ASCII characters other than '=')"
    return None


def resource_problem(name: str, value: int | str) -> str | None:
    """Why `value` is no valid quantity of the container resource `name` (or `name` no resource),
    or None."""
    if problem := resource_name_problem(name):
        return problem
    if problem := quantity_problem(value):
        return problem
    if not _native(name) and quantity(value) != quantity(value).to_integral_value():
        return f"{value!r} is not a whole number (Kubernetes counts extended resources in units)"
    return None


def requests_over_limits(requests: dict[str, int | str], limits: dict[str, int | str]) -> str | None:
    """The API server refuses a container whose request exceeds its limit, or differs from it for
    a resource it does not overcommit: which one does."""
    for name, value in requests.items():
        if name not in limits:
            continue  # a missing limit of a resource never overcommitted is the request (workloads.py)
        if quantity(value) > quantity(limits[name]):
            return f"requests.{name} ({value}) exceeds limits.{name} ({limits[name]})"
        if not overcommittable(name) and quantity(value) != quantity(limits[name]):
            return (f"requests.{name} ({value}) must equal limits.{name} ({limits[name]}): Kubernetes does "
                    f"not overcommit {name}")
    return None


def url_problem(url: str) -> str | None:
    """Why `url` is no Prometheus base URL ("" is fine: none), or None."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad host or port)
    except ValueError as exc:
        return f"{url!r} is not a URL: {exc}"
    if not re.fullmatch(PROMETHEUS_URL_PATTERN, url):
        return (f"{url!r}: must be empty or an http:// or https:// base URL, e.g. "
                "http://prometheus-operated.monitoring:9090 (no query or fragment)")
    return host_problem(url, parts.hostname or "")


def host_problem(url: str, host: str) -> str | None:
    """Why the allocation loop could never connect to `host`, or None. The pattern above lets
    through what a template with an empty value renders (`http://:9090`,
    `http://prometheus..svc:9090`); the HTTP client refuses those only when it connects, every
    interval, with an error that does not name the field."""
    if not host:
        return f"{url!r} is not a URL: it names no host"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        host.encode("idna")  # what the resolver is asked for: labels of 1 to 63 characters
    except UnicodeError:
        return f"{url!r} is not a URL: each dot-separated part of the host {host!r} needs 1 to 63 characters"
    return None
