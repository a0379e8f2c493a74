"""GRS rubrics as stored with a pack: ``DIR/rubrics.json``, task id → the solution and behaviour
rubrics that passing attempts are scored against during training (``rlonce.grading.graders``).
``rlonce grade synthesize-rubrics`` writes them (``rlonce.recipes.rubric_synthesis``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from rlonce.envs.packs import read_json_object
from rlonce.errors import PackError
from rlonce.grading.verdicts import Rubrics

RUBRICS_FILE = "rubrics.json"


def load_rubrics(pack: str | Path) -> dict[str, Rubrics]:
    """The stored rubrics of ``pack``, task id → ``Rubrics``; {} when none were written."""
    path = Path(pack) / RUBRICS_FILE
    out = {}
    for tid, obj in read_json_object(path, "delete it or rerun the command that wrote it").items():
        try:
            out[tid] = Rubrics.model_validate(obj)
        except ValidationError as e:
            raise PackError(f"{path}: the rubrics of {tid} are not a Rubrics object ({str(e).splitlines()[0]}); "
                            "rerun `rlonce grade synthesize-rubrics`") from None
    return out
