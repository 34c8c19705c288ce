"""Chart values a platform engineer commonly sets, beyond the defaults: pod metadata, bringing
their own ServiceAccount and RBAC, and the operator's log level."""
from __future__ import annotations

import helm_python
import kubernetes_validate
import pytest

from tests.unit.chart.test_chart import FOREIGN_KINDS, KUBE_VERSION, by_kind, render

RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def _pod(docs: list[dict]) -> dict:
    (deploy,) = by_kind(docs, "Deployment")
    return deploy["spec"]["template"]


def test_pod_annotations_and_labels_reach_the_operator_pod_without_breaking_its_selector():
    from laps_operator.naming import OPERATOR_POD_LABELS

    values = {
        "podAnnotations": {"sidecar.istio.io/inject": "false", "prometheus.io/scrape": "true"},
        # A user label may not take over the labels the Deployment selects on and the gateways'
        # NetworkPolicy admits: those stay the chart's.
        "podLabels": {"team": "ml-platform", "app.kubernetes.io/component": "mine",
                      "app.kubernetes.io/name": "other"},
    }
    docs = render(values, namespace="ops")
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    (deploy,) = by_kind(docs, "Deployment")
    meta = deploy["spec"]["template"]["metadata"]
    assert meta["annotations"] == values["podAnnotations"]
    assert meta["labels"]["team"] == "ml-platform"
    assert deploy["spec"]["selector"]["matchLabels"].items() <= meta["labels"].items()
    assert OPERATOR_POD_LABELS.items() <= meta["labels"].items()
    assert "annotations" not in _pod(render())["metadata"]


def test_pod_annotation_values_must_be_strings():
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"podAnnotations": {"prometheus.io/port": 8080}})
    assert "/podAnnotations/" in str(err.value)


@pytest.mark.parametrize("watch", [[], ["team-a", "team-b"]], ids=["cluster-wide", "namespaced"])
def test_rbac_create_false_renders_no_rbac_and_runs_as_the_named_service_account(watch):
    values = {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "laps-operator"},
              "watchNamespaces": watch}
    docs = render(values, namespace="ops")
    assert not [d["kind"] for d in docs if d["kind"] in RBAC_KINDS]
    assert not by_kind(docs, "ServiceAccount")
    assert _pod(docs)["spec"]["serviceAccountName"] == "laps-operator"


def test_rbac_create_false_with_a_chart_made_service_account_still_makes_the_account():
    docs = render({"rbac": {"create": False}})
    assert not [d for d in docs if d["kind"] in RBAC_KINDS]
    (sa,) = by_kind(docs, "ServiceAccount")
    assert _pod(docs)["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_an_existing_service_account_must_be_named():
    # Without a name the chart used to bind the operator's rights (patch pods, create workloads
    # and Roles in every watched namespace) to the namespace's `default` ServiceAccount, which
    # every pod there runs as unless told otherwise.
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"serviceAccount": {"create": False}})
    assert "/serviceAccount" in str(err.value) and "name" in str(err.value)
    docs = render({"serviceAccount": {"create": False, "name": "default"}})   # said explicitly: fine
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "default"


def test_every_log_level_the_operator_accepts_is_a_value():
    from laps_operator.cli import build_parser

    (action,) = [a for a in build_parser()._actions if a.dest == "log_level"]
    for level in action.choices:
        (ctr,) = _pod(render({"logLevel": level}))["spec"]["containers"]
        assert f"--log-level={level}" in ctr["args"]


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        # Misspelt, the API server drops the key with a warning: the operator pod would lack the
        # toleration or affinity its installer asked for and stay Pending (or land elsewhere).
        ({"tolerations": [{"key": "dedicated", "operater": "Exists", "effect": "NoSchedule"}]}, "/tolerations/0"),
        ({"tolerations": [{"key": "dedicated", "operator": "Exist"}]}, "/tolerations/0/operator"),
        ({"tolerations": [{"key": "d", "operator": "Exists", "effect": "NoSchedul"}]}, "/tolerations/0/effect"),
        ({"affinity": {"nodeAfinity": {}}}, "/affinity"),
    ],
)
def test_misspelt_placement_is_refused_naming_it(values, fragment):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert fragment in str(err.value)


