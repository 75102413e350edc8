/* Start a JPEG's entropy decoding at an MCU row instead of the first one (see restart_rows.c). */
#ifndef IMGPACK_RESTART_ROWS_H
#define IMGPACK_RESTART_ROWS_H

#include <stddef.h>

struct jpeg_rows {
    unsigned char *data; /* the JPEG to decode instead (malloc'ed; NULL: decode the original) */
    size_t size;
    unsigned int skipped_rows; /* full-size image rows above the new JPEG's first row */
};

/* A JPEG of the original's rows from a restart marker at or above MCU row (first_row / MCU
 * height) - 1 down, built from `data` without re-encoding, so that every row from `first_row` on
 * decodes to the whole decode's pixels. out->data is NULL when there is no such marker (no
 * restart markers at MCU row starts, a progressive or arithmetic-coded JPEG, damaged data, or a
 * row too near the top to gain anything). The caller frees out->data. */
void jpeg_from_row(const unsigned char *data, size_t size, unsigned int first_row, struct jpeg_rows *out);

#endif
