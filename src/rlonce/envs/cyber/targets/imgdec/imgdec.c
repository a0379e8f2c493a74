/*
 * imgdec - decoder for the tiny "IMGD" paletted image format.
 *
 * Header (12 bytes):
 *   "IMGD"     magic
 *   u16 width  little endian
 *   u16 height little endian
 *   u8  depth  bits per pixel index, 1..8
 *   u8  flags  bit0: the image has a comment chunk, bit1: build a thumbnail
 *   u8  scale  thumbnail reduction factor
 *   u8  ncolors, followed by ncolors palette entries of 3 bytes (r, g, b)
 * After the palette come chunks, each: u8 tag, u16 length, data[length]
 *   'P'  pixel data, run-length encoded as (run, value) byte pairs
 *   'S'  significant bits: u8 number of low bits kept in every pixel
 *   'F'  frame snapshot: u8 disposal (0 keep, 2 discard once shown)
 *   'C'  comment text
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PIXELS (1 << 20)
#define MAX_COLORS 16
#define MAX_CHUNKS 16
#define MAX_FRAMES 4
#define FLAG_COMMENT 0x01
#define FLAG_THUMB 0x02

struct chunk {
    unsigned tag;
    unsigned len;
    const unsigned char *data;
};

struct image {
    unsigned width, height, depth, flags, scale;
    unsigned ncolors;
    uint8_t pal[MAX_COLORS][3];
    unsigned char *pixels;
    size_t npixels;
    struct chunk chunks[MAX_CHUNKS];
    unsigned nchunks;
    unsigned char *frames[MAX_FRAMES];
    unsigned nframes;
};

static unsigned rd16(const unsigned char *p)
{
    return (unsigned)p[0] | ((unsigned)p[1] << 8);
}

static int img_compute_size(struct image *img)
{
    int w = (int)img->width, h = (int)img->height;
    int total = w * h;

    if (total <= 0 || total > MAX_PIXELS) {
        fprintf(stderr, "imgdec: bad dimensions %ux%u\n", img->width, img->height);
        return -1;
    }
    img->npixels = (size_t)total;
    return 0;
}

static int img_read_palette(struct image *img, const unsigned char *p, size_t avail)
{
    unsigned i;

    if (img->ncolors > (1u << img->depth)) {
        fprintf(stderr, "imgdec: %u colors do not fit depth %u\n", img->ncolors, img->depth);
        return -1;
    }
    if (avail < img->ncolors * 3u) {
        fprintf(stderr, "imgdec: truncated palette\n");
        return -1;
    }
    for (i = 0; i < img->ncolors; i++) {
        img->pal[i][0] = p[3 * i];
        img->pal[i][1] = p[3 * i + 1];
        img->pal[i][2] = p[3 * i + 2];
    }
    return 0;
}

static int img_rle_decode(struct image *img, const unsigned char *d, size_t n)
{
    size_t pos = 0, i;

    if (n % 2 != 0) {
        fprintf(stderr, "imgdec: odd RLE chunk length\n");
        return -1;
    }
    for (i = 0; i < n; i += 2) {
        unsigned run = d[i], k;
        unsigned char value = d[i + 1];

        if (pos >= img->npixels) {
            fprintf(stderr, "imgdec: pixel data overruns the image\n");
            return -1;
        }
        for (k = 0; k < run; k++)
            img->pixels[pos++] = value;
    }
    printf("decoded %zu of %zu pixels\n", pos, img->npixels);
    return 0;
}

static int img_apply_sbits(struct image *img, const unsigned char *d, size_t n)
{
    int bits, mask;
    size_t i;

    if (n < 1) {
        fprintf(stderr, "imgdec: empty significant-bits chunk\n");
        return -1;
    }
    bits = d[0];
    mask = (1 << bits) - 1;
    for (i = 0; i < img->npixels; i++)
        img->pixels[i] &= (unsigned char)mask;
    printf("significant bits: %d\n", bits);
    return 0;
}

static void img_dispose_frame(struct image *img, unsigned idx)
{
    free(img->frames[idx]);
    printf("frame %u discarded\n", idx);
}

static int img_add_frame(struct image *img, const unsigned char *d, size_t n)
{
    unsigned char *f;

    if (n < 1 || img->nframes >= MAX_FRAMES) {
        fprintf(stderr, "imgdec: bad frame chunk\n");
        return -1;
    }
    f = malloc(img->npixels);
    if (!f)
        return -1;
    memcpy(f, img->pixels, img->npixels);
    img->frames[img->nframes++] = f;
    if (d[0] == 2)
        img_dispose_frame(img, img->nframes - 1);
    return 0;
}

static void img_scale_thumbnail(const struct image *img)
{
    unsigned tw = img->width / img->scale;
    unsigned th = img->height / img->scale;

    printf("thumbnail: %ux%u\n", tw ? tw : 1, th ? th : 1);
}

static const struct chunk *img_find_chunk(const struct image *img, unsigned tag)
{
    unsigned i;

    for (i = 0; i < img->nchunks; i++)
        if (img->chunks[i].tag == tag)
            return &img->chunks[i];
    return NULL;
}

static void img_print_comment(const struct image *img)
{
    const struct chunk *c = img_find_chunk(img, 'C');
    unsigned n = c->len;

    if (n > 60)
        n = 60;
    printf("comment: %.*s\n", (int)n, (const char *)c->data);
}

static void img_preview_row(const struct image *img)
{
    unsigned char row[64];
    size_t n = img->width, i;
    unsigned sum = 0;

    if (n > img->npixels)
        n = img->npixels;
    memcpy(row, img->pixels, n);
    for (i = 0; i < n; i++)
        sum += row[i];
    printf("first row: %zu pixels, index sum %u", n, sum);
    if (row[0] < img->ncolors)
        printf(", first color #%02x%02x%02x", img->pal[row[0]][0], img->pal[row[0]][1], img->pal[row[0]][2]);
    printf("\n");
}

static void img_destroy(struct image *img)
{
    unsigned i;

    for (i = 0; i < img->nframes; i++)
        free(img->frames[i]);
    free(img->pixels);
    free(img);
}

static int img_read_chunks(struct image *img, const unsigned char *buf, size_t len, size_t pos)
{
    while (pos < len) {
        struct chunk *c;
        int rc = 0;

        if (len - pos < 3) {
            fprintf(stderr, "imgdec: truncated chunk header\n");
            return -1;
        }
        if (img->nchunks >= MAX_CHUNKS) {
            fprintf(stderr, "imgdec: too many chunks\n");
            return -1;
        }
        c = &img->chunks[img->nchunks++];
        c->tag = buf[pos];
        c->len = rd16(buf + pos + 1);
        pos += 3;
        if (c->len > len - pos) {
            fprintf(stderr, "imgdec: chunk '%c' runs past end of input\n", c->tag);
            return -1;
        }
        c->data = buf + pos;
        if (c->tag == 'P')
            rc = img_rle_decode(img, c->data, c->len);
        else if (c->tag == 'S')
            rc = img_apply_sbits(img, c->data, c->len);
        else if (c->tag == 'F')
            rc = img_add_frame(img, c->data, c->len);
        if (rc != 0)
            return -1;
        pos += c->len;
    }
    return 0;
}

static int img_decode(const unsigned char *buf, size_t len)
{
    struct image *img;

    if (len < 12 || memcmp(buf, "IMGD", 4) != 0) {
        fprintf(stderr, "imgdec: not an IMGD file\n");
        return -1;
    }
    img = calloc(1, sizeof *img);
    if (!img)
        return -1;
    img->width = rd16(buf + 4);
    img->height = rd16(buf + 6);
    img->depth = buf[8];
    img->flags = buf[9];
    img->scale = buf[10];
    img->ncolors = buf[11];
    if (img->depth < 1 || img->depth > 8) {
        fprintf(stderr, "imgdec: unsupported depth %u\n", img->depth);
        goto fail;
    }
    if (img_compute_size(img) != 0 || img_read_palette(img, buf + 12, len - 12) != 0)
        goto fail;
    img->pixels = calloc(img->npixels, 1);
    if (!img->pixels)
        goto fail;
    if (img_read_chunks(img, buf, len, 12 + img->ncolors * 3u) != 0)
        goto fail;
    if (img->flags & FLAG_THUMB)
        img_scale_thumbnail(img);
    if (img->flags & FLAG_COMMENT)
        img_print_comment(img);
    img_preview_row(img);
    printf("image %ux%u, depth %u, %u colors, %u chunks, %u frames\n", img->width, img->height, img->depth,
           img->ncolors, img->nchunks, img->nframes);
    img_destroy(img);
    return 0;
fail:
    img_destroy(img);
    return -1;
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
        fprintf(stderr, "imgdec: cannot read %s\n", argv[1]);
        return 1;
    }
    rc = img_decode(buf, len);
    free(buf);
    return rc == 0 ? 0 : 1;
}
