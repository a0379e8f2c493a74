"""The code expert's way to a bug (``rlonce.envs.code.expert.reading_calls``), by hand: grep the
function, read windows from the line grep answers; module-level code read around the line."""

from rlonce.envs.code.expert import reading_calls


def _commands(calls):
    return [c.arguments["command"] for c in calls]


def _source() -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    # line 1: import; 2: blank; 3: def long (lines 3-104); 105: blank; 106: def short (106-107)
    return "import os\n\ndef long(a):\n" + body + "    return a\n\ndef short(b):\n    return b + 1\n"


def test_a_short_function_is_grepped_then_read_whole():
    assert _commands(reading_calls(_source(), "pkg/m.py", "short", 107)) == [
        "grep -n 'def short(' pkg/m.py", "sed -n '106,107p' pkg/m.py"]


def test_a_long_function_is_read_in_windows_up_to_the_bug():
    assert _commands(reading_calls(_source(), "pkg/m.py", "long", 90)) == [
        "grep -n 'def long(' pkg/m.py", "sed -n '3,42p' pkg/m.py", "sed -n '43,82p' pkg/m.py",
        "sed -n '83,104p' pkg/m.py"]
    assert _commands(reading_calls(_source(), "pkg/m.py", "long", 42))[1:] == ["sed -n '3,42p' pkg/m.py"]


def test_module_level_code_is_read_around_the_line():
    assert _commands(reading_calls(_source(), "pkg/m.py", "<module>", 1)) == ["sed -n '1,4p' pkg/m.py"]
