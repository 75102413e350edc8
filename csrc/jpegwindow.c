/* Decode only a window of a JPEG: libjpeg-turbo's jpeg_crop_scanline + jpeg_skip_scanlines.
 *
 * The library is not linked: load(path) dlopens a libjpeg-turbo that is already on the machine
 * (Pillow's wheel bundles one, see readers/image/jpegwindow.py) and looks up the few entry points used
 * here, so building needs only a C compiler and the vendored headers in csrc/libjpeg-turbo (the
 * libjpeg 6.2 ABI, which libjpeg-turbo keeps across releases). jpeg_CreateDecompress checks the
 * library's ABI version and struct size against these headers, so a mismatched library fails
 * with an error instead of corrupting memory.
 *
 * decode(data, out, top, left, height, width, eighths, gray, fast_dct) decodes the rows
 * [top, top + height) and at least the columns [left, left + width) of the image scaled by
 * eighths/8 into the C-contiguous buffer `out`, one row of `row_width * channels` bytes after the
 * other, and returns (row_width, skip, image_height, image_width): the window
 * starts `skip` columns into each row (the library widens the crop to whole iMCU columns). It
 * returns None
 * when the library cannot give exactly these pixels (CMYK/YCCK, a warning such as a truncated
 * file, a window outside the image, more than MEMORY_LIMIT of decoder memory) or the data is
 * corrupt: the caller then decodes the whole image another way, and its decoders report any
 * error. Arguments outside 0..JPEG_MAX_DIMENSION (eighths outside 1..16) raise ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>

#include "jpeglib.h"

#define ENTRY(name) static __typeof__(name) *p_##name
ENTRY(jpeg_std_error);
ENTRY(jpeg_CreateDecompress);
ENTRY(jpeg_destroy_decompress);
ENTRY(jpeg_mem_src);
ENTRY(jpeg_read_header);
ENTRY(jpeg_start_decompress);
ENTRY(jpeg_crop_scanline);
ENTRY(jpeg_skip_scanlines);
ENTRY(jpeg_read_scanlines);
static void *library = NULL;

struct error_manager {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
};

static void on_error(j_common_ptr cinfo) { longjmp(((struct error_manager *)cinfo->err)->escape, 1); }

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) cinfo->err->num_warnings++; /* counted; any warning means "not exact" */
}

static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    if (library != NULL) Py_RETURN_TRUE;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        PyErr_Format(PyExc_OSError, "cannot load %s: %s", path, dlerror());
        return NULL;
    }
