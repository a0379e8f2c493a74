/*
 * tlvparse - reader for a small type-length-value record stream.
 *
 * File layout:
 *   "TLV1"                  magic
 *   repeated records:
 *     u8  type
 *     u16 length            little endian
 *     u8  value[length]
 *
 * Record types:
 *   0x01 NAME    printable name of the stream
 *   0x02 INTS    list of signed 32-bit integers (summed)
 *   0x03 REF     u16 index of another record (an alias)
 *   0x04 U16S    u8 count followed by count u16 values
 *   0x05 SCALED  s16 base, u8 shift; the value is base * 2^shift
 *   0x06 NUMBER  u64 value
 *   0x07 DUMP    u16 index of an earlier record to hex dump
 *   0x08 DROP    u16 index of an earlier record whose payload is released
 * Types 0x09..0x0f are reserved and skipped; larger types are rejected.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TLV_MAGIC "TLV1"
#define TLV_TYPE_LIMIT 16
#define MAX_RECORDS 32
#define NAME_LIMIT 48
#define fail(...) (fprintf(stderr, "tlvparse: " __VA_ARGS__), fputc('\n', stderr), -1)

enum { T_NAME = 1, T_INTS, T_REF, T_U16S, T_SCALED, T_NUMBER, T_DUMP, T_DROP };
enum { K_NONE, K_BYTES, K_NUM };

struct record {
    unsigned type;
    unsigned len;
    int kind;
    int dropped;
    size_t nbytes;
    union {
        unsigned char *bytes;
        uint64_t num;
    } u;
};

struct tlv_doc {
    struct record recs[MAX_RECORDS];
    unsigned nrecs;
    char name[NAME_LIMIT + 1];
};

/* minimum value length of each known record type */
static const uint8_t tlv_min_len[9] = { 0, 1, 4, 2, 1, 3, 8, 2, 2 };

static uint16_t rd16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t rd64(const unsigned char *p)
{
    return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32);
}

static unsigned tlv_min_length(unsigned type)
{
    const uint8_t *table = tlv_min_len;

    if (type >= TLV_TYPE_LIMIT)
        return 0;
    return table[type];
}

static int tlv_read_string(struct tlv_doc *doc, struct record *rec, const unsigned char *v, size_t n)
{
    char text[40];
    size_t i;

    if (n > NAME_LIMIT)
        return fail("name too long (%zu bytes)", n);
    memcpy(text, v, n);
    for (i = 0; i < n; i++)
        if (text[i] < 0x20 || text[i] == 0x7f)
            text[i] = '?';
    rec->u.bytes = malloc(n + 1);
    if (!rec->u.bytes)
        return -1;
    memcpy(rec->u.bytes, text, n);
    rec->u.bytes[n] = '\0';
    rec->kind = K_BYTES;
    rec->nbytes = n;
    snprintf(doc->name, sizeof doc->name, "%s", (const char *)rec->u.bytes);
    return 0;
}

static int tlv_sum_ints(struct record *rec, const unsigned char *v, size_t n)
{
    int total = 0;
    size_t i;

    if (n % 4 != 0)
        return fail("INTS length %zu is not a multiple of 4", n);
    for (i = 0; i < n; i += 4)
        total += (int32_t)rd32(v + i);
    printf("ints: %zu values, total %d\n", n / 4, total);
    rec->kind = K_NUM;
    rec->u.num = (uint64_t)(int64_t)total;
    rec->nbytes = 4;
    return 0;
}

static int tlv_read_u16_array(struct record *rec, const unsigned char *v, size_t n)
{
    unsigned count = v[0];
    size_t entries = (n - 1) / 2, i;
    uint16_t *arr;

    if (count == 0 || (n - 1) % 2 != 0)
        return fail("malformed U16S record");
    arr = malloc(count * sizeof *arr);
    if (!arr)
        return -1;
    for (i = 0; i < entries; i++)
        arr[i] = rd16(v + 1 + 2 * i);
    rec->kind = K_BYTES;
    rec->u.bytes = (unsigned char *)arr;
    rec->nbytes = count * sizeof *arr;
    printf("u16 array: %u entries, first %u\n", count, (unsigned)arr[0]);
    return 0;
}

static int tlv_scale_value(struct record *rec, const unsigned char *v)
{
    int base = (int16_t)rd16(v);
    unsigned shift = v[2];
    int scaled;

    if (base < 0)
        return fail("negative SCALED base");
    scaled = base << shift;
    printf("scaled: %d << %u = %d\n", base, shift, scaled);
    rec->kind = K_NUM;
    rec->u.num = (uint64_t)scaled;
    rec->nbytes = 4;
    return 0;
}

static int tlv_resolve_ref(const struct record *recs, unsigned n, unsigned idx)
{
    const struct record *r;

    if (idx >= n)
        return -1;
    r = &recs[idx];
    if (r->type != T_REF)
        return (int)idx;
    return tlv_resolve_ref(recs, n, (unsigned)r->u.num);
}

