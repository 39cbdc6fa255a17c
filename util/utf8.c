/*
 * utf8.c - UTF-8 code points (utf8.h).
 */
#include "utf8.h"

int32_t utf8_get(const unsigned char *s, size_t n, size_t *len)
{
	static const int32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
	size_t k = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2
				 : (s[0] & 0xf0) == 0xe0 ? 3
				 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
	int32_t c = k == 1 ? s[0] : s[0] & (0x7f >> k);

	*len = 1;
	if (!k || k > n)
		return -1;
	for (size_t i = 1; i < k; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return -1;
		c = (c << 6) | (s[i] & 0x3f);
	}
	if (c < min[k] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return -1;
	*len = k;
	return c;
}

size_t utf8_put(unsigned char *d, int32_t c)
{
	if (c < 0x80) {
		d[0] = (unsigned char)c;
		return 1;
	}
	if (c < 0x800) {
		d[0] = (unsigned char)(0xc0 | (c >> 6));
		d[1] = (unsigned char)(0x80 | (c & 0x3f));
		return 2;
	}
	if (c < 0x10000) {
		d[0] = (unsigned char)(0xe0 | (c >> 12));
		d[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
		d[2] = (unsigned char)(0x80 | (c & 0x3f));
		return 3;
	}
	d[0] = (unsigned char)(0xf0 | (c >> 18));
	d[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3f));
	d[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
	d[3] = (unsigned char)(0x80 | (c & 0x3f));
	return 4;
}