def test_kubernetes_tolerations_and_affinity_pass():
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"},
                   {"operator": "Exists"},
                   {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 30}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    spec = _pod(render({"tolerations": tolerations, "affinity": affinity}))["spec"]
    assert (spec["tolerations"], spec["affinity"]) == (tolerations, affinity)


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
READ = {("laps.io", r, v) for r in ("lapsclusters", "lapsclusters/status") for v in ("get", "list", "watch")}
MANAGE = READ | {("laps.io", "lapsclusters", v) for v in ("create", "update", "patch", "delete")}


def _aggregated(docs: list[dict]) -> dict[str, set]:
    """The built-in role each aggregated ClusterRole feeds ("view", "edit", "admin") -> the
    (group, resource, verb) it adds there."""
    into: dict[str, set] = {}
    for role in by_kind(docs, "ClusterRole"):
        for label, value in role["metadata"]["labels"].items():
            if label.startswith(AGGREGATE) and value == "true":
                into.setdefault(label[len(AGGREGATE):], set()).update(
                    (g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
                    for r in rule["resources"] for v in rule["verbs"])
    return into


@pytest.mark.parametrize("watch", [[], ["team-a"]], ids=["cluster-wide", "namespaced"])
def test_built_in_roles_get_lapscluster_rights_through_aggregation(watch):
    """A namespace user bound to `view` could not `kubectl get laps`, nor one bound to `edit` or
    `admin` apply a LAPSCluster: a CRD's objects belong to no built-in role until a ClusterRole
    labelled to aggregate into it grants them. Status stays the operator's to write."""
    docs = render({"watchNamespaces": watch})
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    assert _aggregated(docs) == {"view": READ, "edit": MANAGE, "admin": MANAGE}
    # Granted to no one by the chart itself: only the aggregation controller reads them.
    aggregated = {r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")
                  if any(k.startswith(AGGREGATE) for k in r["metadata"]["labels"])}
    bound = {b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding")}
    assert aggregated and not aggregated & bound


def test_releases_of_one_name_in_two_namespaces_do_not_claim_the_same_cluster_roles():
    # One operator per set of watched namespaces: each release ships its own copy, and Helm
    # refuses to install an object another release owns.
    names = [{r["metadata"]["name"] for r in by_kind(render({"watchNamespaces": [team]}, namespace=f"{team}-ops"),
                                                     "ClusterRole")} for team in ("team-a", "team-b")]
    assert names[0] and not names[0] & names[1]


@pytest.mark.parametrize("rbac", [{"aggregateToDefaultRoles": False}, {"create": False}],
                         ids=["aggregation-off", "rbac-create-false"])
def test_no_aggregated_roles_when_turned_off_or_without_rbac(rbac):
    docs = render({"rbac": rbac})
    assert _aggregated(docs) == {}
    # Turning aggregation off leaves the operator's own rights as they were.
    assert bool(by_kind(docs, "ClusterRoleBinding")) == rbac.get("create", True)


def test_aggregation_value_must_be_a_boolean():
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"rbac": {"aggregateToDefaultRoles": "yes"}})
    assert "/rbac/aggregateToDefaultRoles" in str(err.value)


