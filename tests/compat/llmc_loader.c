/*
 * llm.c's training data loader, as its C trainers read token shards, for
 * prep's compatibility suite (tests/compat/test_compat.py compiles this
 * file with the system C compiler `cc` and runs it on `prep export --to
 * llmc` output).
 *
 * Source: the DataLoader of karpathy/llm.c, llmc/dataloader.h at commit
 * 835bb2e6d759e43bba41bd7ef0b98aca60342164 (MIT licence, Copyright (c) 2024
 * Andrej Karpathy). Written for prep from that file's logic, step for
 * step, not copied: the shard header checks (magic 20240520, version 1,
 * a token count above 0, the file size 1024 + 2 * count), the start-up
 * check that every shard holds more than B * T * processes tokens, the
 * sample arithmetic (samples per shard = (2 * count - 2) / (2 * B * T *
 * processes)), the seek to `(int) offset` (a 32-bit int, as upstream) and
 * the read of B * T + 1 uint16 tokens per batch, moving on to the next
 * shard, in glob order, when one is used up. Shuffling (a permutation of
 * the same samples) is left out; every failure exits with status 1 and a
 * message on stderr where upstream prints and exits or asserts.
 *
 * Usage: llmc_loader PATTERN B T BATCHES [PROCESSES RANK]
 * Prints, per batch, one line of the B * T inputs then one of the targets.
 */
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define HEADER_INTS 256

static void fail(const char *what, const char *file) {
    fprintf(stderr, "llm.c loader: %s: %s\n", file, what);
    exit(1);
}

typedef struct {
    size_t B, T;
    int rank, processes;
    glob_t shards;
    size_t shard, sample, samples;
    FILE *file;
    size_t batch_bytes, rank_bytes;
    uint16_t *buffer;
} Loader;

/* Opens shard `i`, checks its header and size; returns its token count. */
static int64_t load_shard(Loader *l, size_t i) {
    const char *name = l->shards.gl_pathv[i];
    if (l->file) fclose(l->file);
    l->file = fopen(name, "rb");
    if (!l->file) fail("cannot open", name);
    int header[HEADER_INTS];
    if (fread(header, sizeof(int), HEADER_INTS, l->file) != HEADER_INTS) fail("short header", name);
    if (header[0] != 20240520) fail("Bad magic in the data file", name);
    if (header[1] != 1) fail("Bad version in data file", name);
    int64_t ntok = header[2];
    if (!(ntok > 0)) fail("no tokens (llm.c asserts ntok > 0)", name);
    if (fseek(l->file, 0, SEEK_END) != 0) fail("cannot seek", name);
    int64_t size = ftell(l->file);
    if (size != HEADER_INTS * (int64_t)sizeof(int) + ntok * (int64_t)sizeof(uint16_t))
        fail("file size is not as expected", name);
    l->samples = (size_t)(ntok * sizeof(uint16_t) - sizeof(uint16_t)) / l->batch_bytes;
    return ntok;
}

static void next_batch(Loader *l) {
    if (l->sample >= l->samples) {
        l->shard = (l->shard + 1) % l->shards.gl_pathc;
        l->sample = 0;
        load_shard(l, l->shard);
    }
    int64_t offset = HEADER_INTS * sizeof(int) + l->sample * l->batch_bytes + l->rank_bytes;
    /* Upstream seeks to (int) offset: a 32-bit int. */
    if (fseek(l->file, (int)offset, SEEK_SET) != 0)
        fail("fseek failed (the offset does not fit a 32-bit int)", l->shards.gl_pathv[l->shard]);
    size_t n = l->B * l->T + 1;
    if (fread(l->buffer, sizeof(uint16_t), n, l->file) != n)
        fail("short read", l->shards.gl_pathv[l->shard]);
    l->sample += 1;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 7) {
        fprintf(stderr, "usage: %s PATTERN B T BATCHES [PROCESSES RANK]\n", argv[0]);
        return 2;
    }
    Loader l = {0};
    l.B = strtoul(argv[2], NULL, 10);
    l.T = strtoul(argv[3], NULL, 10);
    long batches = strtol(argv[4], NULL, 10);
    l.processes = argc == 7 ? atoi(argv[5]) : 1;
    l.rank = argc == 7 ? atoi(argv[6]) : 0;
    l.batch_bytes = l.processes * l.B * l.T * sizeof(uint16_t);
    l.rank_bytes = l.rank * l.B * l.T * sizeof(uint16_t);
    if (glob(argv[1], 0, NULL, &l.shards) != 0 || l.shards.gl_pathc == 0)
        fail("no files match", argv[1]);
    /* Start-up: every shard is opened and must hold more than one batch. */
    for (size_t i = 0; i < l.shards.gl_pathc; i++) {
        int64_t ntok = load_shard(&l, i);
        if (!(ntok >= (int64_t)(l.processes * l.B * l.T + 1)))
            fail("fewer tokens than one batch (llm.c asserts shard_ntok >= B*T*processes + 1)",
                 l.shards.gl_pathv[i]);
    }
    l.buffer = malloc((l.B * l.T + 1) * sizeof(uint16_t));
    if (!l.buffer) fail("out of memory", argv[1]);
    l.shard = 0;
    l.sample = 0;
    load_shard(&l, 0);
    for (long b = 0; b < batches; b++) {
        next_batch(&l);
        for (size_t i = 0; i < l.B * l.T; i++) printf(i ? " %d" : "%d", (int)l.buffer[i]);
        printf("\n");
        for (size_t i = 0; i < l.B * l.T; i++) printf(i ? " %d" : "%d", (int)l.buffer[i + 1]);
        printf("\n");
    }
    free(l.buffer);
    fclose(l.file);
    globfree(&l.shards);
    return 0;
}
