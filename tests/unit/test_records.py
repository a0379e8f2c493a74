import math

import pytest

from rlonce.core.records import (
    Context,
    FailureCategory,
    RecordError,
    Role,
    Segment,
    Sequence,
    Status,
    TrainingRow,
    sequence_to_rows,
)


def _seq(status=Status.SUBMITTED, failure=None):
    ctx = Context([
        Segment(Role.PROMPT, [1, 2, 3]),
        Segment(Role.MODEL, [4, 5], [-0.5, -0.25], [3, 3]),
        Segment(Role.OBSERVATION, [6, 7, 8]),
        Segment(Role.MODEL, [9], [-1.0], [4]),
    ])
    return Sequence("t/1", "mini-bash", [ctx], status, failure, reward=1.0)


def test_model_segment_needs_logprob_and_version_per_token():
    with pytest.raises(RecordError):
        Segment(Role.MODEL, [1, 2], [-0.1], [0, 0])
    with pytest.raises(RecordError):
        Segment(Role.MODEL, [1, 2], [-0.1, -0.2], None)
    with pytest.raises(RecordError):
        Segment(Role.MODEL, [1], [0.5], [0])  # a log-prob above 0 is not a log-prob
    with pytest.raises(RecordError):
        Segment(Role.MODEL, [1], [-math.inf], [0])


def test_observations_never_carry_loss_fields():
    with pytest.raises(RecordError):
        Segment(Role.OBSERVATION, [1, 2], [-0.1, -0.1], [0, 0])


def test_sequence_to_rows_masks_only_model_tokens():
    (row,) = sequence_to_rows(_seq(), 0.75, group_id="g")
    assert row.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert row.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert row.rollout_logprobs == [0, 0, 0, -0.5, -0.25, 0, 0, 0, -1.0]
    assert row.policy_versions == [-1, -1, -1, 3, 3, -1, -1, -1, 4]
    assert row.advantages == [0, 0, 0, 0.75, 0.75, 0, 0, 0, 0.75]
    assert row.group_id == "g"


def test_infra_failures_are_never_trained_on():
    seq = _seq(Status.INFRA, FailureCategory.SANDBOX_TIMEOUT)
    with pytest.raises(RecordError):
        sequence_to_rows(seq, 1.0)
    with pytest.raises(RecordError):  # a failure category only with infra status
        Sequence("t", "a", [], Status.SUBMITTED, FailureCategory.ENGINE_ERROR)


def test_training_row_invariants():
    with pytest.raises(RecordError):
        TrainingRow([1, 2, 3], [0, 1], [0, 0, 0], [0, 0, 0], [-1, 0, 0])
    with pytest.raises(RecordError):  # trained token without a version
        TrainingRow([1, 2, 3], [0, 1, 1], [0, -1, -1], [0, 1, 1], [-1, 0, -1])
    with pytest.raises(RecordError):  # the first token cannot be trained
        TrainingRow([1, 2], [1, 1], [-1, -1], [1, 1], [0, 0])
    row = TrainingRow([1, 2, 3], [0, 1, 1], [0, -1, -1], [0, 1, 1], [-1, 0, 0])
    assert len(row) == 3


def test_the_graders_verdict_travels_with_the_sequence():
    from rlonce.core.records import Grade, sequence_from_dict, sequence_to_dict

    seq = _seq()
    seq.set_grade(Grade(1.05, passed=False))  # partial credit plus a format bonus: reward, not a pass
    back = sequence_from_dict(sequence_to_dict(seq))
    assert (back.reward, back.passed) == (1.05, False)
    seq.set_grade(None)  # no verdict (the grader was down): no reward, no pass
    assert (seq.reward, seq.passed) == (None, False)
    # a checkpoint written before the flag existed is read under the rule it was made with
    old = sequence_to_dict(_seq())
    del old["passed"]
    assert sequence_from_dict(old).passed
    with pytest.raises(RecordError, match="finite"):
        Grade(float("nan"), passed=False)