def test_env_reaches_the_operator_container_after_the_charts_own():
    """The operator reads settings from its environment (LAPS_OPERATOR_RESYNC_SECONDS, ...:
    docs/contracts.md), which the chart gave no way to set."""
    env = [{"name": "LAPS_OPERATOR_RESYNC_SECONDS", "value": "30"},
           {"name": "HTTPS_PROXY", "valueFrom": {"secretKeyRef": {"name": "proxy", "key": "url"}}},
           {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    docs = render({"env": env})
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    (ctr,) = _pod(docs)["spec"]["containers"]
    assert ctr["env"] == [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                          *env]
    (ctr,) = _pod(render())["spec"]["containers"]
    assert [e["name"] for e in ctr["env"]] == ["POD_NAMESPACE"]


def test_env_may_not_replace_the_operators_namespace():
    # A later duplicate wins: the gateways' NetworkPolicy would then admit the operator's pods
    # from another namespace than theirs, cutting the operator off from the pressure it reads.
    with pytest.raises(helm_python.HelmError) as err:
        render({"env": [{"name": "POD_NAMESPACE", "value": "elsewhere"}]})
    assert "env: POD_NAMESPACE is set by the chart" in str(err.value)


@pytest.mark.parametrize(("entry", "fragment"), [
    # The API server refuses a number (`value: 30` in YAML): the install would fail at apply time.
    ({"name": "LAPS_OPERATOR_RESYNC_SECONDS", "value": 30}, "/env/0/value"),
    # Misspelt, the field would be dropped: the variable set empty.
    ({"name": "TOKEN", "valueForm": {"secretKeyRef": {"name": "s", "key": "k"}}}, "/env/0"),
    ({"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s"}}}, "/env/0/valueFrom/secretKeyRef"),
    ({"name": "TOKEN", "valueFrom": {"secretRef": {"name": "s", "key": "k"}}}, "/env/0/valueFrom"),
    ({"value": "30"}, "/env/0"),
    ({"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, "/env/0"),
])
def test_env_entries_that_are_not_kubernetes_env_vars_are_refused_naming_them(entry, fragment):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"env": [entry]})
    assert fragment in str(err.value)


@pytest.mark.parametrize("interval", ["30s", "1m30s", "2m", "500ms", "1h"])
def test_the_service_monitor_takes_every_prometheus_duration(interval):
    docs = render({"metrics": {"serviceMonitor": {"enabled": True, "interval": interval}}})
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert [e["interval"] for e in monitor["spec"]["endpoints"]] == [interval]


@pytest.mark.parametrize("interval", ["", "1 min", "90", "1.5m", "30S"])
def test_a_service_monitor_interval_prometheus_would_refuse_is_refused(interval):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"metrics": {"serviceMonitor": {"enabled": True, "interval": interval}}})
    assert "/metrics/serviceMonitor/interval" in str(err.value)


@pytest.mark.parametrize(("values", "fragment"), [
    # Each rendered, then refused by the API server at install (or, for the label, a YAML map
    # with the key twice: the chart's own label replaced or the install failed, by parser).
    ({"podLabels": {"bad key": "x"}}, "invalid propertyName 'bad key'"),
    ({"podLabels": {"team": "ml ops"}}, "/podLabels/team"),
    ({"podLabels": {"example.com/" + "n" * 64: "x"}}, "invalid propertyName"),   # a name of at most 63
    ({"env": [{"name": "A=B", "value": "y"}]}, "/env/0/name"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "tolerationSeconds": 5}]}, "/tolerations/0"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]},
     "/tolerations/0/effect"),
    ({"resources": {"limits": {"memory": "512 MB"}}}, "/resources/limits/memory"),
    ({"resources": {"requests": {"cpu": -1}}}, "/resources/requests/cpu"),
    ({"grafana": {"dashboards": {"label": "app.kubernetes.io/name"}}}, "/grafana/dashboards/label"),
    ({"grafana": {"dashboards": {"label": "grafana dashboard"}}}, "/grafana/dashboards/label"),
    ({"grafana": {"dashboards": {"labelValue": "yes please"}}}, "/grafana/dashboards/labelValue"),
    ({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"helm.sh/chart": "x"}}}},
     "/metrics/serviceMonitor/labels"),
    # Tolerations Kubernetes' ValidateTolerations refuses (the operator's own Toleration does).
    ({"tolerations": [{"effect": "NoSchedule"}]}, "/tolerations/0"),   # no key: operator Exists
    ({"tolerations": [{}]}, "/tolerations/0"),
    ({"tolerations": [{"key": "gpu", "operator": "Exists", "value": "true"}]}, "/tolerations/0/value"),
    ({"tolerations": [{"key": "gpu", "operator": "Equal", "value": "a b"}]}, "/tolerations/0/value"),
    ({"tolerations": [{"key": "bad key", "operator": "Exists"}]}, "/tolerations/0/key"),
    # Node labels, annotation keys and resource names, as the API server checks them.
    ({"nodeSelector": {"pool": "gpu nodes"}}, "/nodeSelector/pool"),
    ({"nodeSelector": {"bad key": "x"}}, "invalid propertyName 'bad key'"),
    ({"podAnnotations": {"bad key": "x"}}, "invalid propertyName 'bad key'"),
    ({"grafana": {"dashboards": {"annotations": {"bad key": "x"}}}}, "invalid propertyName 'bad key'"),
    ({"resources": {"limits": {"gpu": 1}}}, "invalid propertyName 'gpu'"),
])
def test_values_the_api_server_would_refuse_are_refused_naming_them(values, fragment):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert fragment in str(err.value)