#define LOOKUP(name)                                                                       \
    if ((p_##name = (__typeof__(name) *)dlsym(handle, #name)) == NULL) {                 \
        dlclose(handle);                                                                   \
        PyErr_Format(PyExc_OSError, "%s has no %s (not libjpeg-turbo 1.5 or later)", path, #name); \
        return NULL;                                                                       \
    }
    LOOKUP(jpeg_std_error);
    LOOKUP(jpeg_CreateDecompress);
    LOOKUP(jpeg_destroy_decompress);
    LOOKUP(jpeg_mem_src);
    LOOKUP(jpeg_read_header);
    LOOKUP(jpeg_start_decompress);
    LOOKUP(jpeg_crop_scanline);
    LOOKUP(jpeg_skip_scanlines);
    LOOKUP(jpeg_read_scanlines);
#undef LOOKUP
    library = handle;
    Py_RETURN_TRUE;
}

enum outcome { DECODED, REFUSED, FAILED };

/* A few hundred bytes can declare a 65089 x 65278 progressive image, whose coefficients libjpeg
 * keeps in memory for the whole image: 8 GB of RSS for a 723-byte file (found by the fuzzer,
 * tests/support/fuzz_jpegwindow.py). libjpeg-turbo has no backing store, so a JPEG that needs more
 * than this fails (JERR_NO_BACKING_STORE) and goes to the general decoders. 1 GiB holds a
 * 300-megapixel progressive 4:2:0 photo; baseline JPEGs need a few rows of buffers. */
#define MEMORY_LIMIT (1024L * 1024 * 1024)

struct request {
    const unsigned char *data;
    unsigned long size;
    unsigned char *out;
    Py_ssize_t out_size;
    unsigned int top, left, height, width, eighths;
    int gray, fast_dct;
    /* results */
    unsigned int row_width, skip, image_height, image_width;
};

/* Whether libjpeg will smooth blocks: a progressive JPEG whose scans left some low-frequency
 * coefficient unknown or not fully refined (a file that ends after some scans decodes without a
 * warning) has its missing AC coefficients estimated from the neighbouring blocks, and a cropped
 * row has no left neighbour at its first block column: the window's left edge would differ from
 * the whole decode (by up to 53 grey levels, measured). Such JPEGs are decoded in whole rows.
 * coef_bits is final here: jpeg_start_decompress has read every scan. Coefficients 0..9 are the
 * ones libjpeg-turbo's smoothing looks at (jdcoefct.c, smoothing_ok). */
static int smooths_blocks(const struct jpeg_decompress_struct *cinfo) {
    if (!cinfo->progressive_mode || !cinfo->do_block_smoothing) return 0;
    if (cinfo->coef_bits == NULL) return 1;
    for (int c = 0; c < cinfo->num_components; c++)
        for (int k = 0; k < 10; k++)
            if (cinfo->coef_bits[c][k] != 0) return 1;
    return 0;
}

/* Decodes r's window, skipping the rows above it with the library (they are still entropy-
 * decoded: each block's DC coefficient is coded against the previous one's). */
static enum outcome decode_rows(struct request *r) {
    struct error_manager err_manager, *err = &err_manager;
    struct jpeg_decompress_struct cinfo;
    unsigned int top = r->top;
    /* Every row of the window handed to the library at once rather than one per call (measured:
     * random windows of 256 px JPEGs 1.03x faster, median of 8 alternating rounds). */
    JSAMPROW *rows = malloc((size_t)(r->height ? r->height : 1) * sizeof(JSAMPROW));
    if (rows == NULL) return REFUSED;
    cinfo.err = p_jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    if (setjmp(err->escape)) {
        p_jpeg_destroy_decompress(&cinfo);
        free(rows);
        return FAILED;
    }
    p_jpeg_CreateDecompress(&cinfo, JPEG_LIB_VERSION, sizeof(cinfo));
    cinfo.mem->max_memory_to_use = MEMORY_LIMIT;
    p_jpeg_mem_src(&cinfo, r->data, r->size);
    p_jpeg_read_header(&cinfo, TRUE);
    r->image_height = cinfo.image_height;
    r->image_width = cinfo.image_width;
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        p_jpeg_destroy_decompress(&cinfo);
        free(rows);
        return REFUSED; /* libjpeg-turbo has no CMYK -> RGB; the general decoders convert */
    }
    cinfo.out_color_space = r->gray ? JCS_GRAYSCALE : JCS_RGB;
    cinfo.dct_method = r->fast_dct ? JDCT_IFAST : JDCT_ISLOW;
    cinfo.scale_num = r->eighths;
    cinfo.scale_denom = 8;
    p_jpeg_start_decompress(&cinfo);
    unsigned int channels = r->gray ? 1 : 3;
    if (r->height == 0 || r->width == 0 || top + r->height > cinfo.output_height ||
        r->left + r->width > cinfo.output_width ||
        (Py_ssize_t)r->height * cinfo.output_width * channels > r->out_size) {
        p_jpeg_destroy_decompress(&cinfo);
        free(rows);
        return REFUSED;
    }
    /* One more column on each side: fancy upsampling treats the crop's edges as the image's,
     * so the window's own edge columns must be inside the crop to get their full-decode values;
     * and at least 4 columns (a crop with one chroma column is upsampled differently). */
    JDIMENSION xoffset = r->left > 0 ? r->left - 1 : 0;
    JDIMENSION right = r->left + r->width + 1;
    if (right < xoffset + 4) right = xoffset + 4;
    if (right > cinfo.output_width) right = cinfo.output_width;
    JDIMENSION cropped = right - xoffset;
    if (cropped < cinfo.output_width && !smooths_blocks(&cinfo)) p_jpeg_crop_scanline(&cinfo, &xoffset, &cropped);
    else xoffset = 0; /* whole rows: decoded as a whole decode decodes them */
    r->row_width = cinfo.output_width;
    r->skip = r->left - xoffset;
    if (top > 0 && p_jpeg_skip_scanlines(&cinfo, top) != top) {
        p_jpeg_destroy_decompress(&cinfo);
        free(rows);
        return REFUSED;
    }
    Py_ssize_t stride = (Py_ssize_t)r->row_width * channels;
    for (unsigned int i = 0; i < r->height; i++) rows[i] = r->out + i * stride;
    while (cinfo.output_scanline < top + r->height) {
        JDIMENSION done = cinfo.output_scanline - top;
        if (p_jpeg_read_scanlines(&cinfo, rows + done, r->height - done) == 0) break;
    }
    int complete = cinfo.output_scanline == top + r->height && err->pub.num_warnings == 0;
    p_jpeg_destroy_decompress(&cinfo); /* the rows below the window are never decoded */
    free(rows);
    return complete ? DECODED : REFUSED;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    struct request r;
    if (library == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "call load(path) with a libjpeg-turbo library first");
        return NULL;
    }
    /* Signed and range-checked before any unsigned conversion ("I" would wrap 2**32 - 1 and 2**33). */
    Py_ssize_t top, left, height, width, eighths;
    if (!PyArg_ParseTuple(args, "y*w*nnnnnpp", &data, &out, &top, &left, &height, &width, &eighths,
                          &r.gray, &r.fast_dct)) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_SetString(PyExc_ValueError, "top, left, height and width must be 0..65500 (the libjpeg limit)");
        }
        return NULL;
    }
    const char *wrong = NULL;
    if (top < 0 || left < 0 || height < 0 || width < 0 || top > JPEG_MAX_DIMENSION ||
        left > JPEG_MAX_DIMENSION || height > JPEG_MAX_DIMENSION || width > JPEG_MAX_DIMENSION)
        wrong = "top, left, height and width must be 0..65500 (the libjpeg limit)";
    else if (eighths < 1 || eighths > 16)
        wrong = "eighths must be 1..16";
    else if (!PyBuffer_IsContiguous(&out, 'C'))
        wrong = "out must be C-contiguous";
    if (wrong != NULL) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, wrong);
        return NULL;
    }
    r.top = (unsigned int)top;
    r.left = (unsigned int)left;
    r.height = (unsigned int)height;
    r.width = (unsigned int)width;
    r.eighths = (unsigned int)eighths;
    r.data = data.buf;
    r.size = (unsigned long)data.len;
    r.out = out.buf;
    r.out_size = out.len;
    enum outcome outcome;
    Py_BEGIN_ALLOW_THREADS
    outcome = decode_rows(&r);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (outcome != DECODED) Py_RETURN_NONE; /* the caller's general decoders report errors */
    return Py_BuildValue("IIII", r.row_width, r.skip, r.image_height, r.image_width);
}

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS, "load(path): dlopen a libjpeg-turbo shared library."},
    {"decode", decode, METH_VARARGS, "decode(data, out, top, left, height, width, eighths, gray, fast_dct)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegwindow", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpegwindow(void) { return PyModule_Create(&module); }
