/*
 * calcvm - a tiny stack bytecode virtual machine.
 * Program file: "CVM1" followed by bytecode. Values are 32-bit signed integers or heap handles.
 * Immediates are little endian; call targets are offsets into the bytecode. Binary operators
 * pop b, then a, and push (a op b).
 *   0x00 HALT  0x01 PUSH i32  0x02 ADD  0x03 SUB  0x04 MUL  0x05 DIV  0x06 MOD  0x07 SHL  0x08 SHR
 *   0x09 STORE u8 (pop into a local slot)   0x0a LOAD u8 (push a local slot)
 *   0x0b ALLOC (pop n, then pop n values; push a handle to a heap object holding them)
 *   0x0c FREE (pop a handle and release the object's cells)
 *   0x0d HGET (pop index, pop handle, push that cell)   0x0e PRINT (pop an integer, print it)
 *   0x0f CALL u16   0x10 RET
 * Before running, the VM walks every call path to count the reachable code.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STACK_CAP 16
#define NLOCALS 16
#define MAX_HEAP 8
#define MAX_CELLS 64
#define MAX_CALLS 16
#define MAX_STEPS 100000

enum {
    OP_HALT, OP_PUSH, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MOD, OP_SHL, OP_SHR, OP_STORE, OP_LOAD,
    OP_ALLOC, OP_FREE, OP_HGET, OP_PRINT, OP_CALL, OP_RET, OP_COUNT
};

static const uint8_t op_operand_bytes[OP_COUNT] = { 0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 2, 0 };

enum { V_INT, V_HANDLE };

struct hobj {
    int32_t *cells;
    uint32_t n;
    int live;
};

struct value {
    int tag;
    union { int32_t i; struct hobj *h; } u;
};

struct vm {
    const uint8_t *code;
    size_t len, pc, sp;
    struct value *stack; /* STACK_CAP slots */
    struct value locals[NLOCALS];
    struct hobj *heap[MAX_HEAP];
    size_t calls[MAX_CALLS];
    unsigned nheap, ncalls;
    unsigned long steps;
};

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static struct value vm_make(int tag, int32_t x)
{
    struct value v;
    memset(&v, 0, sizeof v);
    v.tag = tag;
    v.u.i = x;
    return v;
}

static int vm_fail(const char *msg)
{
    fprintf(stderr, "calcvm: %s\n", msg);
    return -1;
}

static int vm_push(struct vm *vm, struct value v)
{
    if (vm->sp > STACK_CAP)
        return vm_fail("stack overflow");
    vm->stack[vm->sp++] = v;
    return 0;
}

static int vm_pop(struct vm *vm, struct value *v)
{
    if (vm->sp == 0)
        return vm_fail("stack underflow");
    *v = vm->stack[--vm->sp];
    return 0;
}

static int vm_pop_int(struct vm *vm, int32_t *x)
{
    struct value v;
    if (vm_pop(vm, &v) != 0)
        return -1;
    if (v.tag != V_INT)
        return vm_fail("integer expected");
    *x = v.u.i;
    return 0;
}

static int32_t vm_arith(int op, int32_t a, int32_t b)
{
    if (op == OP_ADD)
        return a + b;
    if (op == OP_SUB)
        return a - b;
    return a * b;
}

static int vm_op_div(int op, int32_t a, int32_t b, int32_t *r)
{
    if (a == INT32_MIN && b == -1)
        return vm_fail("division overflow");
    *r = op == OP_DIV ? a / b : a % b;
    return 0;
}

static int vm_op_shift(int op, int32_t a, int32_t b, int32_t *r)
{
    if (b < 0)
        return vm_fail("negative shift");
    *r = op == OP_SHL ? (int32_t)((uint32_t)a << b) : a >> b;
    return 0;
}

static int vm_op_store(struct vm *vm, unsigned idx)
{
    struct value v;
    if (idx > NLOCALS)
        return vm_fail("bad local slot");
    if (vm_pop(vm, &v) != 0)
        return -1;
    vm->locals[idx].tag = v.tag;
    vm->locals[idx].u = v.u;
    return 0;
}

static int vm_heap_alloc(struct vm *vm)
{
    struct value v;
    struct hobj *o;
    int32_t n, i;
    if (vm_pop_int(vm, &n) != 0)
        return -1;
    if (n <= 0 || n > MAX_CELLS || vm->nheap >= MAX_HEAP)
        return vm_fail("bad allocation");
    o = calloc(1, sizeof *o);
    if (!o || !(o->cells = calloc((size_t)n, sizeof *o->cells))) {
        free(o);
        return -1;
    }
    o->n = (uint32_t)n;
    o->live = 1;
    vm->heap[vm->nheap++] = o;
    for (i = n - 1; i >= 0; i--)
        if (vm_pop_int(vm, &o->cells[i]) != 0)
            return -1;
    v = vm_make(V_HANDLE, 0);
    v.u.h = o;
    return vm_push(vm, v);
}

static int vm_heap_free(struct vm *vm)
{
    struct value v;
    struct hobj *o;
    if (vm_pop(vm, &v) != 0)
        return -1;
    o = v.u.h;
    if (!o->live)
        return vm_fail("object already freed");
    free(o->cells);
    o->live = 0;
    return 0;
}