def test_near_misses_the_api_server_takes_render():
    docs = render({"podLabels": {"example.com/team": "ml-ops", "tier": "", "example.com/" + "n" * 63: "x"},
                   "nodeSelector": {"node.kubernetes.io/instance-type": "m5.large", "pool": ""},
                   # The API server lower-cases annotation keys before it checks them.
                   "podAnnotations": {"Example.com/Owner": "ml", "checksum/config": "abc"},
                   "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}, {"name": "_a.b-c", "value": "1"},
                           {"name": "1 X", "value": "1"}],
                   "tolerations": [{"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5},
                                   {"operator": "Exists"}, {"key": "", "operator": "Exists", "value": ""},
                                   {"key": "a", "value": "b"}],   # Equal, the default operator
                   "resources": {"limits": {"memory": "512Mi", "cpu": 1, "example.com/fpga": 1},
                                 "requests": {"cpu": "250m", "hugepages-2Mi": "0", "ephemeral-storage": "1Gi"}},
                   "grafana": {"dashboards": {"enabled": True, "label": "grafana_dashboard", "labelValue": "1"}},
                   "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}}}})
    assert _pod(docs)["metadata"]["labels"]["example.com/team"] == "ml-ops"


def test_the_charts_formats_are_the_operators():
    """One rule for what a label, a quantity or an env name is: the operator's (formats.py)."""
    import json

    from laps_operator.spec import formats
    from tests.unit.chart.test_chart import CHART
    definitions = json.loads((CHART / "values.schema.json").read_text())["definitions"]
    assert definitions["labelKey"]["pattern"] == formats.LABEL_KEY_PATTERN
    assert definitions["labelValue"]["pattern"] == formats.LABEL_VALUE_PATTERN
    assert definitions["quantity"]["oneOf"][0]["pattern"] == formats.QUANTITY_PATTERN
    assert definitions["annotationKey"]["pattern"] == formats.ANNOTATION_KEY_PATTERN
    assert definitions["resourceName"]["pattern"] == formats.RESOURCE_NAME_PATTERN
    env_name = json.loads((CHART / "values.schema.json").read_text())["properties"]["env"]
    assert env_name["items"]["properties"]["name"]["pattern"] == formats.ENV_NAME_PATTERN


def test_resource_names_are_the_operators_rule():
    """The chart's pattern says what formats.resource_name_problem says of the same names."""
    import re

    from laps_operator.spec import formats

    for name in ("cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "nvidia.com/gpu", "example.com/x_y.z",
                 "gpu", "CPU", "hugepages-", "/gpu", "nvidia.com/", "Nvidia.com/gpu", "a b/c", "x.io/" + "n" * 64):
        assert bool(re.fullmatch(formats.RESOURCE_NAME_PATTERN, name)) == (formats.resource_name_problem(name) is None), name


def test_the_chart_installs_as_a_subchart(tmp_path):
    """An umbrella chart (Argo CD, helmfile) hands its dependency a `global` map and, with the
    usual `condition: laps.enabled`, its `enabled`: the schema refused both, so the chart could
    not be a dependency at all."""
    import shutil

    import yaml

    from tests.unit.chart.test_chart import CHART

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (tmp_path / "charts").mkdir()
    shutil.copytree(CHART, tmp_path / "charts" / "laps")
    (tmp_path / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "platform", "version": "1.0.0",
        "dependencies": [{"name": "laps", "version": chart["version"], "condition": "laps.enabled"}]}))
    (tmp_path / "values.yaml").write_text(yaml.safe_dump({"global": {"imageRegistry": "registry.example.com"},
                                                          "laps": {"enabled": True, "logLevel": "debug"}}))
    umbrella = helm_python.Chart.load(tmp_path)
    out = umbrella.render({}, name="platform", namespace="ml", is_install=True)
    docs = [d for path, text in out.items() if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]
    (ctr,) = _pod(docs)["spec"]["containers"]
    assert "--log-level=debug" in ctr["args"]
    off = umbrella.render({"laps": {"enabled": False}}, name="platform", namespace="ml", is_install=True)
    assert not [p for p in off if "laps/templates/deployment.yaml" in p and off[p].strip()]


