from experiments.core import checks
from experiments.core.checks import Feedback


def test_check_number():
    assert checks.check_number(None, 20, name="reserved memory", unit="MiB").correct is None
    ok = checks.check_number(20.0, 20, name="reserved memory", unit="MiB", explanation="one 20 MiB segment")
    assert ok.correct is True and "one 20 MiB segment" in ok.message
    wrong = checks.check_number(22, 20, name="reserved memory", unit="MiB",
                                hints=[(22, "A 2 MiB small segment is not needed here.")])
    assert wrong.correct is False and "small segment" in wrong.message
    assert "too low" in checks.check_number(10, 20, name="x").message
    assert checks.check_number(21, 20, name="x", rel_tol=0.1).correct is True
    assert checks.check_number("20", 20, name="x").correct is False


def test_check_choice():
    expl = {"a": "right, because", "b": "no: the pool is per stream"}
    assert checks.check_choice("a", "a", explanations=expl).correct is True
    fb = checks.check_choice("b", "a", explanations=expl)
    assert fb.correct is False and "per stream" in fb.message
    assert checks.check_choice("z", "a", explanations=expl).correct is False
    assert checks.check_choice(None, "a", explanations=expl).correct is None
    assert checks.check_choice(" A ", "a", explanations=expl).correct is True
    assert checks.check_choice(["a"], "a", explanations=expl).correct is False
    assert checks.check_choice("B", "a", explanations=expl).message == "no: the pool is per stream"


def test_combine_and_display():
    parts = [Feedback(True, "one."), Feedback(False, "two is off.")]
    c = checks.combine(parts)
    assert c.correct is False and c.message == "two is off."
    assert checks.combine([Feedback(True, "a"), Feedback(None, "b?")]).correct is None
    assert checks.combine([Feedback(True, "a"), Feedback(True, "b")]).correct is True
    assert "not yet" in Feedback(False, "x")._repr_html_()
    assert str(Feedback(None, "y")).startswith("[no answer yet]")
    assert not Feedback(None, "y")
