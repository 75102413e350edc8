/* Test-data tool: JPEGs Pillow and OpenCV cannot write, made with the libjpeg-turbo the window
 * decoder uses (dlopened the same way, csrc/jpegwindow.c). tests/support/jpeg_variants.py builds and
 * runs it; not part of the extension.
 *
 *   variants LIBRARY arithmetic [progressive] < baseline.jpg > arithmetic.jpg
 *       the same coefficients, arithmetic-coded (lossless transcoding, as jpegtran -arithmetic)
 *   variants LIBRARY 12bit HEIGHT WIDTH COMPONENTS [arithmetic] < pixels > 12bit.jpg
 *       8-bit pixels (HWC) scaled to 12 bits, written as a 12-bit JPEG
 * Exit status 2 with a message on stderr when the library refuses.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libjpeg-turbo/jpeglib.h"

typedef short J12SAMPLE;
typedef J12SAMPLE *J12SAMPROW;

#define ENTRY(name) static __typeof__(name) *p_##name
ENTRY(jpeg_std_error);
ENTRY(jpeg_CreateCompress);
ENTRY(jpeg_CreateDecompress);
ENTRY(jpeg_destroy_compress);
ENTRY(jpeg_destroy_decompress);
ENTRY(jpeg_mem_src);
ENTRY(jpeg_mem_dest);
ENTRY(jpeg_read_header);
ENTRY(jpeg_read_coefficients);
ENTRY(jpeg_copy_critical_parameters);
ENTRY(jpeg_write_coefficients);
ENTRY(jpeg_finish_compress);
ENTRY(jpeg_finish_decompress);
ENTRY(jpeg_set_defaults);
ENTRY(jpeg_set_quality);
ENTRY(jpeg_simple_progression);
ENTRY(jpeg_start_compress);
static JDIMENSION (*p_jpeg12_write_scanlines)(j_compress_ptr, J12SAMPROW *, JDIMENSION);

static jmp_buf escape;
static void on_error(j_common_ptr cinfo) {
    char message[JMSG_LENGTH_MAX];
    cinfo->err->format_message(cinfo, message);
    fprintf(stderr, "libjpeg: %s\n", message);
    longjmp(escape, 1);
}

static unsigned char *read_all(size_t *size) {
    size_t capacity = 1 << 16, n = 0, got;
    unsigned char *data = malloc(capacity);
    while (data != NULL && (got = fread(data + n, 1, capacity - n, stdin)) > 0) {
        n += got;
        if (n == capacity) data = realloc(data, capacity *= 2);
    }
    *size = n;
    return data;
}

int main(int argc, char **argv) {
    if (argc < 3) return 1;
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
#define LOOKUP(name)                                                  \
    if ((*(void **)&p_##name = dlsym(library, #name)) == NULL) {      \
        fprintf(stderr, "%s has no %s\n", argv[1], #name);            \
        return 1;                                                     \
    }
    LOOKUP(jpeg_std_error);
    LOOKUP(jpeg_CreateCompress);
    LOOKUP(jpeg_CreateDecompress);
    LOOKUP(jpeg_destroy_compress);
    LOOKUP(jpeg_destroy_decompress);
    LOOKUP(jpeg_mem_src);
    LOOKUP(jpeg_mem_dest);
    LOOKUP(jpeg_read_header);
    LOOKUP(jpeg_read_coefficients);
    LOOKUP(jpeg_copy_critical_parameters);
    LOOKUP(jpeg_write_coefficients);
    LOOKUP(jpeg_finish_compress);
    LOOKUP(jpeg_finish_decompress);
    LOOKUP(jpeg_set_defaults);
    LOOKUP(jpeg_set_quality);
    LOOKUP(jpeg_simple_progression);
    LOOKUP(jpeg_start_compress);
    LOOKUP(jpeg12_write_scanlines);
#undef LOOKUP
    size_t size;
    unsigned char *input = read_all(&size);
    unsigned char *output = NULL;
    unsigned long output_size = 0;
    struct jpeg_error_mgr jerr;
    struct jpeg_compress_struct c;
    struct jpeg_decompress_struct d;
    c.err = p_jpeg_std_error(&jerr);
    d.err = c.err;
    jerr.error_exit = on_error;
    if (setjmp(escape)) return 2;
    p_jpeg_CreateCompress(&c, JPEG_LIB_VERSION, sizeof(c));
    p_jpeg_mem_dest(&c, &output, &output_size);
    if (strcmp(argv[2], "arithmetic") == 0) {
        p_jpeg_CreateDecompress(&d, JPEG_LIB_VERSION, sizeof(d));
        p_jpeg_mem_src(&d, input, size);
        p_jpeg_read_header(&d, TRUE);
        jvirt_barray_ptr *coefficients = p_jpeg_read_coefficients(&d);
        p_jpeg_copy_critical_parameters(&d, &c);
        c.arith_code = TRUE;
        if (argc > 3 && strcmp(argv[3], "progressive") == 0) p_jpeg_simple_progression(&c);
        p_jpeg_write_coefficients(&c, coefficients);
        p_jpeg_finish_compress(&c);
        p_jpeg_finish_decompress(&d);
        p_jpeg_destroy_decompress(&d);
    } else if (strcmp(argv[2], "12bit") == 0 && argc >= 6) {
        unsigned int height = (unsigned int)atoi(argv[3]), width = (unsigned int)atoi(argv[4]);
        int components = atoi(argv[5]);
        if (size < (size_t)height * width * components) return 1;
        c.image_height = height;
        c.image_width = width;
        c.input_components = components;
        c.in_color_space = components == 1 ? JCS_GRAYSCALE : JCS_RGB;
        c.data_precision = 12;
        p_jpeg_set_defaults(&c);
        c.data_precision = 12;
        c.optimize_coding = TRUE;
        c.arith_code = argc > 6 && strcmp(argv[6], "arithmetic") == 0;
        p_jpeg_set_quality(&c, 90, TRUE);
        p_jpeg_start_compress(&c, TRUE);
        J12SAMPLE *row = malloc(sizeof(J12SAMPLE) * width * components);
        for (unsigned int y = 0; y < height; y++) {
            for (size_t x = 0; x < (size_t)width * components; x++)
                row[x] = (J12SAMPLE)(input[(size_t)y * width * components + x] << 4);
            J12SAMPROW rows[1] = {row};
            p_jpeg12_write_scanlines(&c, rows, 1);
        }
        p_jpeg_finish_compress(&c);
        free(row);
    } else {
        return 1;
    }
    fwrite(output, 1, output_size, stdout);
    p_jpeg_destroy_compress(&c);
    free(output);
    free(input);
    return 0;
}
