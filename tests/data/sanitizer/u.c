#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
struct node { int v; struct node *next; };
static int mul(int a, int b) { return a * b; }
static int divi(int a, int b) { return a / b; }
static int getv(struct node *n) { return n->v; }
static int rec(int d) { char buf[256]; buf[0] = d; return d ? rec(d + 1) + buf[0] : 0; }
static void dfree(char *p) { free(p); free(p); }
static int uaf(void) { char *p = malloc(8); free(p); return p[1]; }
int main(int argc, char **argv) {
  int c = argv[1][0];
  if (c == 'm') printf("%d\n", mul(INT_MAX, argc + 1));
  if (c == 'd') printf("%d\n", divi(5, argc - 2));
  if (c == 'n') printf("%d\n", getv(NULL));
  if (c == 'r') printf("%d\n", rec(1));
  if (c == 'f') dfree(malloc(4));
  if (c == 'u') printf("%d\n", uaf());
  if (c == 's') { int *p = NULL; printf("%d\n", *(volatile int*)(p + 100)); }
  return 0;
}
