"""`laps local` as a user runs it: starts, answers the openai client, and Ctrl-C leaves no
process behind."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai

from tests.support.fixtures_gateway import poll


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_laps_local_serves_and_stops_cleanly(tiny_engine_model, tmp_path):
    argv = [sys.executable, "-m", "laps_agent.cli", "local", "--model", str(tiny_engine_model),
            "--prefill", "2", "--decode", "1", "--port", "0", "--length-threshold", "16",
            "--workdir", str(tmp_path), "--torch-threads", "1", "--kv-pages", "512",
            "--wait-window-ms", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    output: list[str] = []
    engines: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        url = None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            output.append(line)
            if "OpenAI-compatible API:" in line:
                url = line.split("API:")[1].split()[0]
        assert url, "no URL printed:\n" + "".join(output)
        assert any("ready" in line for line in output)  # progress while loading
        engines = _descendants(proc.pid)
        assert len(engines) >= 3

        client = openai.OpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4)
        assert reply.choices[0].message.content
        client.close()
        status = httpx.get(url.removesuffix("/v1") + "/laps_status").json()
        assert [len(status["groups"][g]["pods"]) for g in ("short", "long")] == [1, 1]
        for group in ("short", "long"):  # each engine reports the group it was put in
            pod_url = status["groups"][group]["pods"][0]["url"]
            assert httpx.get(pod_url + "/get_server_info").json()["prefill_group"] == group

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, "".join(output)
        poll(lambda: not any(_alive(pid) for pid in engines), timeout=30,
             message="every engine process to be gone")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in engines:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
