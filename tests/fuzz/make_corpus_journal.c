/*
 * make_corpus_journal.c - write the seeds of tests/fuzz/corpus_journal/:
 * one good record of each kind that journal/rec.c decodes (as
 * jnl_node_write(), op_put() and the others write them) and a few bad
 * ones next to the limits. The first byte picks the decoder
 * (fuzz_journal.c). Run from the tree's top:
 *   cc -D_GNU_SOURCE -Ijournal -Iremote -Iutil \
 *      tests/fuzz/make_corpus_journal.c -o /tmp/mkj && \
 *      /tmp/mkj tests/fuzz/corpus_journal
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal_i.h"

static const char *dir;

static void put(const char *name, int kind, const void *p, size_t len)
{
	char path[4096];
	unsigned char k = (unsigned char)kind;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	if (!f || fwrite(&k, 1, 1, f) != 1 ||
	    (len && fwrite(p, 1, len, f) != len) || fclose(f)) {
		perror(path);
		exit(1);
	}
}

static void node(const char *name, uint16_t version, size_t head,
		 const char *rname, const char *target, int delta)
{
	unsigned char buf[sizeof(struct jnl_node_rec) + 64];
	struct jnl_node_rec r = { .version = version, .mode = 0100644,
				  .nlink = 1, .size = 4096 };

	r.rname_len = (uint16_t)strlen(rname);
	r.target_len = (uint16_t)strlen(target);
	memcpy(buf, &r, head);
	memcpy(buf + head, rname, r.rname_len);
	memcpy(buf + head + r.rname_len, target, r.target_len);
	put(name, 0, buf, (size_t)((int)(head + r.rname_len + r.target_len) +
				   delta));
}

static void op(const char *name, const char *a, const char *b, int delta)
{
	unsigned char buf[sizeof(struct jnl_op_rec) + 64];
	struct jnl_op_rec r = { .version = JNL_OP_REC_VERSION, .type = 1,
				.id = 7, .parent = 1 };

	r.name_len = (uint16_t)strlen(a);
	r.newname_len = (uint16_t)strlen(b);
	memcpy(buf, &r, sizeof(r));
	memcpy(buf + sizeof(r), a, r.name_len);
	memcpy(buf + sizeof(r) + r.name_len, b, r.newname_len);
	put(name, 3, buf, (size_t)((int)(sizeof(r) + r.name_len +
					 r.newname_len) + delta));
}

int main(int argc, char *argv[])
{
	struct jnl_chunk_rec c = { .version = JNL_CHUNK_REC_VERSION,
				   .state = JNL_CHUNK_DIRTY,
				   .length = 65536, .generation = 3 };
	struct jnl_meta_rec m = { .magic = JNL_MAGIC,
				  .format = JNL_FORMAT_VERSION,
				  .chunk_size = 1u << 20,
				  .rec_size = sizeof(m), .next_id = 2 };
	struct jnl_dval d = { .id = 5, .wseq = 0 };

	if (argc != 2)
		return 2;
	dir = argv[1];
	node("node_v3", JNL_NODE_REC_VERSION, sizeof(struct jnl_node_rec),
	     "file.txt", "", 0);
	node("node_v3_symlink", JNL_NODE_REC_VERSION,
	     sizeof(struct jnl_node_rec), "ln", "../target/of/it", 0);
	node("node_v2", 2, JNL_NODE_REC_V2_SIZE, "old", "t", 0);
	node("node_v1", 1, JNL_NODE_REC_V1_SIZE, "older", "", 0);
	node("node_short", JNL_NODE_REC_VERSION, sizeof(struct jnl_node_rec),
	     "name", "tgt", -1);
	node("node_long", JNL_NODE_REC_VERSION, sizeof(struct jnl_node_rec),
	     "name", "tgt", 1);
	put("dentry", 1, &d, sizeof(d));
	put("chunk_dirty", 2, &c, sizeof(c));
	c.state = JNL_CHUNK_FLUSHED;
	put("chunk_flushed", 2, &c, sizeof(c));
	c.state = 4;
	put("chunk_bad_state", 2, &c, sizeof(c));
	op("op_create", "new", "", 0);
	op("op_rename", "a", "b.txt", 0);
	op("op_short", "a", "b", -1);
	put("meta", 4, &m, sizeof(m));
	m.magic = __builtin_bswap32(JNL_MAGIC);
	put("meta_swapped", 4, &m, sizeof(m));
	m.magic = JNL_MAGIC;
	m.chunk_size = 3 << 16;
	put("meta_chunk_size", 4, &m, sizeof(m));
	put("meta_short", 4, &m, 15);
	return 0;
}
