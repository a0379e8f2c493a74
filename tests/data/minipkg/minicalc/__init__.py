"""A tiny library whose own test suite the code-repair tests build tasks from."""


def clamp(x, lo, hi):
    """``x`` limited to the closed interval [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    total = 0
    for v in values:
        total = total + v
    return total / len(values)


def chunks(seq, size=2):
    """Consecutive slices of ``seq`` of length ``size`` (the last may be shorter)."""
    return [seq[i:i + size] for i in range(0, len(seq), size)]


def is_palindrome(text):
    cleaned = [c.lower() for c in text if c.isalnum()]
    return cleaned == cleaned[::-1]


def count_vowels(text):
    return sum(1 for c in text.lower() if c in "aeiou")
