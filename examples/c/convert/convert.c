/*
 * htfaas example function (C): converts a CSV of detector samples.
 *
 * `convert /input/<name> [OUTDIR]` (OUTDIR defaults to /output) reads a CSV whose first line
 * names the columns and whose other lines hold one number per column ('#' lines and blank
 * lines are skipped, CRLF is accepted) and writes:
 *   - OUTDIR/<name>.summary.json: per column its name, min, max, mean, stddev (population)
 *     and a histogram of HIST_BINS equal bins over [min, max] (the maximum falls in the
 *     last bin; a constant column puts every value in the first);
 *   - OUTDIR/<name>.f32: the same table, compact: "HTFC", then u32 version (1), u32 rows,
 *     u32 columns, then each column's values as f32, column after column, all little-endian.
 * Bad input (a field that is not a finite number, a row with the wrong number of fields, no
 * header, no rows): a message on stderr naming the line, exit status 1, no output.
 *
 * Built for wasm32-wasi by examples/c/build.sh (clang + Debian's wasi-libc); plain C11, so
 * ep/benches/compute.rs also builds it natively with cc to compare.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HIST_BINS 20
#define MAX_COLUMNS 256
#define MAX_NAME 64

static const char *input_name = "?";

/* Prints "convert: <name>: <message>" and exits 1. */
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "convert: %s: ", input_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* The whole file, NUL-terminated; *len gets its length. */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail("open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) fail("out of memory");
    for (;;) {
        if (cap - n < 2) {
            cap *= 2;
            char *bigger = realloc(buf, cap);
            if (!bigger) fail("out of memory reading %zu bytes", n);
            buf = bigger;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) fail("read %s: %s", path, strerror(errno));
    fclose(f);
    buf[n] = '\0';
    if (strlen(buf) != n) fail("the file holds a NUL byte: not a CSV");
    *len = n;
    return buf;
}

/* The next line of *cursor (CR/LF stripped, NUL-terminated in place), or NULL at the end. */
static char *next_line(char **cursor) {
    char *line = *cursor;
    if (*line == '\0') return NULL;
    char *end = strchr(line, '\n');
    if (end) {
        *end = '\0';
        *cursor = end + 1;
    } else {
        *cursor = line + strlen(line);
    }
    size_t l = strlen(line);
    if (l > 0 && line[l - 1] == '\r') line[l - 1] = '\0';
    return line;
}

static int skip(const char *line) { return line[0] == '\0' || line[0] == '#'; }

/* s as a JSON string on f. */
static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void put_u32(FILE *f, uint32_t v) {
    unsigned char b[4] = {v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, v >> 24};
    fwrite(b, 1, 4, f);
}

static FILE *create(const char *dir, const char *name, const char *ext, char *path, size_t cap) {
    if ((size_t)snprintf(path, cap, "%s/%s.%s", dir, name, ext) >= cap) fail("output path too long");
    FILE *f = fopen(path, "wb");
    if (!f) fail("create %s: %s", path, strerror(errno));
    return f;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: convert /input/<file> [OUTDIR]\n");
        return 1;
    }
    const char *path = argv[1];
    const char *outdir = argc > 2 ? argv[2] : "/output";
    const char *slash = strrchr(path, '/');
    input_name = slash ? slash + 1 : path;
    if (*input_name == '\0') fail("input path has no file name");

    size_t len;
    char *text = read_all(path, &len);
    char *cursor = text;
    char *line;
    size_t lineno = 0;

    /* Header. */
    static char names[MAX_COLUMNS][MAX_NAME];
    size_t cols = 0;
    while ((line = next_line(&cursor)) && (++lineno, skip(line))) {
    }
    if (!line) fail("no header line");
    for (char *field = line;; cols++) {
        char *comma = strchr(field, ',');
        if (comma) *comma = '\0';
        if (cols == MAX_COLUMNS) fail("line %zu: more than %d columns", lineno, MAX_COLUMNS);
        if (*field == '\0') fail("line %zu: column %zu has no name", lineno, cols + 1);
        if (strlen(field) >= MAX_NAME) fail("line %zu: column name longer than %d bytes", lineno, MAX_NAME - 1);
        strcpy(names[cols], field);
        if (!comma) {
            cols++;
            break;
        }
        field = comma + 1;
    }

    /* Rows, row-major. */
    size_t rows = 0, cap = 1024;
    double *v = malloc(cap * cols * sizeof *v);
    if (!v) fail("out of memory");
    while ((line = next_line(&cursor))) {
        lineno++;
        if (skip(line)) continue;
        if (rows == cap) {
            cap *= 2;
            double *bigger = realloc(v, cap * cols * sizeof *v);
            if (!bigger) fail("out of memory at line %zu", lineno);
            v = bigger;
        }
        char *field = line;
        for (size_t c = 0; c < cols; c++) {
            char *end;
            errno = 0;
            double x = strtod(field, &end);
            char *stop = strchr(field, ',');
            size_t flen = stop ? (size_t)(stop - field) : strlen(field);
            if (end == field || end != field + flen || !isfinite(x)) {
                fail("line %zu: field %zu (%s) is not a finite number: \"%.*s\"", lineno, c + 1, names[c],
                     (int)(flen > 40 ? 40 : flen), field);
            }
            v[rows * cols + c] = x;
            if (c + 1 < cols) {
                if (!stop) fail("line %zu: %zu fields, the header names %zu", lineno, c + 1, cols);
                field = stop + 1;
            } else if (stop) {
                fail("line %zu: more than the %zu fields the header names", lineno, cols);
            }
        }
        rows++;
    }
    if (rows == 0) fail("no data rows after the header");
    if (rows > UINT32_MAX) fail("more than %u rows", UINT32_MAX);

    /* Summary. */
    char out[4096];
    FILE *js = create(outdir, input_name, "summary.json", out, sizeof out);
    fprintf(js, "{\"file\":");
    json_string(js, input_name);
    fprintf(js, ",\"rows\":%zu,\"columns\":[", rows);
    for (size_t c = 0; c < cols; c++) {
        double min = v[c], max = v[c], sum = 0.0;
        for (size_t r = 0; r < rows; r++) {
            double x = v[r * cols + c];
            if (x < min) min = x;
            if (x > max) max = x;
            sum += x;
        }
        double mean = sum / (double)rows, ss = 0.0;
        for (size_t r = 0; r < rows; r++) {
            double d = v[r * cols + c] - mean;
            ss += d * d;
        }
        double stddev = sqrt(ss / (double)rows);
        if (!isfinite(mean) || !isfinite(stddev)) fail("column %zu (%s): values too large to summarise", c + 1, names[c]);
        uint64_t hist[HIST_BINS] = {0};
        double range = max - min;
        for (size_t r = 0; r < rows; r++) {
            size_t bin = 0;
            if (range > 0.0) {
                double b = (v[r * cols + c] - min) / range * HIST_BINS;
                bin = b >= HIST_BINS ? HIST_BINS - 1 : (size_t)b;
            }
            hist[bin]++;
        }
        fprintf(js, "%s{\"name\":", c ? "," : "");
        json_string(js, names[c]);
        fprintf(js, ",\"min\":%.17g,\"max\":%.17g,\"mean\":%.17g,\"stddev\":%.17g,\"histogram\":[", min, max, mean,
                stddev);
        for (int b = 0; b < HIST_BINS; b++) fprintf(js, "%s%llu", b ? "," : "", (unsigned long long)hist[b]);
        fprintf(js, "]}");
    }
    fprintf(js, "]}\n");
    if (fclose(js) != 0) fail("write %s: %s", out, strerror(errno));

    /* Compact binary. */
    FILE *bin = create(outdir, input_name, "f32", out, sizeof out);
    fwrite("HTFC", 1, 4, bin);
    put_u32(bin, 1);
    put_u32(bin, (uint32_t)rows);
    put_u32(bin, (uint32_t)cols);
    for (size_t c = 0; c < cols; c++) {
        for (size_t r = 0; r < rows; r++) {
            float x = (float)v[r * cols + c];
            uint32_t u;
            memcpy(&u, &x, 4);
            put_u32(bin, u);
        }
    }
    if (fclose(bin) != 0) fail("write %s: %s", out, strerror(errno));
    printf("convert: %s: %zu rows x %zu columns\n", input_name, rows, cols);
    free(v);
    free(text);
    return 0;
}
