"""The twelve bug templates of the generated cyber targets (``generate``): one handler each.

A template takes the handler's function name, a noun for its messages and the target's
``random.Random``, and returns a ``Bug``: the handler's C source with one planted bug, a record
value that triggers it, a value it accepts cleanly, and the sanitizer type the trigger must
produce. Sizes, limits, flags and keys are drawn, so no two targets share a trigger.

What each plants (the type is the name ``rlonce.envs.cyber.sanitizer`` gives the report):
a text copy whose length limit exceeds its stack buffer (``stack-buffer-overflow``); a u16
array allocated by its count byte but filled from the value's length (``heap-buffer-overflow``);
an unchecked s32 sum or u16 product (``signed-integer-overflow``); a shift limit above 31
(``shift-exponent``); a divisor taken from the input (``division-by-zero``); a slot limit above
a struct member array's size (``out-of-bounds-index``: UBSan's bounds check, which clang 14
only raises past one-past-the-end); a name table's ``>`` that should be ``>=``
(``global-buffer-overflow``); a mode that frees early (``heap-use-after-free``) or twice
(``double-free``); a missed lookup dereferenced (``null-pointer-use``); a self-link followed by
recursion (``stack-overflow``); an offset taken for an address (``SEGV``).
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

NOUNS = ("label", "count", "stamp", "window", "track", "color", "range", "entry", "field", "block", "frame",
         "offset", "weight", "scale", "level", "ratio", "route", "token", "digest", "note", "slot", "layer",
         "queue", "chunk", "span", "limit", "mode", "badge", "tempo", "pixel", "shelf", "vault")


@dataclass(frozen=True)
class Bug:
    """One planted bug: its handler's C source, the record value that triggers it, and what the
    sanitizer must report."""
    kind: str
    verb: str
    code: str
    value: bytes
    summary: str
    describe: str
    """The record's layout, for the source's header comment."""
    benign: bytes = b""
    """A well-formed value the handler accepts without any report."""


def fill(text: str, **kw) -> str:
    return Template(text).substitute(**kw)


def _stack(fn, noun, rng):
    size = rng.randrange(8, 33)
    limit = size + rng.randrange(8, 41)
    n = rng.randrange(size + 1, limit + 1)
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    char text[$size];
    size_t i;

    if (n == 0 || n > $limit)
        return fail("$noun: bad length %zu", n);
    memcpy(text, p, n);
    for (i = 0; i < n; i++)
        if (text[i] < 0x20 || text[i] > 0x7e)
            text[i] = '.';
    printf("$noun: %.*s\\n", (int)n, text);
    return 0;
}
""", fn=fn, noun=noun, size=size, limit=limit)
    return Bug("stack-buffer-overflow", "copy", code, bytes(rng.choice(b"ABCDEFGH") for _ in range(n)),
               f"the limit is {limit} bytes but the text buffer holds {size}", "text, printed", b"ok" * (size // 2))


def _heap(fn, noun, rng):
    extra, count = rng.randrange(1, 3), rng.randrange(0, 4)
    entries = count + extra + rng.randrange(1, 3)
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    unsigned count, i;
    unsigned *vals;
    unsigned long total = 0;

    if (n < 1 || (n - 1) % 2 != 0)
        return fail("$noun: malformed record");
    count = p[0];
    vals = malloc((count + $extra) * sizeof *vals);
    if (!vals)
        return -1;
    for (i = 0; i < (n - 1) / 2; i++)
        vals[i] = rd16(p + 1 + 2 * i);
    for (i = 0; i < count && i < (n - 1) / 2; i++)
        total += vals[i];
    printf("$noun: %u values, total %lu\\n", count, total);
    free(vals);
    return 0;
}
""", fn=fn, noun=noun, extra=extra)
    value = bytes([count]) + b"".join(rng.randrange(1, 60000).to_bytes(2, "little") for _ in range(entries))
    return Bug("heap-buffer-overflow", "load", code, value,
               f"allocates count + {extra} entries but copies every u16 of the value", "u8 count, u16 values",
               bytes([2, 7, 0, 9, 0]))


def _signed(fn, noun, rng):
    if rng.random() < 0.5:
        code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    int total = 0;
    size_t i;

    if (n == 0 || n % 4 != 0)
        return fail("$noun: length %zu is not a multiple of 4", n);
    for (i = 0; i < n; i += 4)
        total += (int32_t)rd32(p + i);
    printf("$noun: total %d\\n", total);
    return 0;
}
""", fn=fn, noun=noun)
        value = (0x7FFFFFFF - rng.randrange(0, 100)).to_bytes(4, "little") + (200).to_bytes(4, "little")
        return Bug("signed-integer-overflow", "sum", code, value, "s32 values summed into an int unchecked",
                   "s32 values, summed", bytes([5, 0, 0, 0, 6, 0, 0, 0]))
    k = rng.randrange(2, 9)
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    int w, h, area;

    if (n < 4)
        return fail("$noun: need 4 bytes");
    w = (int)rd16(p);
    h = (int)rd16(p + 2);
    area = w * h * $k;
    printf("$noun: area %d\\n", area);
    return 0;
}
""", fn=fn, noun=noun, k=k)
    value = rng.randrange(0xF000, 0x10000).to_bytes(2, "little") + rng.randrange(0xF000, 0x10000).to_bytes(2, "little")
    return Bug("signed-integer-overflow", "area", code, value, f"u16 * u16 * {k} in an int", "u16 width, u16 height",
               bytes([40, 0, 30, 0]))


def _shift(fn, noun, rng):
    top = rng.randrange(32, 64)
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    unsigned base, shift, value;

    if (n < 2)
        return fail("$noun: need 2 bytes");
    base = p[0];
    shift = p[1];
    if (shift > $top)
        return fail("$noun: shift %u too large", shift);
    value = base << shift;
    printf("$noun: %u\\n", value);
    return 0;
}
""", fn=fn, noun=noun, top=top)
    return Bug("shift-exponent", "scale", code, bytes([rng.randrange(1, 256), rng.randrange(32, top + 1)]),
               f"shifts a 32-bit value by up to {top}", "u8 base, u8 shift", bytes([3, 4]))


