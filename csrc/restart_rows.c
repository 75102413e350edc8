/* Decode a JPEG from an MCU row in its middle: the rows above are not even Huffman-decoded.
 *
 * libjpeg's jpeg_skip_scanlines must entropy-decode every skipped row (the DC coefficients are
 * coded as differences, so each block depends on all blocks before it), and entropy decoding is
 * most of a decode. A restart marker resets that chain: the data after RSTn starts a new,
 * byte-aligned interval whose DC predictors are zero. When a marker sits at the start of an MCU
 * row (some cameras and tools write one after every MCU row), the data from that marker on is a
 * valid scan of a shorter image: the same headers with the frame's height reduced by the rows
 * left out, that data, the later markers renumbered from RST0, and EOI. Nothing is re-encoded.
 *
 * Exactness: the IDCT works per block, and fancy chroma upsampling, the only step that looks at a
 * neighbouring MCU row, treats the first row of the shorter image as an edge. So the new JPEG
 * starts one MCU row above the first row the caller needs, and that row is decoded and dropped.
 * Every marker is checked (numbered RST0..7 in turn, as many as the frame has intervals, the
 * scan ended by EOI); anything else leaves the JPEG to the normal path.
 */
#include "restart_rows.h"

#include <stdlib.h>
#include <string.h>

struct layout {
    size_t sof;     /* offset of the SOF0/SOF1 marker */
    size_t scan;    /* offset of the first entropy-coded byte */
    unsigned int height, width, mcu_height, mcus_per_row, interval;
};

static unsigned int be16(const unsigned char *p) { return (unsigned int)p[0] << 8 | p[1]; }

static int is_restart(unsigned char marker) { return marker >= 0xD0 && marker <= 0xD7; }

/* The offset of the next marker at or after i in entropy-coded data (0xFF00 is a stuffed 0xFF,
 * 0xFF before 0xFF a fill byte), or n. */
static size_t next_marker(const unsigned char *d, size_t i, size_t n) {
    while (i + 1 < n) {
        const unsigned char *p = memchr(d + i, 0xFF, n - 1 - i);
        if (p == NULL) return n;
        i = (size_t)(p - d);
        if (d[i + 1] == 0x00)
            i += 2;
        else if (d[i + 1] == 0xFF)
            i += 1;
        else
            return i;
    }
    return n;
}

/* A baseline (or extended sequential, 8-bit, Huffman) JPEG with one interleaved scan and a
 * restart interval: where its frame header and scan data are and how its MCUs are laid out. */
static int read_layout(const unsigned char *d, size_t n, struct layout *L) {
    size_t i = 2;
    unsigned int components = 0, hmax = 1, vmax = 1;
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    L->sof = 0;
    L->interval = 0;
    for (;;) {
        while (i + 1 < n && d[i] == 0xFF && d[i + 1] == 0xFF) i++;
        if (i + 4 > n || d[i] != 0xFF) return 0;
        unsigned int marker = d[i + 1], length = be16(d + i + 2);
        const unsigned char *s = d + i + 4;
        if (length < 2 || i + 2 + length > n) return 0;
        if (marker == 0xC0 || marker == 0xC1) {
            if (length < 8 || s[0] != 8) return 0;
            L->sof = i;
            L->height = be16(s + 1);
            L->width = be16(s + 3);
            components = s[5];
            if (components == 0 || length != 8 + 3 * components) return 0;
            for (unsigned int c = 0; c < components; c++) {
                unsigned int h = s[7 + 3 * c] >> 4, v = s[7 + 3 * c] & 0x0F;
                if (h == 0 || v == 0) return 0;
                if (h > hmax) hmax = h;
                if (v > vmax) vmax = v;
            }
        } else if (marker >= 0xC2 && marker <= 0xCF && marker != 0xC4) {
            return 0; /* progressive, lossless, arithmetic coding (DAC included) */
        } else if (marker == 0xDD) {
            if (length != 4) return 0;
            L->interval = be16(s);
        } else if (marker == 0xDA) {
            if (L->sof == 0 || length < 3 || s[0] != components) return 0;
            L->scan = i + 2 + length;
            break;
        }
        i += 2 + length;
    }
    if (L->interval == 0 || L->height == 0 || L->width == 0) return 0;
    /* A scan of one component is not interleaved: its MCU is one 8x8 block. */
    unsigned int mcu_width = components == 1 ? 8 : 8 * hmax;
    L->mcu_height = components == 1 ? 8 : 8 * vmax;
    L->mcus_per_row = (L->width + mcu_width - 1) / mcu_width;
    return 1;
}

void jpeg_from_row(const unsigned char *d, size_t n, unsigned int first_row, struct jpeg_rows *out) {
    struct layout L = {0};
    out->data = NULL;
    out->size = 0;
    out->skipped_rows = 0;
    if (!read_layout(d, n, &L) || first_row >= L.height) return;
    /* The latest MCU row that starts an interval, one MCU row (the upsampling context) above. */
    unsigned long long row = first_row / L.mcu_height;
    row = row > 0 ? row - 1 : 0;
    while (row > 0 && row * L.mcus_per_row % L.interval != 0) row--;
    if (row == 0) return;
    unsigned long long start_marker = row * L.mcus_per_row / L.interval - 1;
    unsigned long long rows = (L.height + L.mcu_height - 1) / L.mcu_height;
    unsigned long long intervals = (rows * L.mcus_per_row + L.interval - 1) / L.interval;

    size_t start = 0, i = L.scan;
    unsigned long long count = 0;
    for (;;) {
        i = next_marker(d, i, n);
        if (i >= n) return; /* truncated: the normal path reports it */
        if (!is_restart(d[i + 1])) break;
        if ((unsigned int)(d[i + 1] - 0xD0) != count % 8) return;
        if (count == start_marker) start = i + 2;
        count++;
        i += 2;
    }
    size_t end = i; /* the marker that ends the scan */
    if (d[end + 1] != 0xD9 || count != intervals - 1 || start == 0) return;

    size_t head = L.scan, body = end - start;
    unsigned char *j = malloc(head + body + 2);
    if (j == NULL) return;
    memcpy(j, d, head);
    unsigned int height = L.height - (unsigned int)(row * L.mcu_height);
    j[L.sof + 5] = (unsigned char)(height >> 8);
    j[L.sof + 6] = (unsigned char)(height & 0xFF);
    memcpy(j + head, d + start, body);
    unsigned int shift = (unsigned int)((start_marker + 1) % 8);
    for (size_t k = next_marker(j, head, head + body); k < head + body; k = next_marker(j, k + 2, head + body))
        j[k + 1] = (unsigned char)(0xD0 + (j[k + 1] - 0xD0 + 8 - shift) % 8);
    j[head + body] = 0xFF;
    j[head + body + 1] = 0xD9;
    out->data = j;
    out->size = head + body + 2;
    out->skipped_rows = (unsigned int)(row * L.mcu_height);
}