@pytest.mark.parametrize("release", ["laps.v2", "1st", "prod.llm", "a" * 53, "9" * 53, "2024"])
def test_release_names_helm_takes_give_a_service_name_kubernetes_takes(release):
    """Service names are DNS-1035 labels: a letter first, no dots (release names may have both).
    A release, a namespace or a ServiceAccount named by digits alone was written unquoted, a
    YAML number where Kubernetes wants a string (a label value, a namespace): refused."""
    import re

    docs = render({"watchNamespaces": ["42"], "serviceAccount": {"create": False, "name": "7"},
                   "metrics": {"serviceMonitor": {"enabled": True}}}, namespace="2025", release=release)
    for doc in docs:
        if doc["kind"] not in FOREIGN_KINDS:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    assert {d["metadata"]["namespace"] for d in docs if "namespace" in d["metadata"]} == {"2025", "42"}
    (service,) = by_kind(docs, "Service")
    name = service["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name), name
    assert name.endswith("-metrics")


@pytest.mark.parametrize(("resources", "said"), [
    # Helm merges these over values.yaml's requests {cpu: 50m, memory: 128Mi}, limits {memory: 512Mi}.
    ({"requests": {"memory": "1Gi"}}, "requests.memory (1Gi) exceeds limits.memory (512Mi)"),
    ({"limits": {"cpu": "10m"}}, "requests.cpu (50m) exceeds limits.cpu (10m)"),
    ({"requests": {"cpu": "1e3"}, "limits": {"cpu": 999}}, "requests.cpu (1e3) exceeds limits.cpu (999)"),
])
def test_a_request_over_its_limit_is_refused_at_install_naming_both(resources, said):
    with pytest.raises(helm_python.HelmError) as err:
        render({"resources": resources})
    assert said in str(err.value) and "set requests." in str(err.value)


def test_a_quantity_the_check_cannot_read_is_said_not_taken_for_zero():
    # The schema's pattern lets a decimal exponent through; the API server refuses it.
    with pytest.raises(helm_python.HelmError) as err:
        render({"resources": {"requests": {"memory": "1e1.5"}}})
    assert 'requests.memory: cannot read the quantity "1e1.5"' in str(err.value)


def test_requests_up_to_their_limits_render():
    for resources in ({"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}},
                      {"requests": {"memory": "1Gi"}, "limits": {"memory": None}},   # null drops it
                      {"limits": {"cpu": None}},   # one the defaults lack: null still passes
                      {"requests": {"cpu": 1.5}, "limits": {"cpu": "1500m"}},
                      {"requests": {"memory": "1e9"}, "limits": {"memory": "1G"}}):
        (ctr,) = _pod(render({"resources": resources}))["spec"]["containers"]
        assert ctr["resources"].get("requests", {}).items() >= resources.get("requests", {}).items()


def test_a_service_monitor_interval_of_zero_stays_a_string():
    # `interval: 0` rendered bare is an integer, which the ServiceMonitor's CRD (a string) refuses.
    docs = render({"metrics": {"serviceMonitor": {"enabled": True, "interval": "0"}}})
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["interval"] == "0"


def test_a_dashboard_label_yaml_reads_as_a_boolean_stays_the_label_asked_for():
    # `yes: "1"` unquoted is the key true in YAML 1.1: the sidecar looking for `yes` found nothing.
    for label in ("yes", "on", "y", "true"):
        maps = by_kind(render({"grafana": {"dashboards": {"label": label}}}), "ConfigMap")
        assert maps and all(m["metadata"]["labels"][label] == "1" for m in maps), label
