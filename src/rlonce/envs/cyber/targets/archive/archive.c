/*
 * archive - lister for the toy "ARC1" archive format.
 *
 *   "ARC1"         magic
 *   u8 flags       bit0: dedupe identical files, bit1: purge deleted entries
 *   u8 count       number of directory entries, 1..16
 *   u8 mainlen     length of the name of the main entry (0: none), then the name
 *   directory entries, each:
 *     u8  kind     low 3 bits: 0 file, 1 link, 2 dir, 3 deleted;
 *                  4..7 are reserved and stored like files; high bits are ignored
 *     u8  namelen  1..24, then the name
 *     u16 offset   data offset inside the data area (little endian)
 *     u16 size     data size; directories carry no data
 *     u16 extra    file: index of its parent directory entry (0xffff: none)
 *                  link: index of the entry it points to
 *   data area      the rest of the file
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENTRIES 16
#define NAME_LEN 24
#define NKINDS 4
#define FLAG_DEDUPE 0x01
#define FLAG_PURGE 0x02

enum { K_FILE, K_LINK, K_DIR, K_DELETED };

struct entry {
    unsigned kind;
    char name[NAME_LEN + 1];
    unsigned offset, size, extra;
    int purged;
    union {
        unsigned char *data;
        uintptr_t target;
    } u;
};

struct archive {
    unsigned flags;
    unsigned n;
    char main[NAME_LEN + 1];
    struct entry ents[MAX_ENTRIES];
    unsigned kind_count[NKINDS];
    const unsigned char *area;
    size_t arealen;
};

static unsigned rd16(const unsigned char *p)
{
    return (unsigned)p[0] | ((unsigned)p[1] << 8);
}

static int arc_has_data(const struct entry *e)
{
    return e->kind != K_LINK && e->kind != K_DIR;
}

static int arc_load_data(struct archive *a, struct entry *e)
{
    if (e->offset > a->arealen || e->size > a->arealen) {
        fprintf(stderr, "archive: data of '%s' is out of range\n", e->name);
        return -1;
    }
    e->u.data = malloc(e->size ? e->size : 1);
    if (!e->u.data)
        return -1;
    memcpy(e->u.data, a->area + e->offset, e->size);
    return 0;
}

static void arc_dedupe(struct archive *a)
{
    unsigned i, j;

    for (i = 0; i < a->n; i++) {
        struct entry *ei = &a->ents[i];

        for (j = i + 1; j < a->n; j++) {
            struct entry *ej = &a->ents[j];

            if (!arc_has_data(ei) || !arc_has_data(ej) || ei->size != ej->size || ei->size == 0)
                continue;
            if (ei->u.data == ej->u.data || memcmp(ei->u.data, ej->u.data, ei->size) != 0)
                continue;
            free(ej->u.data);
            ej->u.data = ei->u.data;
            printf("dedupe: '%s' shares data with '%s'\n", ej->name, ei->name);
        }
    }
}

static void arc_purge(struct archive *a)
{
    unsigned i;

    for (i = 0; i < a->n; i++) {
        struct entry *e = &a->ents[i];

        if (e->kind == K_DELETED && !e->purged) {
            free(e->u.data);
            e->purged = 1;
        }
    }
}

static void arc_tally_kinds(struct archive *a)
{
    unsigned i;

    for (i = 0; i < a->n; i++)
        a->kind_count[a->ents[i].kind]++;
    printf("%u files, %u links, %u dirs, %u deleted\n", a->kind_count[K_FILE], a->kind_count[K_LINK],
           a->kind_count[K_DIR], a->kind_count[K_DELETED]);
}

static const struct entry *arc_find(const struct archive *a, const char *name)
{
    unsigned i;

    for (i = 0; i < a->n; i++)
        if (strcmp(a->ents[i].name, name) == 0)
            return &a->ents[i];
    return NULL;
}

static void arc_open_main(const struct archive *a)
{
    const struct entry *e = arc_find(a, a->main);
    unsigned size = e->size;

    printf("main entry: %s (%u bytes)\n", e->name, size);
}

static uint32_t arc_entry_checksum(const struct entry *e)
{
    uint32_t sum = 0;
    unsigned i;

    for (i = 0; i < e->size; i++)
        sum = sum * 31u + e->u.data[i];
    return sum;
}

static unsigned arc_peek(const struct entry *e)
{
    return e->u.data[0];
}

static int arc_resolve_link(const struct archive *a, unsigned idx)
{
    const struct entry *e;

    if (idx >= a->n)
        return -1;
    e = &a->ents[idx];
    if (e->kind != K_LINK)
        return (int)idx;
    return arc_resolve_link(a, (unsigned)e->u.target);
}

static void arc_build_path(const struct archive *a, const struct entry *e)
{
    char path[32];
    char *w = path;

    if (e->extra < a->n && a->ents[e->extra].kind == K_DIR) {
        const struct entry *d = &a->ents[e->extra];
        size_t dlen = strlen(d->name);

        memcpy(w, d->name, dlen);
        w += dlen;
        *w++ = '/';
    }
    memcpy(w, e->name, strlen(e->name) + 1);
    printf("  path: %s\n", path);
}

static void arc_list(const struct archive *a)
{
    unsigned i;

    for (i = 0; i < a->n; i++) {
        const struct entry *e = &a->ents[i];

        printf("entry %u: kind %u, name '%s', %u bytes", i, e->kind, e->name, e->size);
        if (arc_has_data(e) && e->size > 0)
            printf(", checksum %08x", (unsigned)arc_entry_checksum(e));
        if (e->size > 0)
            printf(", first byte %02x", arc_peek(e));
        printf("\n");
        if (e->kind == K_FILE)
            arc_build_path(a, e);
        else if (e->kind == K_LINK)
            printf("  link -> entry %d\n", arc_resolve_link(a, (unsigned)e->u.target));
    }
}

static void arc_free_entries(struct archive *a)
{
    unsigned i;

    for (i = 0; i < a->n; i++)
        if (arc_has_data(&a->ents[i]) && !a->ents[i].purged)
            free(a->ents[i].u.data);
}

static int arc_parse(struct archive *a, const unsigned char *buf, size_t len)
{
    size_t pos = 7, mainlen;
    unsigned i;

    if (len < 7 || memcmp(buf, "ARC1", 4) != 0) {
        fprintf(stderr, "archive: not an ARC1 archive\n");
        return -1;
    }
    a->flags = buf[4];
    a->n = buf[5];
    mainlen = buf[6];
    if (a->n == 0 || a->n > MAX_ENTRIES || mainlen > NAME_LEN || len - pos < mainlen) {
        fprintf(stderr, "archive: bad header\n");
        return -1;
    }
    memcpy(a->main, buf + pos, mainlen);
    a->main[mainlen] = '\0';
    pos += mainlen;
    for (i = 0; i < a->n; i++) {
        struct entry *e = &a->ents[i];
        size_t nl;

        if (len - pos < 2 || (nl = buf[pos + 1]) == 0 || nl > NAME_LEN || len - pos - 2 < nl + 6) {
            fprintf(stderr, "archive: bad directory entry %u\n", i);
            return -1;
        }
        e->kind = buf[pos] & 0x07;
        memcpy(e->name, buf + pos + 2, nl);
        e->name[nl] = '\0';
        pos += 2 + nl;
        e->offset = rd16(buf + pos);
        e->size = rd16(buf + pos + 2);
        e->extra = rd16(buf + pos + 4);
        pos += 6;
        if (e->kind == K_DIR)
            e->size = 0;
        if (e->kind == K_LINK)
            e->u.target = e->extra;
    }
    a->area = buf + pos;
    a->arealen = len - pos;
    for (i = 0; i < a->n; i++) {
        if (arc_has_data(&a->ents[i]) && arc_load_data(a, &a->ents[i]) != 0) {
            a->n = i;
            return -1;
        }
    }
    return 0;
}

static int arc_process(const unsigned char *buf, size_t len)
{
    struct archive *a = calloc(1, sizeof *a);
    int rc;

    if (!a)
        return -1;
    rc = arc_parse(a, buf, len);
    if (rc == 0) {
        if (a->flags & FLAG_DEDUPE)
            arc_dedupe(a);
        if (a->flags & FLAG_PURGE)
            arc_purge(a);
        arc_tally_kinds(a);
        if (a->main[0])
            arc_open_main(a);
        arc_list(a);
        printf("archive: %u entries, %zu data bytes\n", a->n, a->arealen);
    }
    arc_free_entries(a);
    free(a);
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
        fprintf(stderr, "archive: cannot read %s\n", argv[1]);
        return 1;
    }
    rc = arc_process(buf, len);
    free(buf);
    return rc == 0 ? 0 : 1;
}
