// schedlib CUDA emulator: switching between fibers (the CUDA threads of a block).  On x86-64 a few
// instructions save the callee-saved registers and swap stack pointers; elsewhere, or with
// SL_EMU_FORCE_UCONTEXT, ucontext's swapcontext does the same job more slowly (it also saves the signal mask).
#pragma once

#if defined(__x86_64__) && !defined(SL_EMU_FORCE_UCONTEXT)
#define SL_EMU_ASM_SWITCH 1
// sl_emu_ctx_switch(save, to): push callee-saved registers, store rsp in *save, load `to`, pop, ret.
// sl_emu_fiber_entry: first "return" target of a new fiber; calls r13(r12) on an aligned stack.
asm(R"(
  .text
  .globl sl_emu_ctx_switch
  .hidden sl_emu_ctx_switch
  .type sl_emu_ctx_switch,@function
  .p2align 4
sl_emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size sl_emu_ctx_switch, .-sl_emu_ctx_switch
  .globl sl_emu_fiber_entry
  .hidden sl_emu_fiber_entry
  .type sl_emu_fiber_entry,@function
  .p2align 4
sl_emu_fiber_entry:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size sl_emu_fiber_entry, .-sl_emu_fiber_entry
)");
extern "C" __attribute__((visibility("hidden"))) void sl_emu_ctx_switch(void** save_sp, void* new_sp);
extern "C" __attribute__((visibility("hidden"))) void sl_emu_fiber_entry();
#else
#include <ucontext.h>
#endif

namespace sl_emu {

struct Ctx {
#if SL_EMU_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

// Save the running fiber's context in `save` and continue `to`; returns when someone switches back.
inline void ctx_switch(Ctx* save, Ctx* to) {
#if SL_EMU_ASM_SWITCH
  sl_emu_ctx_switch(&save->sp, to->sp);
#else
  swapcontext(&save->uc, &to->uc);
#endif
  __asm__ __volatile__("" ::: "memory");
}

}  // namespace sl_emu