def _divide(fn, noun, rng):
    bias = rng.randrange(0, 6)
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    int total, parts;

    if (n < 3)
        return fail("$noun: need 3 bytes");
    total = (int)rd16(p);
    parts = (int)p[2] - $bias;
    printf("$noun: %d per part\\n", total / parts);
    return 0;
}
""", fn=fn, noun=noun, bias=bias)
    return Bug("division-by-zero", "split", code, rng.randrange(1, 60000).to_bytes(2, "little") + bytes([bias]),
               f"divides by the third byte minus {bias}", "u16 total, u8 parts", bytes([100, 0, bias + 4]))


def _index(fn, noun, rng):
    size = rng.randrange(4, 33)
    limit = size + rng.randrange(2, 9)
    code = fill("""struct ${noun}_marks {
    int slots[$size];
    int recent[8];
    int total;
};

static int $fn(const unsigned char *p, size_t n)
{
    struct ${noun}_marks m;
    unsigned idx;
    size_t i;

    memset(&m, 0, sizeof m);
    for (i = 0; i < n; i++) {
        idx = p[i];
        if (idx >= $limit)
            return fail("$noun: slot %u out of range", idx);
        m.slots[idx]++;
        m.recent[i % 8] = (int)idx;
        m.total++;
    }
    printf("$noun: %d marks, slot 0 has %d\\n", m.total, m.slots[0]);
    return 0;
}
""", fn=fn, noun=noun, size=size, limit=limit)
    value = bytes(rng.randrange(0, size) for _ in range(rng.randrange(0, 3))) + bytes([rng.randrange(size + 1, limit)])
    return Bug("out-of-bounds-index", "count", code, value, f"accepts slots below {limit} of an array of {size}",
               "u8 slot numbers", bytes([0, size - 1, 1]))


def _global(fn, noun, rng):
    count = rng.randrange(3, 9)
    words = rng.sample(NOUNS, count)
    names = ", ".join(f'"{w}"' for w in words)
    code = fill("""static const char *const ${noun}_names[$count] = { $names };

