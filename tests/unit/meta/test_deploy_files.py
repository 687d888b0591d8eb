"""The deployment files of docs/servers.md hold together: the Job resumes a paused run in a new pod and fails on
anything else, its Service reaches the pod's monitor ports, the systemd unit is a template whose instance is the
run id, and the Dockerfile installs this checkout as an unprivileged user. (The command line both use,
`legion run --run-id ID --or-resume`, runs for real in tests/integration/test_cli_or_resume.py.)"""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]


def _manifests() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((ROOT / "docs" / "legion-job.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


def test_the_job_resumes_a_paused_run_in_a_new_pod_and_fails_on_any_other_exit() -> None:
    job = _manifests()["Job"]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    ignored = [r for r in rules if r["action"] == "Ignore" and "onExitCodes" in r]
    assert ignored and ignored[0]["onExitCodes"]["values"] == [130]
    assert any(r["action"] == "FailJob" and r["onExitCodes"]["operator"] == "NotIn" for r in rules)
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    args = pod["containers"][0]["args"]
    assert "--or-resume" in args and args[args.index("--run-id") + 1] == job["metadata"]["name"].removeprefix("legion-")


def test_the_pod_has_its_volume_its_task_a_home_and_keys_it_can_read() -> None:
    kinds = _manifests()
    pod = kinds["Job"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["work"]["persistentVolumeClaim"]["claimName"] == kinds["PersistentVolumeClaim"]["metadata"]["name"]
    assert kinds["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert volumes["task"]["configMap"]["name"] == kinds["ConfigMap"]["metadata"]["name"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HOME"].startswith("/work/") and {"GIT_AUTHOR_NAME", "GIT_COMMITTER_EMAIL"} <= set(env)
    ledger = next(e for e in container["env"] if e["name"] == "LEGION_LEDGER_URL")  # from a Secret, never inline
    assert ledger["valueFrom"]["secretKeyRef"]["optional"] is True
    assert "mkdir -p /work/home" in pod["initContainers"][0]["command"][-1]
    assert volumes["monitor-keys"]["secret"]["defaultMode"] & 0o040  # owned by root, group fsGroup
    task = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "task")
    assert f"@{task}/TASK.md" in container["args"]


def test_the_service_reaches_the_pods_monitor_ports() -> None:
    kinds = _manifests()
    template = kinds["Job"]["spec"]["template"]
    service = kinds["Service"]["spec"]
    assert service["selector"].items() <= template["metadata"]["labels"].items()
    container = template["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    monitor = container["args"][container["args"].index("--monitor") + 1]
    assert monitor.endswith(f":{ports['monitor']}") and ports["snapshot"] == ports["monitor"] + 1
    assert {p["targetPort"] for p in service["ports"]} == set(ports)


def test_the_systemd_unit_is_a_template_whose_instance_is_the_run() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((ROOT / "docs" / "legion@.service").read_text().replace("\\\n", " "))
    service = unit["Service"]
    assert "--run-id %i --or-resume" in service["ExecStart"]
    assert service["StandardOutput"].startswith("append:/var/log/legion/") and service["LogsDirectory"] == "legion"
    assert service["SuccessExitStatus"] == "130" and service["KillMode"] == "mixed"
    assert not (ROOT / "docs" / "legion.service").exists()


def test_the_image_installs_this_checkout_as_an_unprivileged_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY . /src/legion" in dockerfile and "pip install --no-cache-dir /src/legion" in dockerfile
    assert "USER legion" in dockerfile and 'ENTRYPOINT ["legion"]' in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".ci/node"} <= set(ignored)
