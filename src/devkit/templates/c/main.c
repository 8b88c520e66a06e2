/* __NAME__: an htfaas function in C (built with `htfaas fn build`: clang --target=wasm32-wasi with
 * wasi-libc; run with `htfaas fn run`).
 *
 * The guest contract (the same for every language):
 * - argv[1] is the input file, /input/<name> (read-only); later arguments are the manifest's
 *   args (`htfaas fn register --arg ...`);
 * - every top-level regular file left in /output is stored in the function's output directory
 *   under the same name; subdirectories and symbolic links are not stored;
 * - the environment holds exactly the manifest's env; there is no network, no other file;
 * - exit status 0 is success; anything else fails the job, and stdout/stderr are kept in the
 *   job's log (`htfaas jobs log ID`).
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: __NAME__ /input/<file>\n");
        return 2;
    }
    const char *input = argv[1];
    const char *slash = strrchr(input, '/');
    const char *name = slash ? slash + 1 : input;
    FILE *in = fopen(input, "rb");
    if (!in) {
        perror(input);
        return 1;
    }
    unsigned long long bytes = 0, lines = 0, words = 0;
    int in_word = 0, c;
    while ((c = getc(in)) != EOF) {
        bytes++;
        lines += c == '\n';
        int space = isspace(c);
        words += !space && !in_word;
        in_word = !space;
    }
    fclose(in);
    char path[4096];
    snprintf(path, sizeof path, "/output/%s.count.json", name);
    FILE *out = fopen(path, "w");
    if (!out) {
        perror(path);
        return 1;
    }
    fprintf(out, "{\"file\":\"%s\",\"bytes\":%llu,\"lines\":%llu,\"words\":%llu}", name, bytes, lines, words);
    if (fclose(out) != 0) {
        perror(path);
        return 1;
    }
    printf("__NAME__: %llu lines\n", lines);
    return 0;
}
