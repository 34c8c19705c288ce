"""What the CR may not take back from the operator (engine.extraArgs, engine.env, model.mountPath
on what the operator sets or mounts) and what the operator sets so the pods work as the CR says:
SGLang on the CPU without GPUs, a gateway Service on a privileged port."""
from __future__ import annotations

import re

import pytest

from laps_operator.render.builders import build_children, build_services
from laps_operator.render.engine_args import owned_engine_flags
from laps_operator.render.overrides import parse_checked_spec as parse_spec
from laps_operator.render.pod_security import RUN_AS_ID
from laps_operator.spec.cluster import InvalidSpecError
from tests.unit.operator.test_builders import CLUSTER, container, flag, spec_of

SGLANG = {"backend": "sglang", "image": "sglang:laps"}
PVC = {"persistentVolumeClaim": {"claimName": "models"}}


def workloads(spec) -> dict[str, dict]:
    return {c["metadata"]["name"]: c for c in build_children(CLUSTER, spec) if c["kind"] in ("StatefulSet", "Deployment")}


def refused(says: str, **spec: object) -> None:
    with pytest.raises(InvalidSpecError, match=re.escape(says)):
        spec_of(**spec)


OWNED_FLAGS = [
    ({}, ["--port", "9000"], "--port is not yours to change: the operator sets --port 30000 itself; remove it"),
    ({}, ["--port=9000"], "--port is not yours to change"),
    (SGLANG, ["--enable-metrics=false"], "--enable-metrics is not yours to change: the operator sets --enable-metrics"),
    ({}, ["--no-prefix-cache"], "--no-prefix-cache is set by the operator from laps.prefixCache: set that instead"),
    # Prefill-only flags too: extraArgs go to both roles.
    ({}, ["--wait-window-ms", "3"], "--wait-window-ms is set by the operator from laps.scheduler.waitWindowMs"),
    # Unset, the field still says what the flag should be: one place for it.
    ({}, ["--max-queued-requests", "5"], "--max-queued-requests is set by the operator from engine.maxQueuedRequests"),
    (SGLANG, ["--model", "/elsewhere"], "--model is set by the operator from model.path"),
    (SGLANG, ["--tensor-parallel-size=2"], "--tensor-parallel-size is set by the operator from prefill.tensorParallelSize"),
    (SGLANG, ["--disaggregation-mode", "null"], "--disaggregation-mode is not yours to change"),
    (SGLANG, ["--disaggregation-bootstrap-port", "9999"], "--disaggregation-bootstrap-port is not yours to change"),
    (SGLANG, ["--disable-radix-cache"], "--disable-radix-cache is set by the operator from laps.prefixCache"),
    (SGLANG, ["--cuda-graph-config", "{}"], "--cuda-graph-config is set by the operator from laps.batchPrefillGraphs"),
    (SGLANG | {"device": "cpu"}, ["--device", "cuda"], "--device is set by the operator from engine.device"),
    # On auto nothing is rendered, yet the pods hold GPUs: SGLang on the CPU would leave them idle.
    (SGLANG, ["--device", "cpu"], "--device is set by the operator from engine.device: set that instead"),
    # argparse takes an unambiguous prefix for the flag: `--po 9000` is `--port 9000`.
    ({}, ["--po", "9000"], "--po would be read as --port (the engine takes a flag's abbreviations), which the "
                           "operator sets: write out in full the flag you mean"),
    (SGLANG, ["--dev=cpu"], "--dev would be read as --device"),
    (SGLANG, ["--tp", "2"], "--tp would be read as --tp-size"),
]


@pytest.mark.parametrize(("engine", "extra_args", "says"), OWNED_FLAGS, ids=[" ".join(a) for _, a, _ in OWNED_FLAGS])
def test_extra_args_may_not_override_a_flag_the_operator_sets(engine, extra_args, says):
    refused(f"spec.engine.extraArgs: {says}", engine=engine | {"extraArgs": extra_args})


def _rendered(spec) -> dict[str, set[tuple[str, ...]]]:
    """Each flag of the engines' args -> how it is written there, on every role: (flag,) or
    (flag, value)."""
    forms: dict[str, set[tuple[str, ...]]] = {}
    for name, workload in workloads(spec).items():
        if name.endswith("gateway"):
            continue
        args = container(workload)["args"]
        for i, arg in enumerate(args):
            if arg.startswith("--"):
                value = args[i + 1:i + 2] if i + 1 < len(args) and not args[i + 1].startswith("--") else []
                forms.setdefault(arg, set()).add((arg, *value))
    return forms


