/*
 * rec.c - the decoders of the journal's LMDB records: bytes as mdb_get()
 * or a cursor returns them, checked and copied into the in-memory record.
 *
 * Invariants:
 *  1. Pure: no journal, no transaction, no log, no allocation. A decoder
 *     reads only [p, p + len) and writes only *out.
 *  2. A record whose size, version or lengths do not add up is refused
 *     with an error and *out is then unspecified; the caller (node.c,
 *     ops.c, data.c, journal.c) logs it and fails the journal (-EIO).
 *
 * Called by jnl_node_read(), jnl_dentry_get(), jnl_chunk_get(),
 * jnl_op_read() and check_meta(); tests/fuzz/fuzz_journal.c feeds them
 * raw bytes.
 */
#include <errno.h>
#include <string.h>

#include "journal_i.h"

int jnl_node_decode(const void *p, size_t len, struct jnl_nrec *n)
{
	const unsigned char *b = p;
	size_t head = sizeof(n->r);

	if (len < JNL_NODE_REC_V1_SIZE)
		return -EIO;
	memset(&n->r, 0, sizeof(n->r));
	memcpy(&n->r, b, JNL_NODE_REC_V1_SIZE);
	if (n->r.version == 1) { /* no base: JNL_BASE_NONE */
		head = JNL_NODE_REC_V1_SIZE;
	} else if (n->r.version == 2 && len >= JNL_NODE_REC_V2_SIZE) {
		head = JNL_NODE_REC_V2_SIZE; /* no cut */
		memcpy(&n->r, b, head);
	} else if (n->r.version == JNL_NODE_REC_VERSION &&
		   len >= sizeof(n->r)) {
		memcpy(&n->r, b, sizeof(n->r));
	} else {
		return -EIO;
	}
	if (n->r.rname_len > NAME_MAX || n->r.target_len >= PATH_MAX ||
#if FUZZ_PLANT
	    /* planted for tests/fuzz (fuzz_plant_journal): takes a record
	     * one byte short, and reads one byte past it */
	    len + (n->r.target_len > 0) != head + n->r.rname_len +
						 n->r.target_len)
#else
	    len != head + n->r.rname_len + n->r.target_len)
#endif
		return -EIO;
	n->r.version = JNL_NODE_REC_VERSION;
	b += head;
	memcpy(n->rname, b, n->r.rname_len);
	n->rname[n->r.rname_len] = 0;
	memcpy(n->target, b + n->r.rname_len, n->r.target_len);
	n->target[n->r.target_len] = 0;
	return 0;
}

int jnl_dentry_decode(const void *p, size_t len, struct jnl_dval *d)
{
	if (len != sizeof(*d))
		return -EIO;
	memcpy(d, p, sizeof(*d));
	return 0;
}

int jnl_chunk_decode(const void *p, size_t len, struct jnl_chunk_rec *c)
{
	if (len != sizeof(*c))
		return -EIO;
	memcpy(c, p, sizeof(*c));
	if (c->version != JNL_CHUNK_REC_VERSION ||
	    c->state < JNL_CHUNK_DIRTY || c->state > JNL_CHUNK_FLUSHED)
		return -EIO;
	return 0;
}

int jnl_op_decode(const void *p, size_t len, uint64_t seq, struct jnl_orec *o)
{
	const char *b = p;

	if (len < sizeof(o->r))
		return -EIO;
	memcpy(&o->r, b, sizeof(o->r));
	if (o->r.version != JNL_OP_REC_VERSION || o->r.name_len > NAME_MAX ||
	    o->r.newname_len > NAME_MAX ||
	    len != sizeof(o->r) + o->r.name_len + o->r.newname_len)
		return -EIO;
	b += sizeof(o->r);
	memcpy(o->name, b, o->r.name_len);
	o->name[o->r.name_len] = 0;
	memcpy(o->newname, b + o->r.name_len, o->r.newname_len);
	o->newname[o->r.newname_len] = 0;
	o->seq = seq;
	return 0;
}

int jnl_meta_decode(const void *p, size_t len, struct jnl_meta_rec *m)
{
	if (len < 16)
		return -ENOMSG;
	memset(m, 0, sizeof(*m));
	memcpy(m, p, len < sizeof(*m) ? len : sizeof(*m));
	if (m->magic == __builtin_bswap32(JNL_MAGIC))
		return -EILSEQ;
	if (m->magic != JNL_MAGIC)
		return -EBADMSG;
	if (m->format != JNL_FORMAT_VERSION || len != sizeof(*m))
		return -EPROTO;
	if (m->chunk_size < (64u << 10) || m->chunk_size > (64u << 20) ||
	    (m->chunk_size & (m->chunk_size - 1)))
		return -EDOM;
	return 0;
}
