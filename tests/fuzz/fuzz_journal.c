/*
 * fuzz_journal.c - libFuzzer target of the journal's record decoders
 * (journal/rec.c): the bytes of a node, dentry, chunk, op or meta record as
 * LMDB would hand them to jnl_node_read() and the others.
 *
 * Input: one byte that picks the decoder (low 3 bits), then the record.
 * The record is copied into a buffer of exactly its size, so a decoder
 * that reads one byte past it is an ASan report. A record that decodes
 * must be self-consistent (names as long as their lengths say); a bad one
 * must be refused with -EIO (meta: its own codes), never read out of
 * bounds. Built and run by tests/fuzz/fuzz.sh journal.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "journal_i.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok)
{
	if (!ok)
		abort(); /* a decoded record that does not add up */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct jnl_nrec n;
	static struct jnl_orec o;
	struct jnl_chunk_rec c;
	struct jnl_meta_rec m;
	struct jnl_dval d;
	unsigned char *rec;
	size_t len;
	int rc;

	if (size < 1)
		return 0;
	len = size - 1;
	rec = malloc(len ? len : 1);
	if (!rec)
		return 0;
	memcpy(rec, data + 1, len);
	switch (data[0] & 7) {
	case 0:
	case 5:
		rc = jnl_node_decode(rec, len, &n);
		check(rc == 0 || rc == -EIO);
		if (rc == 0)
			check(n.r.version == JNL_NODE_REC_VERSION &&
			      strlen(n.rname) <= n.r.rname_len &&
			      strlen(n.target) <= n.r.target_len);
		break;
	case 1:
		rc = jnl_dentry_decode(rec, len, &d);
		check(rc == 0 ? len == sizeof(d) : rc == -EIO);
		break;
	case 2:
	case 6:
		rc = jnl_chunk_decode(rec, len, &c);
		check(rc == 0 || rc == -EIO);
		if (rc == 0)
			check(c.state >= JNL_CHUNK_DIRTY &&
			      c.state <= JNL_CHUNK_FLUSHED);
		break;
	case 3:
	case 7:
		rc = jnl_op_decode(rec, len, 42, &o);
		check(rc == 0 || rc == -EIO);
		if (rc == 0)
			check(o.seq == 42 && strlen(o.name) <= o.r.name_len &&
			      strlen(o.newname) <= o.r.newname_len);
		break;
	default:
		rc = jnl_meta_decode(rec, len, &m);
		check(rc == 0 || rc == -ENOMSG || rc == -EILSEQ ||
		      rc == -EBADMSG || rc == -EPROTO || rc == -EDOM);
		if (rc == 0)
			check(len == sizeof(m) && m.magic == JNL_MAGIC);
		break;
	}
	free(rec);
	return 0;
}