@pytest.mark.parametrize("engine", [{}, SGLANG, SGLANG | {"device": "cpu"}], ids=["builtin", "sglang", "sglang-cpu"])
def test_every_flag_the_operator_renders_is_refused_in_extra_args_with_another_value(engine):
    # The refused set is what the builders render, nothing kept beside them.
    rendered = _rendered(spec_of(engine=engine))
    assert "--port" in rendered and ("--model" in rendered or "--model-path" in rendered)
    for arg, forms in rendered.items():
        for form in forms:
            other = [arg, form[1] + "0"] if len(form) == 2 else [f"{arg}=0"]
            refused(f"spec.engine.extraArgs: {arg} is ", engine=engine | {"extraArgs": other})
        if len(forms) == 1:
            # Written out with the value the operator renders (on every role it renders it),
            # it changes nothing: accepted, as it was before the check (an upgrade keeps such a CR).
            spec_of(engine=engine | {"extraArgs": list(*forms)})
    # The engine's other flags pass through, last.
    extra = ["--backend", "emulated", "--kv-pages=64"] if not engine else ["--pp-size", "2", "--mem-fraction-static=0.8"]
    spec = spec_of(engine=engine | {"extraArgs": extra})
    assert container(workloads(spec)["demo-prefill"])["args"][-len(extra):] == extra
    if engine:  # with the operator's batch-prefill graphs off, SGLang's graph config is the user's
        spec_of(engine=engine | {"extraArgs": ["--cuda-graph-config", "{}"]},
                laps={"batchPrefillGraphs": {"enabled": False}})


def test_a_flag_written_out_with_the_operators_value_is_accepted_but_one_per_role_is_not():
    spec_of(engine=SGLANG | {"extraArgs": ["--enable-metrics", "--host=0.0.0.0", "--port", "30000"]})
    # The role differs per pool, and extraArgs go to both: no value of it is the operator's.
    refused("spec.engine.extraArgs: --disaggregation-mode is not yours to change",
            engine=SGLANG | {"extraArgs": ["--disaggregation-mode", "prefill"]})


def test_the_builtin_engine_reads_an_abbreviation_as_the_owned_flag_and_nothing_else_is_refused():
    from laps_agent.engine.cli import build_parser

    parser = build_parser()
    # What the check stands on: the engine really takes `--po` for `--port`.
    assert parser.parse_args(["--model", "m", "--po", "9000"]).port == 9000
    spec = spec_of(laps={"scheduler": {"enabled": True}, "batchPrefillGraphs": {"enabled": True}})
    owned = {name for role in ("prefill", "decode") for f in owned_engine_flags(spec, role) for name in f.names}
    real = {option for option in parser._option_string_actions if option.startswith("--")}
    assert owned <= real
    # An exact flag wins over an abbreviation: none of the engine's own flags may be refused as one.
    for option in sorted(real - owned):
        spec_of(engine={"extraArgs": [f"{option}=1"]})


def test_a_gpu_count_on_a_cpu_engine_is_refused_naming_the_pool():
    gpus = {"resources": {"limits": {"nvidia.com/gpu": 1}}}
    refused("spec: prefill.resources nvidia.com/gpu (1) with engine.device cpu: the engine would run on the CPU "
            "while its GPUs sit idle", engine={"device": "cpu"}, prefill=gpus)
    refused("spec: decode.resources nvidia.com/gpu (2) with engine.device cpu",
            engine=SGLANG | {"device": "cpu"}, decode={"resources": {"requests": {"nvidia.com/gpu": "2"}}})
    # None asked for is what a CPU engine holds anyway.
    spec_of(engine={"device": "cpu"}, prefill={"resources": {"limits": {"nvidia.com/gpu": 0}}})


def test_env_may_not_override_a_variable_the_operator_sets():
    refused("spec.engine.env: LAPS_LENGTH_THRESHOLD is set by the operator from laps.lengthThreshold: set that instead",
            engine=SGLANG | {"env": [{"name": "LAPS_LENGTH_THRESHOLD", "value": "64"}]})
    refused("spec.engine.env: POD_IP is set by the operator, and the engines rely on",
            engine={"env": [{"name": "POD_IP", "value": "10.0.0.1"}]})
    # SGLang's advertised KV-transfer address defaults to the pod IP; a multi-NIC or RDMA node
    # may need another, and nothing else relies on it: the user's entry replaces the operator's.
    spec = spec_of(engine=SGLANG | {"env": [{"name": "SGLANG_HOST_IP", "value": "192.168.7.2"}]})
    env = container(workloads(spec)["demo-decode"])["env"]
    assert [e for e in env if e["name"] == "SGLANG_HOST_IP"] == [{"name": "SGLANG_HOST_IP", "value": "192.168.7.2"}]
    spec = spec_of(engine=SGLANG | {"env": [{"name": "OMP_NUM_THREADS", "value": "4"}]})
    assert {"name": "OMP_NUM_THREADS", "value": "4"} in container(workloads(spec)["demo-prefill"])["env"]


