/* Coverage feedback for the atheris run of the window decoder (tests/support/fuzz_jpegwindow.py), with
 * gcc: the extension's own sources are compiled with -fsanitize-coverage=trace-pc, which calls
 * __sanitizer_cov_trace_pc at every basic block. The libFuzzer inside atheris no longer takes
 * that callback (it aborts; clang's inline 8-bit counters replaced it), so this file, compiled
 * without instrumentation, counts each block in a table of its own, and the fuzz script hands
 * the table to libFuzzer with __sanitizer_cov_8bit_counters_init / __sanitizer_cov_pcs_init.
 * Blocks are told apart by their address modulo the table size: the extension's code is far
 * smaller than 64 KiB, so no two blocks share a counter. */
#include <stdint.h>

#define IMGPACK_COV_SLOTS 65536
unsigned char imgpack_cov_counters[IMGPACK_COV_SLOTS];
uintptr_t imgpack_cov_pcs[2 * IMGPACK_COV_SLOTS]; /* (pc, flags) pairs, as libFuzzer wants them */

/* Hidden: the blocks of this library call this definition, not libFuzzer's (loaded first). */
__attribute__((visibility("hidden"))) void __sanitizer_cov_trace_pc(void) {
    uintptr_t pc = (uintptr_t)__builtin_return_address(0);
    unsigned int slot = (unsigned int)(pc % IMGPACK_COV_SLOTS);
    imgpack_cov_counters[slot]++;
    imgpack_cov_pcs[2 * slot] = pc;
}
