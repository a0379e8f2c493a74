/*
 * cfgini - parser for an INI-style configuration language.
 *
 *   # comment   or   ; comment
 *   [section]              starts a section
 *   [child : parent]       a section that inherits missing keys from parent
 *   key = value            escapes in values: \n \t \r \a \b \f \v \e \\ \" \'
 *   @get sec.key           print the (possibly inherited) value of a key
 *   @percent sec.a sec.b   print integer key a as a percentage of integer key b
 *   @unset sec             remove a section and all of its keys
 * Values made only of decimal digits are integers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 32
#define HEADER_MAX 64
#define fail(...) (fprintf(stderr, "cfgini: " __VA_ARGS__), fputc('\n', stderr), -1)

struct entry {
    char key[NAME_MAX_LEN];
    char *raw, *value; /* raw: the value text exactly as written, not NUL-terminated */
    size_t rawlen, vlen;
    int is_int, ival;
    struct entry *next;
};

struct section {
    char name[NAME_MAX_LEN], parent[NAME_MAX_LEN];
    unsigned nkeys;
    struct entry *entries;
    struct section *next;
};

struct config {
    struct section *sections, *current;
    unsigned nsections;
};

static const char esc_table[26] = {
    ['a' - 'a'] = '\a', ['b' - 'a'] = '\b', ['e' - 'a'] = 0x1b, ['f' - 'a'] = '\f',
    ['n' - 'a'] = '\n', ['r' - 'a'] = '\r', ['t' - 'a'] = '\t', ['v' - 'a'] = '\v',
};

static char *trim(char *s)
{
    char *end;
    while (*s == ' ' || *s == '\t')
        s++;
    end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

static int ini_escape_char(unsigned char c)
{
    const char *map = esc_table;
    if (c == '\\' || c == '"' || c == '\'')
        return c;
    if (c < 'a')
        return -1;
    return map[c - 'a'] ? map[c - 'a'] : -1;
}

static char *ini_unescape(const char *src, size_t len, size_t *outlen)
{
    char *out = malloc(len + 1);
    size_t i = 0, o = 0;
    if (!out)
        return NULL;
    while (i < len) {
        unsigned char c = (unsigned char)src[i++];
        if (c == '\\') {
            int e = ini_escape_char((unsigned char)src[i++]);
            if (e < 0) {
                free(out);
                return NULL;
            }
            c = (unsigned char)e;
        }
        out[o++] = (char)c;
    }
    out[o] = '\0';
    *outlen = o;
    return out;
}

static int ini_parse_int(const char *s, int *out)
{
    const char *p;
    int v = 0;
    if (*s == '\0' || strspn(s, "0123456789") != strlen(s))
        return 0;
    for (p = s; *p; p++)
        v = v * 10 + (*p - '0');
    *out = v;
    return 1;
}

static int ini_section_header(struct config *cfg, char *line)
{
    char name[NAME_MAX_LEN], parent[NAME_MAX_LEN];
    char *end = strchr(line, ']'), *colon, *inner = line + 1;
    struct section *s;
    if (!end)
        return fail("unterminated section header");
    *end = '\0';
    if (strlen(inner) > HEADER_MAX)
        return fail("section header too long");
    parent[0] = '\0';
    colon = strchr(inner, ':');
    if (colon) {
        *colon = '\0';
        strcpy(parent, trim(colon + 1));
    }
    strcpy(name, trim(inner));
    if (name[0] == '\0')
        return fail("empty section name");
    s = calloc(1, sizeof *s);
    if (!s)
        return -1;
    memcpy(s->name, name, sizeof name);
    memcpy(s->parent, parent, sizeof parent);
    s->next = cfg->sections;
    cfg->sections = s;
    cfg->current = s;
    cfg->nsections++;
    return 0;
}

static void free_entry(struct entry *e)
{
    free(e->raw);
    free(e->value);
    free(e);
}

static unsigned free_section(struct section *s, size_t *nints)
{
    unsigned n = 0;
    while (s->entries) {
        struct entry *e = s->entries;
        s->entries = e->next;
        *nints += e->is_int ? 1 : 0;
        free_entry(e);
        n++;
    }
    free(s);
    return n;
}

static int ini_add_key(struct config *cfg, const char *key, const char *rawtext, size_t rawlen)
{
    struct section *s = cfg->current;
    struct entry *e;
    if (!s || strlen(key) >= NAME_MAX_LEN)
        return fail("key '%s' is too long or outside of any section", key);
    e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    memcpy(e->key, key, strlen(key) + 1);
    e->raw = malloc(rawlen ? rawlen : 1);
    if (e->raw)
        memcpy(e->raw, rawtext, rawlen);
    e->rawlen = rawlen;
    e->value = e->raw ? ini_unescape(e->raw, rawlen, &e->vlen) : NULL;
    if (!e->value) {
        fprintf(stderr, "cfgini: bad value for key '%s'\n", key);
        free_entry(e);
        return -1;
    }
    e->is_int = ini_parse_int(e->value, &e->ival);
    e->next = s->entries;
    s->entries = e;
    s->nkeys++;
    return 0;
}

static struct section *ini_find_section(const struct config *cfg, const char *name)
{
    struct section *s;
    for (s = cfg->sections; s; s = s->next)
        if (strcmp(s->name, name) == 0)
            return s;
    return NULL;
}

static const struct entry *ini_lookup(const struct config *cfg, const struct section *s, const char *key)
{
    const struct entry *e;
    const struct section *p;
    for (e = s->entries; e; e = e->next)
        if (strcmp(e->key, key) == 0)
            return e;
    if (s->parent[0] == '\0')
        return NULL;
    for (p = cfg->sections; p; p = p->next)
        if (strcmp(p->name, s->parent) == 0)
            return ini_lookup(cfg, p, key);
    return NULL;
}

static const struct entry *ini_resolve(const struct config *cfg, char *path)
{
    char *dot = strchr(path, '.');
    const struct section *s;
    if (!dot)
        return NULL;
    *dot = '\0';
    s = ini_find_section(cfg, path);
    return s ? ini_lookup(cfg, s, dot + 1) : NULL;
}

static int ini_cmd_get(const struct config *cfg, char *path)
{
    char *dot = strchr(path, '.');
    const struct section *s;
    const struct entry *e;
    if (!dot)
        return fail("@get needs section.key");
    *dot = '\0';
    s = ini_find_section(cfg, path);
    if (s->nkeys == 0 && s->parent[0] == '\0') {
        printf("%s.%s: (empty section)\n", path, dot + 1);
        return 0;
    }
    e = ini_lookup(cfg, s, dot + 1);
    if (e)
        printf("%s.%s = %s (%zu raw bytes)\n", path, dot + 1, e->value, e->rawlen);
    else
        printf("%s.%s: (not set)\n", path, dot + 1);
    return 0;
}

static int ini_cmd_percent(const struct config *cfg, char *args)
{
    char *second = strchr(args, ' ');
    const struct entry *a, *b;
    if (!second)
        return fail("@percent needs two keys");
    *second++ = '\0';
    a = ini_resolve(cfg, args);
    b = ini_resolve(cfg, trim(second));
    if (!a || !b || !a->is_int || !b->is_int)
        return fail("@percent needs two integer keys");
    printf("percent: %lld%%\n", (long long)a->ival * 100 / b->ival);
    return 0;
}

static int ini_unset_section(struct config *cfg, const char *name)
{
    struct section **pp, *s;
    size_t dropped_ints = 0;
    for (pp = &cfg->sections; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->name, name) != 0)
            continue;
        s = *pp;
        *pp = s->next;
        free_section(s, &dropped_ints);
        cfg->nsections--;
        return 0;
    }
    return fail("@unset: no section '%s'", name);
}

