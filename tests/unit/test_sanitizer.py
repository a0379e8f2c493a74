"""The oracle's report parser on sanitizer reports recorded from real clang 14 builds
(tests/data/sanitizer/: the reports and the small programs that produced them)."""

from pathlib import Path

import pytest

from rlonce.envs.cyber.sanitizer import parse

DATA = Path(__file__).parents[1] / "data" / "sanitizer"


@pytest.mark.parametrize("name,sanitizer,kind,function,source,line", [
    ("asan_heap_buffer_overflow_memcpy", "address", "heap-buffer-overflow", "parse_len", "t.c", 4),
    ("asan_heap_use_after_free", "address", "heap-use-after-free", "uaf", "u.c", 10),
    ("asan_double_free", "address", "double-free", "dfree", "u.c", 9),
    ("asan_stack_overflow", "address", "stack-overflow", "rec", "u.c", 8),
    ("asan_segv", "address", "SEGV", "read_name", "s.c", 4),
    ("ubsan_signed_overflow", "undefined", "signed-integer-overflow", "mul", "u.c", 5),
    ("ubsan_division_by_zero", "undefined", "division-by-zero", "divi", "u.c", 6),
    ("ubsan_null_member", "undefined", "null-pointer-use", "getv", "u.c", 7),
])
def test_recorded_reports(name, sanitizer, kind, function, source, line):
    rep = parse((DATA / f"{name}.txt").read_text())
    assert (rep.sanitizer, rep.kind) == (sanitizer, kind)
    top = rep.top_frame({source})
    assert (top.function, top.file, top.line) == (function, source, line)


def test_runtime_frames_are_skipped_and_the_allocation_stack_is_not_read():
    rep = parse((DATA / "asan_heap_buffer_overflow_memcpy.txt").read_text())
    assert rep.frames[0].function == "__asan_memcpy" and rep.frames[0].file == ""  # the runtime's frame
    assert [f.function for f in rep.frames[1:3]] == ["parse_len", "main"]
    # the "allocated by thread T0 here" stack (another #0) is not part of the error's stack
    assert sum(f.function == "__interceptor_malloc" for f in rep.frames) == 0
    assert rep.top_frame({"other.c"}) is None


def test_first_report_wins_and_non_reports_are_none():
    ubsan = (DATA / "ubsan_division_by_zero.txt").read_text()
    asan = (DATA / "asan_double_free.txt").read_text()
    assert parse(ubsan + asan).kind == "division-by-zero"
    assert parse(asan + ubsan).kind == "double-free"
    assert parse("") is None and parse("Segmentation fault (core dumped)\n") is None


@pytest.mark.parametrize("message,kind", [
    ("shift exponent 40 is too large for 32-bit type 'int'", "shift-exponent"),
    ("left shift of negative value -1", "shift-base"),
    ("index 8 out of bounds for type 'int[8]'", "out-of-bounds-index"),
    ("load of null pointer of type 'int'", "null-pointer-use"),
    ("load of misaligned address 0x000000004141 for type 'long'", "misaligned"),
    ("something new", "ubsan-other"),
])
def test_ubsan_messages_name_their_kind(message, kind):
    rep = parse(f"prog.c:3:9: runtime error: {message}\n    #0 0x5555 in f /src/prog.c:3:9\n")
    assert rep.kind == kind and rep.top_frame({"prog.c"}).function == "f"