def test_an_infra_failure_is_stored_for_inspection_though_never_trained(tmp_path):
    """Rollout storage keeps an untrained sample's contexts, an infrastructure failure's included
    (what the agent saw before the sandbox died), under the untrained columns only; a context
    too short to be a row is left out."""
    from rlonce.telemetry.rollouts import read_step, write_step

    seq = _seq(Status.INFRA, FailureCategory.SANDBOX_ERROR)
    seq.contexts.append(Context([Segment(Role.PROMPT, [1])]))
    write_step(tmp_path, 1, [], [], train_version=0, staleness={}, untrained=[seq])
    meta, cols = read_step(tmp_path, 1)
    assert meta["untrained"][0]["status"] == "infra" and meta["untrained"][0]["failure"] == "sandbox_error"
    assert meta["untrained_rows"] == [0] and cols["token_ids"].size == 0
    assert cols["untrained_token_ids"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert cols["untrained_advantages"].tolist() == [0.0] * 9


def test_the_graders_transcript_travels_with_the_sequence_and_is_bounded():
    from rlonce.core.records import TRANSCRIPT_CHARS, Grade, sequence_from_dict, sequence_to_dict

    seq = _seq()
    seq.set_grade(Grade(1.0, passed=True, transcript="x" * (TRANSCRIPT_CHARS + 10)))
    assert seq.transcript == "x" * TRANSCRIPT_CHARS
    assert sequence_from_dict(sequence_to_dict(seq)).transcript == seq.transcript  # through a checkpoint
    seq.set_grade(None)
    assert seq.transcript == ""


def test_the_model_graders_outputs_are_typed_and_travel_with_the_sequence(tmp_path):
    """``Sequence.grades`` survives a checkpoint; a checkpoint written when the grades were
    metrics is read into the typed record; stored rollouts report them under the metric names."""
    import json

    from rlonce.core.records import Grades, sequence_from_dict, sequence_to_dict
    from rlonce.telemetry.rollouts import outcome

    seq = _seq()
    assert seq.grades == Grades()  # no model grader has spoken
    seq.grades = Grades(rubric_solution=0.5, rubric_behavior=0.25, gar_quality=0.75)
    seq.metrics["items_passed"] = 3.0  # an environment's measurement stays a metric
    back = sequence_from_dict(json.loads(json.dumps(sequence_to_dict(seq))))
    assert back.grades == seq.grades and back.metrics == {"items_passed": 3.0}
    old = sequence_to_dict(_seq())
    del old["grades"]
    old["metrics"] = {"grs_solution": 0.5, "grs_behavior": 1.0, "gar_leaked": 1.0, "items_passed": 3.0}
    back = sequence_from_dict(old)
    assert back.grades == Grades(rubric_solution=0.5, rubric_behavior=1.0, gar_leaked=True)
    assert back.metrics == {"items_passed": 3.0}
    assert outcome(seq)["metrics"] == {"items_passed": 3.0, "grs_solution": 0.5, "grs_behavior": 0.25,
                                       "gar_quality": 0.75}
    assert outcome(back)["metrics"] == {"items_passed": 3.0, "grs_solution": 0.5, "grs_behavior": 1.0,
                                        "gar_leaked": 1.0}
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(RecordError, match="in \\[0, 1\\]"):
            Grades(gar_quality=bad)


def test_two_sources_drawing_one_task_id_are_two_groups():
    """Two sources of one domain (e.g. two reasoning sources) draw the same task ids; a shared
    group id would make them one prompt to the signal's group statistics and aggregation."""
    from rlonce.core.records import Sample

    a, b = Sample("chain_sum/train/0", "arith", 1), Sample("chain_sum/train/0", "hard", 1)
    assert (a.group_id, b.group_id) == ("arith:chain_sum/train/0@1", "hard:chain_sum/train/0@1")
