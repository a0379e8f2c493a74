"""Provenance: what made a run, written to RUN/provenance.json when it starts and checked when it resumes.

The record holds the resolved config's digest (SHA-256 of its canonical JSON), the package version
and the code's digest (SHA-256 over every ``.py`` file of the installed ``rlonce`` package, so an
uncommitted edit counts) with the git commit when the code sits in a checkout, the model's weight
digest (its ``*.safetensors`` files), each code pack's digest (``tasks.jsonl`` and
``validation.json``), and the machine (CPU, core count, torch threads, torch and Python versions,
GPU). Each checkpoint gets the config digest and code digest it was written under
(``checkpoint.json``).

``--resume`` refuses a run whose code changed, or whose config changes a key that alters what the
training means (anything but ``RESUME_FREE``: more steps, evaluation, checkpoints, trackers,
threads and Ray resources), with a one-line error naming what changed; ``--accept-changes``
resumes anyway and records what was accepted under ``resumes``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

import rlonce
from rlonce.config.domains import plugin_provenance
from rlonce.errors import UsageError

RESUME_FREE = ("out", "rl.steps", "eval.", "checkpoint.", "tracker.", "runtime.rollout_threads",
               "runtime.train_threads", "ray.", "engine.max_batch_size", "engine.batch_wait_s",
               "engine.continuous", "engine.prefix_cache_mb")
"""Config keys a resume may change freely: none of them changes what was trained or how."""
FILE = "provenance.json"


def digest_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def digest_files(paths: list[Path]) -> str | None:
    h, any_file = hashlib.sha256(), False
    for p in sorted(paths):
        if p.is_file():
            any_file = True
            h.update(p.name.encode() + b"\0")
            with p.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest() if any_file else None


def code_version() -> dict:
    """The package version, the digest of its source and, in a git checkout, the commit."""
    src = Path(rlonce.__file__).resolve().parent
    files = sorted(src.rglob("*.py"))
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(src)).encode() + b"\0" + p.read_bytes())
    commit = None
    try:
        r = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        commit = r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"version": rlonce.__version__, "source_sha256": h.hexdigest(), "git_commit": commit}


def machine(cfg) -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or None)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cpus": os.cpu_count(), "torch_threads": {"rollout": cfg.runtime.rollout_threads,
                                                                   "train": cfg.runtime.train_threads},
            "torch": torch.__version__, "python": platform.python_version(), "gpu": gpu,
            "platform": platform.platform()}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def record(cfg, config: dict, model_dir: Path) -> dict:
    sources = list(cfg.sources) if cfg.sources else [cfg.task]
    packs = {getattr(s, "label", None) or s.name: digest_files([Path(s.pack) / "tasks.jsonl",
                                                                Path(s.pack) / "validation.json"])
             for s in sources if getattr(s, "pack", None)}
    return {"config_sha256": digest_json(config), "code": code_version(),
            "plugins": plugin_provenance(s.name for s in sources),
            "model": {"name": cfg.model.name, "weights_sha256": digest_files(list(model_dir.glob("*.safetensors")))},
            "packs": packs, "machine": machine(cfg), "resumes": []}


def write(run_dir: Path, prov: dict) -> None:
    tmp = run_dir / (FILE + ".tmp")
    tmp.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    tmp.replace(run_dir / FILE)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(saved: dict, now: dict) -> dict[str, tuple]:
    """Keys whose value differs between two configs and that a resume may not change freely."""
    a, b = _flat(saved), _flat(now)
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k) and not any(k == f or (f.endswith(".") and k.startswith(f)) for f in RESUME_FREE)}


def _code_label(was: dict, now: dict) -> str:
    """``was -> now`` for a source that changed: commits where they differ, else the source
    digests with what tells them apart (uncommitted changes on the same commit)."""
    a, b = was.get("git_commit"), now.get("git_commit")
    if a and b and a != b:
        return f"commit {a[:12]} -> {b[:12]}"
    where = f" (uncommitted changes on commit {b[:12]})" if a and a == b else ""
    return f"source digest {was['source_sha256'][:12]} -> {now['source_sha256'][:12]}{where}"


def check_resume(run_dir: Path, saved_config: dict, config: dict, step: int, accept: bool) -> dict:
    """The run's provenance with this resume recorded; refuses changed code or config unless ``accept``."""
    path = run_dir / FILE
    prov = json.loads(path.read_text()) if path.is_file() else {"resumes": []}
    changes = config_changes(saved_config, config)
    code = code_version()
    code_changed = "code" in prov and prov["code"]["source_sha256"] != code["source_sha256"]
    plugins = plugin_provenance(prov.get("plugins", {}))  # the run's own plugins only: others never block it
    plugins_changed = sorted(n for n, p in plugins.items() if p["sha256"] != prov["plugins"][n]["sha256"])
    if (changes or code_changed or plugins_changed) and not accept:
        what = []
        if changes:
            what.append("config " + ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in list(changes.items())[:4])
                        + (f" (+{len(changes) - 4} more)" if len(changes) > 4 else ""))
        if code_changed:
            what.append(f"code {_code_label(prov['code'], code)}")
        for n in plugins_changed:
            what.append(f"domain plugin {n} ({plugins[n]['path']}: sha256 {prov['plugins'][n]['sha256'][:12]} -> "
                        f"{(plugins[n]['sha256'] or 'missing')[:12]})")
        raise UsageError(f"cannot resume {run_dir}: {'; '.join(what)} changed since the run started; resume "
                         "with the same code and config, or pass --accept-changes to resume anyway (recorded in "
                         f"{FILE})")
    prov.setdefault("resumes", []).append({"at_step": step, "config_sha256": digest_json(config),
                                           "accepted_config_changes": {k: list(v) for k, v in changes.items()},
                                           "code": code, "code_changed": bool(code_changed),
                                           "plugins": plugins, "plugins_changed": plugins_changed})
    return prov