static int vm_heap_get(struct vm *vm)
{
    struct value h;
    int32_t idx;
    if (vm_pop_int(vm, &idx) != 0 || vm_pop(vm, &h) != 0)
        return -1;
    if (h.tag != V_HANDLE || idx < 0 || (uint32_t)idx >= h.u.h->n)
        return vm_fail("bad heap read");
    return vm_push(vm, vm_make(V_INT, h.u.h->cells[idx]));
}

static long vm_count_reachable(const uint8_t *code, size_t len, size_t pc)
{
    long count = 0;
    while (pc < len) {
        uint8_t op = code[pc];
        size_t size;
        if (op == OP_HALT || op == OP_RET)
            return count + 1;
        if (op >= OP_COUNT)
            return -1;
        size = 1 + (size_t)op_operand_bytes[op];
        if (pc + size > len)
            return -1;
        if (op == OP_CALL) {
            long sub = vm_count_reachable(code, len, (size_t)code[pc + 1] | ((size_t)code[pc + 2] << 8));
            if (sub < 0)
                return -1;
            count += sub;
        }
        count++;
        pc += size;
    }
    return count;
}

static int vm_step(struct vm *vm, uint8_t op, const uint8_t *arg)
{
    int32_t a, b, r;
    switch (op) {
    case OP_PUSH:
        return vm_push(vm, vm_make(V_INT, (int32_t)rd32(arg)));
    case OP_ADD: case OP_SUB: case OP_MUL:
    case OP_DIV: case OP_MOD: case OP_SHL: case OP_SHR:
        if (vm_pop_int(vm, &b) != 0 || vm_pop_int(vm, &a) != 0)
            return -1;
        if (op == OP_DIV || op == OP_MOD) {
            if (vm_op_div(op, a, b, &r) != 0)
                return -1;
        } else if (op == OP_SHL || op == OP_SHR) {
            if (vm_op_shift(op, a, b, &r) != 0)
                return -1;
        } else {
            r = vm_arith(op, a, b);
        }
        return vm_push(vm, vm_make(V_INT, r));
    case OP_STORE:
        return vm_op_store(vm, arg[0]);
    case OP_LOAD:
        if (arg[0] >= NLOCALS)
            return vm_fail("bad local slot");
        return vm_push(vm, vm->locals[arg[0]]);
    case OP_ALLOC:
        return vm_heap_alloc(vm);
    case OP_FREE:
        return vm_heap_free(vm);
    case OP_HGET:
        return vm_heap_get(vm);
    case OP_PRINT:
        if (vm_pop_int(vm, &a) != 0)
            return -1;
        printf("%d\n", (int)a);
        return 0;
    case OP_CALL:
        if (vm->ncalls >= MAX_CALLS)
            return vm_fail("call stack overflow");
        vm->calls[vm->ncalls++] = vm->pc;
        vm->pc = (size_t)arg[0] | ((size_t)arg[1] << 8);
        return 0;
    default:
        return vm_fail("bad opcode");
    }
}

static int vm_run(struct vm *vm)
{
    while (vm->pc < vm->len) {
        uint8_t op = vm->code[vm->pc];
        size_t size;
        if (++vm->steps > MAX_STEPS)
            return vm_fail("step limit reached");
        if (op == OP_HALT)
            return 0;
        if (op == OP_RET) {
            if (vm->ncalls == 0)
                return 0;
            vm->pc = vm->calls[--vm->ncalls];
            continue;
        }
        if (op >= OP_COUNT)
            return vm_fail("bad opcode");
        size = 1 + (size_t)op_operand_bytes[op];
        if (vm->pc + size > vm->len)
            return vm_fail("truncated instruction");
        vm->pc += size;
        if (vm_step(vm, op, vm->code + vm->pc - size + 1) != 0)
            return -1;
    }
    return 0;
}

static int vm_execute(const uint8_t *buf, size_t len)
{
    struct vm *vm;
    long reach;
    unsigned i;
    int rc;
    if (len < 4 || memcmp(buf, "CVM1", 4) != 0)
        return vm_fail("not a CVM1 program");
    reach = vm_count_reachable(buf + 4, len - 4, 0);
    if (reach < 0)
        return vm_fail("malformed bytecode");
    vm = calloc(1, sizeof *vm);
    if (!vm)
        return -1;
    vm->code = buf + 4;
    vm->len = len - 4;
    vm->stack = calloc(STACK_CAP, sizeof *vm->stack);
    rc = vm->stack ? vm_run(vm) : -1;
    if (rc == 0)
        printf("%ld reachable instructions, halted after %lu steps, stack depth %zu\n", reach, vm->steps, vm->sp);
    for (i = 0; i < vm->nheap; i++) {
        if (vm->heap[i]->live)
            free(vm->heap[i]->cells);
        free(vm->heap[i]);
    }
    free(vm->stack);
    free(vm);
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
        fprintf(stderr, "calcvm: cannot read %s\n", argv[1]);
        return 1;
    }
    rc = vm_execute(buf, len);
    free(buf);
    return rc == 0 ? 0 : 1;
}
