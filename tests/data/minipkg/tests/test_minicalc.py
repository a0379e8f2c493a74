from minicalc import chunks, clamp, count_vowels, is_palindrome, mean


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(12, 0, 10) == 10


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_chunks_default():
    assert chunks([1, 2, 3, 4, 5]) == [[1, 2], [3, 4], [5]]


def test_chunks_three():
    assert chunks("abcdefg", 3) == ["abc", "def", "g"]


def test_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert not is_palindrome("abc")


def test_vowels():
    assert count_vowels("Education") == 5
