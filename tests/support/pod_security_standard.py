"""A check of pod specs against the `restricted` Pod Security Standard, baseline controls
included, written from the published standard
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), for Linux pods.

`violations(manifest)` takes a Pod, a workload with a pod template (Deployment, StatefulSet,
DaemonSet, ReplicaSet, Job) or a CronJob, and answers one readable line per violated control,
empty when the pod would be admitted into a namespace enforcing `restricted`. Other kinds have
no pod: empty.
"""
from __future__ import annotations

from typing import Any

# Baseline, "Capabilities": what a container may add.
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
# Restricted, "Capabilities": all dropped, only this one added back.
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# Baseline, "Sysctls": the safe set.
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes"})
# Restricted, "Volume Types".
ALLOWED_VOLUME_SOURCES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
    "secret"})
# Baseline, "SELinux".
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
SECCOMP_RESTRICTED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"

_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"})


def pod_of(manifest: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(metadata, spec) of the pod a manifest makes, None for kinds that make none."""
    kind = manifest.get("kind")
    if kind == "Pod":
        return manifest.get("metadata") or {}, manifest.get("spec") or {}
    if kind == "CronJob":
        manifest = manifest["spec"]["jobTemplate"]
    elif kind not in _TEMPLATE_KINDS:
        return None
    template = manifest["spec"]["template"]
    return template.get("metadata") or {}, template.get("spec") or {}


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{field}[{c.get('name')}]", c) for field in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(field) or []]


def _handlers(container: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Probe and lifecycle handlers (baseline, "Host Probes / Lifecycle Hooks")."""
    found = [(probe, container[probe]) for probe in ("livenessProbe", "readinessProbe", "startupProbe")
             if container.get(probe)]
    found += [(f"lifecycle.{hook}", h) for hook, h in (container.get("lifecycle") or {}).items() if h]
    return found


def _selinux(where: str, options: dict[str, Any] | None) -> list[str]:
    if not options:
        return []
    out = []
    if options.get("type", "") not in SELINUX_TYPES:
        out.append(f"{where}.seLinuxOptions.type {options['type']!r} is not allowed")
    out += [f"{where}.seLinuxOptions.{key} must be unset" for key in ("user", "role") if options.get(key)]
    return out


def _apparmor(where: str, profile: dict[str, Any] | None) -> list[str]:
    if profile and profile.get("type") not in APPARMOR_TYPES:
        return [f"{where}.appArmorProfile.type {profile.get('type')!r} is not allowed"]
    return []


def _pod_level(meta: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    out = [f"spec.{host} must not be true" for host in ("hostNetwork", "hostPID", "hostIPC") if spec.get(host)]
    ctx = spec.get("securityContext") or {}
    if (ctx.get("windowsOptions") or {}).get("hostProcess"):
        out.append("spec.securityContext.windowsOptions.hostProcess must not be true")
    for volume in spec.get("volumes") or []:
        sources = set(volume) - {"name"}
        if "hostPath" in sources:
            out.append(f"volume {volume.get('name')!r}: hostPath volumes are forbidden")
        elif not sources <= ALLOWED_VOLUME_SOURCES:
            out.append(f"volume {volume.get('name')!r}: type {sorted(sources)} is not allowed")
    for sysctl in ctx.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')!r} is not in the safe set")
    out += _selinux("spec.securityContext", ctx.get("seLinuxOptions"))
    out += _apparmor("spec.securityContext", ctx.get("appArmorProfile"))
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and not (value == "runtime/default" or value.startswith("localhost/")):
            out.append(f"annotation {key}: {value!r} is not allowed")
    if ctx.get("runAsUser") == 0:
        out.append("spec.securityContext.runAsUser must not be 0")
    if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("spec.securityContext.seccompProfile.type must not be Unconfined")
    return out


def _container_level(spec: dict[str, Any], where: str, container: dict[str, Any]) -> list[str]:
    pod_ctx = spec.get("securityContext") or {}
    ctx = container.get("securityContext") or {}
    out = []
    if ctx.get("privileged"):
        out.append(f"{where}: privileged must not be true")
    if (ctx.get("windowsOptions") or {}).get("hostProcess"):
        out.append(f"{where}: windowsOptions.hostProcess must not be true")
    out += [f"{where}: hostPort {p['hostPort']} is forbidden" for p in container.get("ports") or []
            if p.get("hostPort")]
    for name, handler in _handlers(container):
        for action in ("httpGet", "tcpSocket"):
            if (handler.get(action) or {}).get("host"):
                out.append(f"{where}: {name}.{action}.host must be unset")
    if ctx.get("procMount", "Default") != "Default":
        out.append(f"{where}: procMount must be Default")
    out += _selinux(where, ctx.get("seLinuxOptions"))
    out += _apparmor(where, ctx.get("appArmorProfile"))
    if ctx.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}: allowPrivilegeEscalation must be false")
    # runAsNonRoot: the container's own value, else the pod's; false anywhere fails.
    if ctx.get("runAsNonRoot") is False or not (ctx.get("runAsNonRoot") or pod_ctx.get("runAsNonRoot")):
        out.append(f"{where}: runAsNonRoot must be true (on the pod or the container)")
    if ctx.get("runAsUser") == 0:
        out.append(f"{where}: runAsUser must not be 0")
    seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
    if seccomp not in SECCOMP_RESTRICTED:
        out.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (got {seccomp!r})")
    capabilities = ctx.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        out.append(f"{where}: capabilities.drop must include ALL")
    added = set(capabilities.get("add") or [])
    if not added <= BASELINE_CAPABILITIES:
        out.append(f"{where}: capabilities {sorted(added - BASELINE_CAPABILITIES)} exceed baseline")
    elif not added <= RESTRICTED_CAPABILITIES:
        out.append(f"{where}: only NET_BIND_SERVICE may be added, not {sorted(added - RESTRICTED_CAPABILITIES)}")
    return out


def violations(manifest: dict[str, Any]) -> list[str]:
    pod = pod_of(manifest)
    if pod is None:
        return []
    meta, spec = pod
    out = _pod_level(meta, spec)
    for where, container in _containers(spec):
        out += _container_level(spec, where, container)
    return out
