"""The run's closing lines say when the model graders' numbers are not the judge's (numbers from
the SmolLM2 GAR runs that motivated them: 14 of 14 GAR groups fell back and 39 of 39 audits were
confirmed; with structured requests, 61 of 69 audits)."""

from rlonce.cli.commands import _say_grading


def test_mostly_fallbacks_and_an_audit_that_flags_everything_are_said_loudly(capsys):
    _say_grading({"grading/gar_fallback_rate": 1.0, "grading/gar_fallback_invalid": 14.0, "grading/gar_groups": 14.0,
                  "grading/audited": 39.0, "grading/audit_confirmed": 39.0, "grading/grs_fallback_rate": 0.0})
    out = capsys.readouterr().out.splitlines()
    assert out == ["WARNING: GAR fell back to the verifier's reward on 100% of its questions (invalid 14)",
                   "WARNING: the hack audit confirmed 39 of 39 audited attempts (100%): a judge that flags most "
                   "attempts is not auditing them (see grading/kappa and docs/grading.md)"]


def test_a_judge_that_answers_and_discriminates_gets_no_warning(capsys):
    _say_grading({"grading/gar_fallback_rate": 0.05, "grading/gar_fallback_timeout": 1.0, "grading/gar_groups": 20.0,
                  "grading/audited": 40.0, "grading/audit_confirmed": 20.0})
    _say_grading({"grading/audited": 5.0, "grading/audit_confirmed": 5.0})  # too few audits to say
    _say_grading({})
    assert capsys.readouterr().out == ""