static int ini_parse_line(struct config *cfg, char *line)
{
    char *p = trim(line), *eq;
    if (*p == '\0' || *p == '#' || *p == ';')
        return 0;
    if (*p == '[')
        return ini_section_header(cfg, p);
    if (strncmp(p, "@get ", 5) == 0)
        return ini_cmd_get(cfg, trim(p + 5));
    if (strncmp(p, "@percent ", 9) == 0)
        return ini_cmd_percent(cfg, trim(p + 9));
    if (strncmp(p, "@unset ", 7) == 0)
        return ini_unset_section(cfg, trim(p + 7));
    eq = strchr(p, '=');
    if (*p == '@' || !eq)
        return fail("cannot parse line '%s'", p);
    *eq = '\0';
    p = trim(p);
    if (*p == '\0')
        return fail("empty key");
    eq = trim(eq + 1);
    return ini_add_key(cfg, p, eq, strlen(eq));
}

static int ini_process(const unsigned char *buf, size_t len)
{
    struct config cfg = { NULL, NULL, 0 };
    size_t pos = 0, nkeys = 0, nints = 0;
    unsigned lineno = 0;
    int rc = 0;
    while (pos < len && rc == 0) {
        const unsigned char *nl = memchr(buf + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (buf + pos)) : len - pos;
        char *line = malloc(n + 1);
        if (!line)
            return -1;
        memcpy(line, buf + pos, n);
        line[n] = '\0';
        lineno++;
        rc = ini_parse_line(&cfg, line);
        free(line);
        pos += n + 1;
    }
    while (cfg.sections) {
        struct section *s = cfg.sections;
        cfg.sections = s->next;
        nkeys += free_section(s, &nints);
    }
    if (rc == 0)
        printf("%u lines, %u sections, %zu keys, %zu integers\n", lineno, cfg.nsections, nkeys, nints);
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
        fprintf(stderr, "cfgini: cannot read %s\n", argv[1]);
        return 1;
    }
    rc = ini_process(buf, len);
    free(buf);
    return rc == 0 ? 0 : 1;
}