def test_sglang_on_the_cpu_holds_no_gpu_and_is_told_to_use_the_cpu():
    cpu = workloads(spec_of(engine=SGLANG | {"device": "cpu"}, decode={"tensorParallelSize": 2}))
    for name in ("demo-prefill", "demo-decode"):
        engine = container(cpu[name])
        assert "nvidia.com/gpu" not in engine["resources"].get("limits", {}), name
        assert flag(engine["args"], "--device") == "cpu"
        assert "--cuda-graph-config" not in engine["args"]
    # On cuda the same pods hold their GPUs and SGLang is told so.
    cuda = container(workloads(spec_of(engine=SGLANG | {"device": "cuda"}))["demo-prefill"])
    assert cuda["resources"]["limits"]["nvidia.com/gpu"] == "1" and flag(cuda["args"], "--device") == "cuda"


def test_a_gateway_service_on_a_privileged_port_targets_an_unprivileged_container_port():
    spec = spec_of(gateway={"port": 80})
    service = next(s for s in build_services(CLUSTER, spec) if s["metadata"]["name"] == "demo-gateway")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    pod = workloads(spec)["demo-gateway"]["spec"]["template"]["spec"]
    gateway = pod["containers"][0]
    http = next(p["containerPort"] for p in gateway["ports"] if p["name"] == "http")
    # A non-root process without NET_BIND_SERVICE can bind only from 1024 up.
    assert pod["securityContext"]["runAsUser"] == RUN_AS_ID != 0
    assert gateway["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert http >= 1024 and flag(gateway["args"], "--port") == str(http)
    policy = next(c for c in build_children(CLUSTER, spec) if c["kind"] == "NetworkPolicy"
                  and c["metadata"]["name"] == "demo-gateway")
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": "http"}]}]   # the pods' port, by name


MOUNT_CLASHES = [
    ({"mountPath": "/tmp"}, {}, "spec.model.mountPath: /tmp is the path of the operator's tmp volume, mounted at /tmp"),
    ({"mountPath": "/tmp/"}, {}, "spec.model.mountPath: /tmp/ is the path of the operator's tmp volume"),
    ({"mountPath": "/etc/podinfo"}, {},
     "spec.model.mountPath: /etc/podinfo is the path of the operator's podinfo volume, mounted at /etc/podinfo in the "
     "prefill pods"),
    ({"mountPath": "/dev/shm"}, {"engine": SGLANG}, "the operator's dshm volume, mounted at /dev/shm"),
    ({"mountPath": "/etc/laps/api-keys"}, {"gateway": {"apiKeysSecret": {"name": "keys"}}},
     "the operator's api-keys volume, mounted at /etc/laps/api-keys in the gateway pods"),
    # The model volume is read-only: no mount point can be made inside it, nor in podinfo.
    ({"mountPath": "/etc"}, {}, "/etc/podinfo would lie inside the read-only /etc"),
    ({"mountPath": "/etc/podinfo/model"}, {}, "/etc/podinfo/model would lie inside the read-only /etc/podinfo"),
]


@pytest.mark.parametrize(("model", "spec", "says"), MOUNT_CLASHES, ids=[m["mountPath"] for m, _, _ in MOUNT_CLASHES])
def test_a_model_mount_path_on_one_of_the_operators_is_refused_naming_both(model, spec, says):
    refused(says, model={"name": "m", "path": "/x/m.gguf", "volume": PVC} | model, **spec)


def test_a_model_mount_path_inside_a_writable_operator_mount_is_accepted_but_not_on_it():
    spec = parse_spec({"model": {"name": "m", "path": "/tmp/models/m.gguf", "volume": PVC, "mountPath": "/tmp/models"}})
    paths = [m["mountPath"] for m in container(workloads(spec)["demo-prefill"])["volumeMounts"]]
    assert "/tmp/models" in paths and "/tmp" in paths  # inside the writable /tmp emptyDir
    # Without a volume nothing is mounted at mountPath; with one, not on /tmp itself.
    parse_spec({"model": {"name": "m", "path": "/tmp/m.gguf", "mountPath": "/tmp"}})
    refused("spec.model.mountPath: /tmp is the path", model={"name": "m", "path": "/tmp/m", "volume": PVC,
                                                             "mountPath": "/tmp"})
