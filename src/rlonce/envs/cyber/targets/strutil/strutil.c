/*
 * strutil - a scripted string toolbox.
 *
 * The input is a sequence of commands, each:  u8 op, u8 len, u8 payload[len]
 * Eight registers (0..7) hold byte strings.
 *   'S' r text         set register r to text
 *   'M' src dst        move register src into register dst
 *   'C' r              capitalize the first byte of register r
 *   'J' sep r r ...    join registers with the separator byte and print
 *   'T' delim text     split text on delim and print the fields
 *   'X' hex            decode hexadecimal text and print the bytes
 *   'B' b64            decode base64 text and print the bytes
 *   'R' n text         repeat text n times (n: signed 32-bit little endian)
 *   'F' v sh w         print the w-bit field at bit sh of v (v: u32 LE, sh and w: u8)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NREGS 8
#define MAX_FIELDS 8
#define JOIN_MAX 64
#define REPEAT_MAX 4096

struct reg { char *data; size_t len; };
struct state { struct reg regs[NREGS]; unsigned ncmds; };

static const char b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static signed char b64_map[80]; /* indexed by c - '+', for '+' .. 'z' */

static void su_b64_init(void)
{
    size_t i;

    memset(b64_map, -1, sizeof b64_map);
    for (i = 0; i < 64; i++)
        b64_map[b64_alphabet[i] - '+'] = (signed char)i;
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static void print_bytes(const char *what, const unsigned char *p, size_t n)
{
    size_t i;

    printf("%s (%zu bytes):", what, n);
    for (i = 0; i < n; i++)
        printf(" %02x", p[i]);
    printf("\n");
}

static int su_set(struct state *st, unsigned r, const unsigned char *text, size_t n)
{
    char *d;

    if (r >= NREGS)
        return -1;
    d = malloc(n + 1);
    if (!d)
        return -1;
    memcpy(d, text, n);
    d[n] = '\0';
    free(st->regs[r].data);
    st->regs[r].data = d;
    st->regs[r].len = n;
    return 0;
}

static int su_reg_move(struct state *st, unsigned src, unsigned dst)
{
    if (src >= NREGS || dst >= NREGS)
        return -1;
    if (src == dst)
        return 0;
    free(st->regs[dst].data);
    st->regs[dst] = st->regs[src];
    return 0;
}

static int su_capitalize(struct state *st, unsigned r)
{
    char *d;

    if (r >= NREGS)
        return -1;
    d = st->regs[r].data;
    if (d[0] >= 'a' && d[0] <= 'z')
        d[0] = (char)(d[0] - 'a' + 'A');
    printf("register %u: %s\n", r, d);
    return 0;
}

static int su_join(const struct state *st, unsigned char sep, const unsigned char *list, size_t nr)
{
    char out[JOIN_MAX];
    char *w = out;
    size_t i;

    for (i = 0; i < nr; i++) {
        const struct reg *g;

        if (list[i] >= NREGS)
            return -1;
        g = &st->regs[list[i]];
        if (g->len >= JOIN_MAX)
            return -1;
        if (i > 0)
            *w++ = (char)sep;
        memcpy(w, g->data ? g->data : "", g->len);
        w += g->len;
    }
    *w = '\0';
    printf("joined: %s\n", out);
    return 0;
}

static int su_split(unsigned char delim, const unsigned char *p, size_t n)
{
    const unsigned char *fields[MAX_FIELDS];
    size_t flens[MAX_FIELDS];
    size_t start = 0, i;
    unsigned nf = 0;

    for (i = 0; i <= n; i++) {
        if (i == n || p[i] == delim) {
            fields[nf] = p + start;
            flens[nf] = i - start;
            nf++;
            start = i + 1;
        }
    }
    printf("split: %u fields\n", nf);
    for (i = 0; i < nf; i++)
        printf("  [%zu] %.*s\n", i, (int)flens[i], (const char *)fields[i]);
    return 0;
}

static int su_hex_decode(const unsigned char *p, size_t n)
{
    unsigned char *out;
    size_t i, o = 0;

    if (n == 0)
        return -1;
    out = malloc(n / 2);
    if (!out)
        return -1;
    for (i = 0; i < n; i += 2) {
        int hi = hexval(p[i]), lo = hexval(p[i + 1]);

        if (hi < 0 || lo < 0) {
            free(out);
            return -1;
        }
        out[o++] = (unsigned char)(hi << 4 | lo);
    }
    print_bytes("hex", out, o);
    free(out);
    return 0;
}

static int su_b64_value(unsigned char c)
{
    const signed char *map = b64_map;

    if (c < '+' || c > 0x7f)
        return -1;
    return map[c - '+'];
}

static int su_b64_decode(const unsigned char *p, size_t n)
{
    unsigned char out[192];
    uint32_t acc = 0;
    unsigned bits = 0;
    size_t i, o = 0;

    for (i = 0; i < n && p[i] != '='; i++) {
        int v = su_b64_value(p[i]);

        if (v < 0)
            return -1;
        acc = ((acc << 6) | (uint32_t)v) & 0xffffu;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    print_bytes("base64", out, o);
    return 0;
}

static int su_repeat(const unsigned char *p, size_t n)
{
    int count, tlen, total, i;
    char *out;

    if (n < 5)
        return -1;
    count = (int32_t)rd32(p);
    tlen = (int)(n - 4);
    if (count <= 0)
        return -1;
    total = count * tlen;
    if (total > REPEAT_MAX)
        return -1;
    out = malloc((size_t)total + 1);
    if (!out)
        return -1;
    for (i = 0; i < count; i++)
        memcpy(out + (size_t)i * (size_t)tlen, p + 4, (size_t)tlen);
    out[total] = '\0';
    printf("repeat: %d bytes: %.40s\n", total, out);
    free(out);
    return 0;
}

static int su_bitfield(const unsigned char *p, size_t n)
{
    uint32_t v, mask, field;
    unsigned shift, width;

    if (n != 6)
        return -1;
    v = rd32(p);
    shift = p[4];
    width = p[5];
    if (width == 0 || width > 32)
        return -1;
    mask = width == 32 ? 0xffffffffu : (1u << width) - 1u;
    field = (v >> shift) & mask;
    printf("bitfield: %u\n", (unsigned)field);
    return 0;
}

static void su_regs_free(struct state *st)
{
    unsigned i;

    for (i = 0; i < NREGS; i++)
        free(st->regs[i].data);
}

static int su_command(struct state *st, unsigned op, const unsigned char *p, size_t n)
{
    switch (op) {
    case 'S':
        return n >= 1 ? su_set(st, p[0], p + 1, n - 1) : -1;
    case 'M':
        return n == 2 ? su_reg_move(st, p[0], p[1]) : -1;
    case 'C':
        return n == 1 ? su_capitalize(st, p[0]) : -1;
    case 'J':
        return n >= 1 ? su_join(st, p[0], p + 1, n - 1) : -1;
    case 'T':
        return n >= 1 ? su_split(p[0], p + 1, n - 1) : -1;
    case 'X':
        return su_hex_decode(p, n);
    case 'B':
        return su_b64_decode(p, n);
    case 'R':
        return su_repeat(p, n);
    case 'F':
        return su_bitfield(p, n);
    default:
        return -1;
    }
}

static int su_run(const unsigned char *buf, size_t len)
{
    struct state st;
    size_t pos = 0;
    int rc = 0;

    memset(&st, 0, sizeof st);
    if (len == 0) {
        fprintf(stderr, "strutil: empty script\n");
        return -1;
    }
    while (pos < len && rc == 0) {
        unsigned op, n;

        if (len - pos < 2 || (n = buf[pos + 1]) > len - pos - 2) {
            fprintf(stderr, "strutil: truncated command at offset %zu\n", pos);
            rc = -1;
            break;
        }
        op = buf[pos];
        rc = su_command(&st, op, buf + pos + 2, n);
        if (rc != 0)
            fprintf(stderr, "strutil: command '%c' at offset %zu failed\n", op, pos);
        st.ncmds++;
        pos += 2 + n;
    }
    su_regs_free(&st);
    if (rc == 0)
        printf("%u commands\n", st.ncmds);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    long size;
    FILE *f;
    int rc;

    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 1;
    }
    su_b64_init();
    f = fopen(argv[1], "rb");
    if (f && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        len = (size_t)size;
        buf = malloc(len ? len : 1);
        if (buf && fread(buf, 1, len, f) != len) {
            free(buf);
            buf = NULL;
        }
    }
    if (f)
        fclose(f);
    if (!buf) {
        fprintf(stderr, "strutil: cannot read %s\n", argv[1]);
        return 1;
    }
    rc = su_run(buf, len);
    free(buf);
    return rc == 0 ? 0 : 1;
}
