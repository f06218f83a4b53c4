/* zcfs same-host interface from C: connect, register a buffer, write a file and read
 * it back in shared mode, and (if trusted) read it again with zero copies.
 *
 *   cc -o samehost examples/c/samehost.c $(PKG_CONFIG_PATH=target/release pkg-config --cflags --libs zcfs)
 *   ./samehost /run/zcfs/vol.samehost.sock
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include "zcfs.h"

#define LEN 10000

static int fail(const char *what, long long r) {
	fprintf(stderr, "%s: %s\n", what, strerror((int)-r));
	return 1;
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
		return 2;
	}
	zcfs_client *h = zcfs_connect(argv[1]);
	if (!h)
		return fail("connect", -errno);
	printf("connected trusted=%d\n", zcfs_trusted(h));

	uint32_t buf;
	int r = zcfs_register_buffer(h, 1 << 16, &buf);
	if (r < 0)
		return fail("register_buffer", r);
	size_t blen;
	uint8_t *b = zcfs_buffer_ptr(h, buf, &blen);
	if (!b)
		return fail("buffer_ptr", -errno);
	printf("buffer %u len=%zu\n", buf, blen);

	uint32_t f;
	uint64_t size;
	r = zcfs_open(h, "/hello-c", O_RDWR | O_CREAT, 0644, &f, &size);
	if (r < 0)
		return fail("open", r);
	for (int i = 0; i < LEN; i++)
		b[i] = (uint8_t)(i * 7 + 3);
	long long n = zcfs_write(h, f, 0, buf, 0, LEN);
	if (n != LEN)
		return fail("write", n < 0 ? n : -EIO);
	if ((r = zcfs_fsync(h, f)) < 0)
		return fail("fsync", r);
	memset(b, 0, LEN);
	n = zcfs_read(h, f, 0, buf, 32768, LEN + 100);
	if (n < 0)
		return fail("read", n);
	int same = n == LEN;
	for (int i = 0; same && i < LEN; i++)
		same = b[32768 + i] == (uint8_t)(i * 7 + 3);
	printf("shared wrote=%d read=%lld match=%d\n", LEN, n, same);

	/* The same through the ring, as a batch of two. */
	zcfs_sqe sq[2] = {{0}};
	sq[0].user_data = 1; sq[0].op = ZCFS_OP_READ; sq[0].handle = f;
	sq[0].offset = 0; sq[0].len = 4096; sq[0].buf = buf; sq[0].buf_off = 0;
	sq[1] = sq[0];
	sq[1].user_data = 2; sq[1].offset = 8192; sq[1].buf_off = 4096;
	if ((r = zcfs_submit(h, sq, 2)) < 0)
		return fail("submit", r);
	zcfs_cqe cq[2];
	long long got = 0;
	while (got < 2) {
		long long k = zcfs_wait(h, 1, cq + got, 2 - got);
		if (k < 0)
			return fail("wait", k);
		got += k;
	}
	long long sum = cq[0].result + cq[1].result;
	printf("batch completions=%lld bytes=%lld\n", got, sum);

	if (zcfs_trusted(h) == 1) {
		zcfs_extent ext[16];
		size_t next;
		uint64_t lease;
		long long covered = zcfs_zcopy_to(h, f, 0, LEN, ext, 16, &next, &lease);
		if (covered < 0)
			return fail("zcopy_to", covered);
		int ok = 1;
		for (size_t e = 0; e < next; e++)
			for (uint64_t i = 0; ext[e].data && i < ext[e].len; i++)
				ok &= ext[e].data[i] == (uint8_t)((ext[e].file_offset + i) * 7 + 3);
		printf("zcopy_to covered=%lld extents=%zu match=%d\n", covered, next, ok);
		if ((r = zcfs_zcopy_release(h, lease)) < 0)
			return fail("zcopy_release", r);

		/* Zero-copy write: reserve two pages, fill them, place them at 64 KiB. */
		uint64_t res;
		uint8_t *win;
		if ((r = zcfs_zcopy_from(h, 2, &res, &win)) < 0)
			return fail("zcopy_from", r);
		/* One slice when the blocks are adjacent, else page by page. */
		for (size_t p = 0; p < 2; p++)
			memset(win ? win + p * 4096 : zcfs_zcopy_page(h, res, p), 'A' + (int)p, 4096);
		zcfs_pflush *t = zcfs_pflush_new();
		if ((r = zcfs_pflush_add(t, f, 65536, res, 65536 + 8000)) < 0)
			return fail("pflush_add", r);
		r = zcfs_pflush_commit(h, t);
		zcfs_pflush_free(t);
		/* Committed (or, on an error, given back): the pages are not ours to write
		 * any more. The library cannot unmap them, so forget every pointer to them. */
		win = NULL;
		if (r < 0)
			return fail("pflush_commit", r);
		if (zcfs_zcopy_page(h, res, 0) != NULL)
			return fail("zcopy_page after the commit", -EINVAL);
		n = zcfs_read(h, f, 65536 + 4095, buf, 0, 4096);
		printf("pflush read=%lld bytes=%c%c\n", n, b[0], b[1]);
		if ((r = zcfs_pfree(h, f, 65536, 4096)) < 0)
			return fail("pfree", r);
	}
	if ((r = zcfs_close(h, f)) < 0)
		return fail("close", r);
	printf("closed\n");
	zcfs_disconnect(h);
	return 0;
}
