#include <stdio.h>
struct cfg { int n; char *name; };
static struct cfg *lookup(const char *k) { (void)k; return NULL; }
static int read_name(const char *k) { struct cfg *c = lookup(k); return c->name[0]; }
int main(int argc, char **argv) { (void)argc; printf("%d\n", read_name(argv[1])); return 0; }
