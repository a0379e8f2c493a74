"""The run's closing lines say when the model graders' numbers are not the judge's (numbers from
the SmolLM2 GAR run that motivated them: 14 of 14 GAR groups fell back, 39 of 39 audits confirmed)."""

from rlonce.cli.commands import _say_grading


def test_mostly_fallbacks_and_an_audit_that_flags_everything_are_said_loudly(capsys):
    _say_grading({"grading/gar_fallback_rate": 1.0, "grading/gar_fallback_invalid": 14.0, "grading/gar_groups": 14.0,
                  "grading/audited": 39.0, "grading/audit_confirmed": 39.0, "grading/grs_fallback_rate": 0.0})
    out = capsys.readouterr().out.splitlines()
    assert out == ["WARNING: GAR fell back to the verifier's reward on 100% of its questions (invalid 14)",
                   "WARNING: the hack audit confirmed 39 of 39 audited attempts: a judge that flags nearly "
                   "everything is not auditing (see grading/kappa and docs/grading.md)"]


def test_a_judge_that_answers_and_discriminates_gets_no_warning(capsys):
    _say_grading({"grading/gar_fallback_rate": 0.05, "grading/gar_fallback_timeout": 1.0, "grading/gar_groups": 20.0,
                  "grading/audited": 40.0, "grading/audit_confirmed": 35.0})
    _say_grading({"grading/audited": 5.0, "grading/audit_confirmed": 5.0})  # too few audits to say
    _say_grading({})
    assert capsys.readouterr().out == ""