static int $fn(const unsigned char *p, size_t n)
{
    const char *const *names = ${noun}_names;
    unsigned idx;

    if (n < 1)
        return fail("$noun: empty record");
    idx = p[0];
    if (idx > $count)
        return fail("$noun: unknown kind %u", idx);
    printf("$noun: %s\\n", names[idx]);
    return 0;
}
""", fn=fn, noun=noun, count=count, names=names)
    return Bug("global-buffer-overflow", "name", code, bytes([count]), f"accepts kind {count} of {count} names",
               "u8 kind", bytes([count - 1]))


def _uaf(fn, noun, rng):
    flag = rng.randrange(1, 256)
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    unsigned char *copy;
    unsigned sum = 0;
    size_t i;

    if (n < 2)
        return fail("$noun: need 2 bytes");
    copy = malloc(n);
    if (!copy)
        return -1;
    memcpy(copy, p, n);
    if (copy[0] == $flag) {
        printf("$noun: reset\\n");
        free(copy);
    }
    for (i = 1; i < n; i++)
        sum += copy[i];
    printf("$noun: checksum %u\\n", sum);
    if (p[0] != $flag)
        free(copy);
    return 0;
}
""", fn=fn, noun=noun, flag=flag)
    return Bug("heap-use-after-free", "check", code, bytes([flag, rng.randrange(256)]),
               f"mode byte {flag} frees the copy before it is summed", "u8 mode, bytes", bytes([flag - 1, 5, 6]))


def _double(fn, noun, rng):
    mask = 1 << rng.randrange(8)
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    unsigned char *buf;

    if (n < 1)
        return fail("$noun: empty record");
    buf = malloc(n);
    if (!buf)
        return -1;
    memcpy(buf, p, n);
    if (buf[0] & $mask) {
        printf("$noun: discarded\\n");
        free(buf);
    }
    printf("$noun: %zu bytes\\n", n);
    free(buf);
    return 0;
}
""", fn=fn, noun=noun, mask=f"0x{mask:02x}")
    return Bug("double-free", "drop", code, bytes([mask]),
               f"flag 0x{mask:02x} frees the buffer, then it is freed again", "u8 flags, bytes",
               bytes([0xFF ^ mask, 1]))


def _null(fn, noun, rng):
    keys = rng.sample(range(256), 5)
    missing = next(k for k in rng.sample(range(256), 256) if k not in keys)
    table = ", ".join(f"{{ {k}, {rng.randrange(1, 100)} }}" for k in keys[:4])
    code = fill("""struct ${noun}_entry {
    unsigned key;
    int weight;
};

static const struct ${noun}_entry ${noun}_table[] = { $table };

static const struct ${noun}_entry *${noun}_find(unsigned key)
{
    size_t i;

    for (i = 0; i < sizeof ${noun}_table / sizeof ${noun}_table[0]; i++)
        if (${noun}_table[i].key == key)
            return &${noun}_table[i];
    return NULL;
}

static int $fn(const unsigned char *p, size_t n)
{
    const struct ${noun}_entry *e;

    if (n < 1)
        return fail("$noun: empty record");
    e = ${noun}_find(p[0]);
    printf("$noun: weight %d\\n", e->weight);
    return 0;
}
""", fn=fn, noun=noun, table=table)
    return Bug("null-pointer-use", "weigh", code, bytes([missing]), "an unknown key's NULL entry is dereferenced",
               "u8 key", bytes([keys[0]]))


def _recurse(fn, noun, rng):
    mark = rng.randrange(1, 256)
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    size_t skip;

    if (n < 2 || p[0] != $mark)
        return 0;
    skip = p[1];
    if (skip > n)
        return fail("$noun: link %zu past the end", skip);
    return $fn(p + skip, n - skip);
}
""", fn=fn, noun=noun, mark=mark)
    return Bug("stack-overflow", "follow", code, bytes([mark, 0]), "a link of 0 follows itself forever",
               f"u8 mark {mark}, u8 link", bytes([mark, 2, mark, 2]))


def _wild(fn, noun, rng):
    code = fill("""static int $fn(const unsigned char *p, size_t n)
{
    uint32_t off;
    const unsigned char *at;

    if (n < 4)
        return fail("$noun: need 4 bytes");
    off = rd32(p);
    if (off < n)
        at = p + off;
    else
        at = (const unsigned char *)(uintptr_t)off;
    printf("$noun: byte %u\\n", *at);
    return 0;
}
""", fn=fn, noun=noun)
    return Bug("SEGV", "peek", code, rng.randrange(0x10000000, 0x40000000).to_bytes(4, "little"),
               "an offset past the value is read as an address", "u32 offset", bytes([1, 0, 0, 0]))


TEMPLATES = (_stack, _heap, _signed, _shift, _divide, _index, _global, _uaf, _double, _null, _recurse, _wild)
