#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int parse_len(const unsigned char *b, size_t n) { char *p = malloc(4); memcpy(p, b, n); int r = p[0]; free(p); return r; }
int main(int argc, char **argv) { FILE *f = fopen(argv[1], "rb"); unsigned char buf[256]; size_t n = fread(buf, 1, sizeof buf, f); fclose(f); printf("%d\n", parse_len(buf, n)); return 0; }
