/*
 * status.c - the JSON of the control protocol, written in one place.
 *
 * Every reply of the control socket (ctl.c) is made here from a struct
 * (struct fs_status for "status", filled by both modes: fs_status_get()
 * in ops.c) with jansson, so that names are escaped and the size of a
 * reply has no bound but memory (64 streams and ten conflict paths are
 * some 20 KB). The client (main.c) reads the replies with jansson too.
 *
 * Invariants:
 *  1. A reply is one JSON object on one line (no JSON_INDENT), keys in
 *     the order written (JSON_PRESERVE_ORDER), ": " and ", " between them
 *     as the replies always had (scripts grep for "drained": true).
 *  2. Strings are UTF-8 in the reply: a name that is not (a path on the
 *     share may hold any byte) has each bad byte replaced by U+FFFD
 *     rather than the whole reply refused.
 *
 * Called on the control thread only.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fs_i.h"

/* The length of the UTF-8 sequence at @p (at most @n bytes), 0 if it is
 * not one (overlong forms, surrogates and past U+10FFFF included). */
static size_t utf8_len(const unsigned char *p, size_t n)
{
	size_t len, i;
	uint32_t c;

	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		len = 2, c = p[0] & 0x1f;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		len = 3, c = p[0] & 0x0f;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		len = 4, c = p[0] & 0x07;
	else
		return 0;
	if (len > n)
		return 0;
	for (i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (p[i] & 0x3f);
	}
	if ((len == 3 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) ||
	    (len == 4 && (c < 0x10000 || c > 0x10ffff)))
		return 0;
	return len;
}

