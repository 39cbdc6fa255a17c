/*
 * utf8.h - one UTF-8 code point at a time, strictly: what SMB can name
 * (remote/smb.c) and the journal's case folding (journal/node.c).
 */
#ifndef FERRYFS_UTF8_H
#define FERRYFS_UTF8_H

#include <stddef.h>
#include <stdint.h>

/*
 * The code point of the UTF-8 sequence at s (n >= 1 bytes left) and its
 * length in *len, or -1 (*len 1) where s holds no well-formed one
 * (overlong, surrogate, above U+10FFFF, cut short).
 */
int32_t utf8_get(const unsigned char *s, size_t n, size_t *len);

/* Encode code point c (0 to U+10FFFF) at d (room for 4 bytes); returns
 * its length. */
size_t utf8_put(unsigned char *d, int32_t c);

#endif
