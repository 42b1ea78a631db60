// The fiber switch of the cudasim runtime (x86-64 System V); cudasim.cpp drives it.
#include "runtime.h"

#if !defined(__x86_64__)
#error "cudasim's fiber switch is written for x86-64"
#endif

// cudasim_switch and cudasim_trampoline, declared (and their contract described) in runtime.h.
asm(R"(
    .text
    .globl cudasim_switch
    .hidden cudasim_switch
    .type cudasim_switch, @function
cudasim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch, .-cudasim_switch

    .globl cudasim_trampoline
    .hidden cudasim_trampoline
    .type cudasim_trampoline, @function
cudasim_trampoline:
    movq %r12, %rdi
    call *%r13
    ud2
    .size cudasim_trampoline, .-cudasim_trampoline
)");