/* A JSON string of @s (invariant 2); NULL out of memory. */
static json_t *jstr(const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t n = strlen((const char *)p), i = 0, o = 0;
	json_t *j = json_string((const char *)p);
	char *fixed;

	if (j)
		return j;
	fixed = malloc(3 * n + 1); /* U+FFFD is 3 bytes */
	if (!fixed)
		return NULL;
	while (i < n) {
		size_t len = utf8_len(p + i, n - i);

		if (len) {
			memcpy(fixed + o, p + i, len);
			o += len;
			i += len;
		} else {
			memcpy(fixed + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	fixed[o] = '\0';
	j = json_string(fixed);
	free(fixed);
	return j;
}

static json_t *jnum(uint64_t v)
{
	return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
}

/* Set @key of @o to @v (a new reference, NULL if it could not be made):
 * false if anything failed, then @o is to be dropped. */
static bool put(json_t *o, const char *key, json_t *v)
{
	return v && json_object_set_new(o, key, v) == 0;
}

/* The reply's text (invariant 1); drops @o. NULL out of memory. */
static char *dump(json_t *o, bool ok)
{
	char *s = ok && o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;

	json_decref(o);
	return s;
}

static json_t *stream_json(const struct fs_stream_status *s)
{
	json_t *o = json_object();
	bool ok = o;

	ok = ok && put(o, "state", jstr(s->state));
	ok = ok && put(o, "via", jstr(s->via_agent ? "agent" : "share"));
	ok = ok && put(o, "rate_bps", jnum(s->rate_bps));
	ok = ok && put(o, "bytes", jnum(s->bytes));
	ok = ok && put(o, "chunks", jnum(s->chunks));
	ok = ok && put(o, "ops", jnum(s->ops));
	ok = ok && put(o, "errors", jnum(s->errors));
	ok = ok && put(o, "retries", jnum(s->retries));
	ok = ok && put(o, "remote_bytes_written",
		       jnum(s->remote_bytes_written));
	ok = ok && put(o, "last_error",
		       jstr(s->last_error ? strerror(-s->last_error) : ""));
	if (!ok) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static bool cache_json(json_t *o, const struct fs_cache_status *c)
{
	uint64_t lookups = c->hits + c->misses;
	json_t *j;
	bool ok;

	if (!c->on)
		return put(o, "cache", json_null()) &&
		       put(o, "cache_off", jstr(c->off));
	j = json_object();
	ok = j && put(j, "dir", jstr(c->dir));
	ok = ok && put(j, "bytes", jnum(c->bytes));
	ok = ok && put(j, "max_bytes", jnum(c->max_bytes));
	ok = ok && put(j, "hits", jnum(c->hits));
	ok = ok && put(j, "misses", jnum(c->misses));
	ok = ok && put(j, "hit_rate",
		       json_real(lookups ? (double)c->hits / (double)lookups
					 : 0.0));
	ok = ok && put(j, "readahead_streams", jnum(c->readahead_streams));
	ok = ok && put(j, "readahead_bytes", jnum(c->readahead_bytes));
	ok = ok && put(j, "readahead_errors", jnum(c->readahead_errors));
	ok = ok && put(j, "readahead_pending", jnum(c->readahead_pending));
	ok = ok && put(j, "app_read_bytes", jnum(c->app_read_bytes));
	ok = ok && put(j, "share_read_bytes", jnum(c->share_read_bytes));
	if (!ok) {
		json_decref(j);
		return false;
	}
	return put(o, "cache", j);
}

char *fs_status_json(const struct fs_status *st)
{
	json_t *o = json_object(), *a;
	char id[17];
	bool ok = o;
	unsigned int i;

	ok = ok && put(o, "ok", json_true());
	ok = ok && put(o, "mountpoint", jstr(st->mountpoint));
	ok = ok && put(o, "remote", jstr(st->remote));
	ok = ok && put(o, "mode", jstr(st->mode));
	if (st->journal) {
		snprintf(id, sizeof(id), "%016llx",
			 (unsigned long long)st->journal_id);
		ok = ok && put(o, "journal", jstr(st->journal));
		ok = ok && put(o, "journal_id", jstr(id));
	}
	ok = ok && put(o, "paused", json_boolean(st->paused));
	ok = ok && put(o, "drained", json_boolean(st->drained));
	ok = ok && put(o, "failed", json_integer(st->failed));
	ok = ok && put(o, "pending_bytes", jnum(st->pending_bytes));
	ok = ok && put(o, "pending_files", jnum(st->pending_files));
	ok = ok && put(o, "pending_ops", jnum(st->pending_ops));
	ok = ok && put(o, "uncommitted", jnum(st->uncommitted));
	ok = ok && put(o, "staging_bytes", jnum(st->staging_bytes));
	ok = ok && put(o, "rate_bps", jnum(st->rate_bps));
	ok = ok && put(o, "eta_s", json_integer(st->eta_s));
	ok = ok && put(o, "retries", jnum(st->retries));
	ok = ok && put(o, "errors", jnum(st->errors));
	ok = ok && put(o, "failed_ops", jnum(st->failed_ops));
	ok = ok && put(o, "parked", jnum(st->parked));
	ok = ok && put(o, "conflicts", jnum(st->conflicts));
	ok = ok && put(o, "resent_bytes", jnum(st->resent_bytes));
	ok = ok && put(o, "flushed_bytes", jnum(st->flushed_bytes));
	ok = ok && put(o, "write_waits", jnum(st->write_waits));
	ok = ok && put(o, "passthrough", json_boolean(st->passthrough));
	ok = ok && put(o, "passthrough_opens", jnum(st->passthrough_opens));
	ok = ok && put(o, "passthrough_files", jnum(st->passthrough_files));
	ok = ok && put(o, "passthrough_requests",
		       jnum(st->passthrough_requests));
	ok = ok && put(o, "remote_bytes_read", jnum(st->remote_bytes_read));
	ok = ok && put(o, "remote_bytes_written",
		       jnum(st->remote_bytes_written));
	ok = ok && put(o, "remote_ops", jnum(st->remote_ops));
	ok = ok && put(o, "uptime_s", json_integer(st->uptime_s));
	a = ok ? json_array() : NULL;
	ok = ok && put(o, "streams", a);
	for (i = 0; ok && i < st->nstreams; i++)
		ok = json_array_append_new(a, stream_json(&st->streams[i])) ==
		     0;
	a = ok ? json_array() : NULL;
	ok = ok && put(o, "conflict_paths", a);
	for (i = 0; ok && i < st->nconflict_paths; i++)
		ok = json_array_append_new(a, jstr(st->conflict_paths[i])) ==
		     0;
	ok = ok && cache_json(o, &st->cache);
	return dump(o, ok);
}

void fs_status_release(struct fs_status *st)
{
	if (!st)
		return;
	for (unsigned int i = 0; i < st->nconflict_paths; i++)
		free(st->conflict_paths[i]);
	free(st->conflict_paths);
	free(st->streams);
	st->conflict_paths = NULL;
	st->streams = NULL;
	st->nconflict_paths = st->nstreams = 0;
}

char *fs_reply_error(const char *msg)
{
	json_t *o = json_object();
	bool ok = o && put(o, "ok", json_false()) &&
		  put(o, "error", jstr(msg));

	return dump(o, ok);
}

char *fs_reply_ok(void)
{
	json_t *o = json_object();

	return dump(o, o && put(o, "ok", json_true()));
}

char *fs_reply_flush(uint64_t pending_bytes, uint64_t pending_ops)
{
	json_t *o = json_object();
	bool ok = o && put(o, "ok", json_true()) &&
		  put(o, "pending_bytes", jnum(pending_bytes)) &&
		  put(o, "pending_ops", jnum(pending_ops));

	return dump(o, ok);
}
