"""Models named as users name them: a hub id (``org/name``) resolves from the local Hugging Face
cache, offline; one that is not there is one line naming the download command and the folder form.

The cache is built in the layout huggingface_hub documents (``conftest.hub_cache``), and
``huggingface_hub.scan_cache_dir`` confirms the library reads it as a cached repository."""

import os
import subprocess
import sys

import pytest
from conftest import hub_cache

from rlonce.model import loader

REPO_ID = "rlonce-tests/embedded-instruct"


@pytest.fixture
def cache(tmp_path, embedded_dir, monkeypatch):
    """A Hugging Face cache holding the embedded model as ``REPO_ID``, made the process's cache."""
    from huggingface_hub import constants, scan_cache_dir

    root = tmp_path / "hf" / "hub"
    snapshot = hub_cache(root, REPO_ID, embedded_dir)
    assert [r.repo_id for r in scan_cache_dir(root).repos] == [REPO_ID]
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root, snapshot


def test_a_hub_id_in_the_local_cache_resolves_to_its_snapshot_and_loads(cache, lm):
    import torch

    root, snapshot = cache
    path = loader.resolve(REPO_ID, root / "unused")
    assert path == snapshot
    got = loader.load(path)
    assert got.chat_format == lm.chat_format
    assert all(torch.equal(v, lm.model.state_dict()[k]) for k, v in got.model.state_dict().items())


def test_a_hub_id_not_in_the_cache_is_one_line_naming_the_download_and_the_folder_form(cache):
    root, _ = cache
    with pytest.raises(loader.ModelLoadError) as e:
        loader.resolve("HuggingFaceTB/SmolLM2-135M-Instruct", root / "unused")
    msg = str(e.value)
    assert "\n" not in msg
    for words in ("'HuggingFaceTB/SmolLM2-135M-Instruct' is not in the local Hugging Face cache", str(root),
                  "`hf download HuggingFaceTB/SmolLM2-135M-Instruct`", "local model folder"):
        assert words in msg, msg


def test_a_name_that_is_neither_is_one_line(tmp_path):
    with pytest.raises(loader.ModelLoadError) as e:
        loader.resolve("no-such-folder", tmp_path)
    assert "\n" not in str(e.value) and "hub id (org/name)" in str(e.value)


def test_the_cli_says_it_in_one_line_before_loading_any_model(tmp_path):
    """``rlonce train model.name=org/absent`` under an empty HF_HOME: exit 2, one line on stderr, and no
    run folder work beyond the config (the error comes before any weights load)."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "train", "--quiet", "--out", str(out), "sft.demos=0",
                        "model.name=some-org/absent-model"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert "'some-org/absent-model' is not in the local Hugging Face cache" in lines[0]
    assert str(tmp_path / "hf" / "hub") in lines[0] and "hf download some-org/absent-model" in lines[0]
    assert not (out / "cache").exists()