static void tlv_dump_record(const struct record *r)
{
    size_t i, show;

    printf("dump: type %u, %u bytes:", r->type, r->len);
    if (r->dropped || r->kind == K_NONE || r->nbytes == 0) {
        printf(" (no payload)");
        return;
    }
    show = r->nbytes < 8 ? r->nbytes : 8;
    for (i = 0; i < show; i++)
        printf(" %02x", r->u.bytes[i]);
    printf("");
}

static void tlv_drop_record(struct record *r)
{
    if (r->dropped || r->kind != K_BYTES)
        return;
    free(r->u.bytes);
    r->dropped = 1;
}

static uint32_t tlv_record_checksum(const struct record *r)
{
    uint32_t h = 2166136261u;
    size_t i;

    for (i = 0; i < r->nbytes; i++)
        h = (h ^ r->u.bytes[i]) * 16777619u;
    return h;
}

static int tlv_handle(struct tlv_doc *doc, struct record *rec, const unsigned char *v, size_t n)
{
    unsigned idx;

    switch (rec->type) {
    case T_NAME:
        return tlv_read_string(doc, rec, v, n);
    case T_INTS:
        return tlv_sum_ints(rec, v, n);
    case T_REF:
        idx = rd16(v);
        if (idx >= MAX_RECORDS)
            return fail("REF index %u out of range", idx);
        rec->kind = K_NUM;
        rec->u.num = idx;
        rec->nbytes = 2;
        return 0;
    case T_U16S:
        return tlv_read_u16_array(rec, v, n);
    case T_SCALED:
        return tlv_scale_value(rec, v);
    case T_NUMBER:
        rec->kind = K_NUM;
        rec->u.num = rd64(v);
        rec->nbytes = 8;
        return 0;
    case T_DUMP:
    case T_DROP:
        idx = rd16(v);
        if (idx >= doc->nrecs)
            return fail("record index %u does not exist yet", idx);
        if (rec->type == T_DUMP)
            tlv_dump_record(&doc->recs[idx]);
        else
            tlv_drop_record(&doc->recs[idx]);
        return 0;
    default:
        return 0; /* reserved */
    }
}

static int tlv_parse(struct tlv_doc *doc, const unsigned char *buf, size_t len)
{
    size_t pos = 4;

    if (len < 4 || memcmp(buf, TLV_MAGIC, 4) != 0)
        return fail("bad magic");
    while (pos < len) {
        struct record *rec;
        unsigned type, vlen;

        if (len - pos < 3)
            return fail("truncated record header at %zu", pos);
        type = buf[pos];
        vlen = rd16(buf + pos + 1);
        pos += 3;
        if (vlen > len - pos)
            return fail("record value runs past end of input");
        if (type == 0 || vlen < tlv_min_length(type))
            return fail("record of type %u is too short", type);
        if (type >= TLV_TYPE_LIMIT)
            return fail("unknown record type %u", type);
        if (doc->nrecs >= MAX_RECORDS)
            return fail("too many records");
        rec = &doc->recs[doc->nrecs];
        rec->type = type;
        rec->len = vlen;
        if (tlv_handle(doc, rec, buf + pos, vlen) != 0)
            return -1;
        doc->nrecs++;
        pos += vlen;
    }
    return 0;
}

static void tlv_summary(const struct tlv_doc *doc)
{
    unsigned i;

    printf("stream '%s': %u records\n", doc->name[0] ? doc->name : "(unnamed)", doc->nrecs);
    for (i = 0; i < doc->nrecs; i++) {
        const struct record *r = &doc->recs[i];

        if (r->type == T_REF)
            printf("record %u: alias of record %d\n", i, tlv_resolve_ref(doc->recs, doc->nrecs, (unsigned)r->u.num));
        else if (r->kind == K_BYTES)
            printf("record %u: %zu bytes, checksum %08x\n", i, r->nbytes, (unsigned)tlv_record_checksum(r));
        else if (r->kind == K_NUM)
            printf("record %u: number %llu\n", i, (unsigned long long)r->u.num);
    }
}

static int tlv_process(const unsigned char *buf, size_t len)
{
    struct tlv_doc *doc = calloc(1, sizeof *doc);
    unsigned i;
    int rc;

    if (!doc)
        return -1;
    rc = tlv_parse(doc, buf, len);
    if (rc == 0)
        tlv_summary(doc);
    for (i = 0; i < MAX_RECORDS; i++)
        if (doc->recs[i].kind == K_BYTES && !doc->recs[i].dropped)
            free(doc->recs[i].u.bytes);
    free(doc);
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
        fprintf(stderr, "tlvparse: cannot read %s\n", argv[1]);
        return 1;
    }
    rc = tlv_process(buf, len);
    free(buf);
    return rc == 0 ? 0 : 1;
}
