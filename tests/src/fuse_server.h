/* What the FUSE servers of these tests (hangfs.c, pollfs.c) share: the
 * protocol on /dev/fuse directly (no libfuse), a root directory holding
 * one file, node 2. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static int dev;

static void reply(uint64_t unique, int error, const void *body, size_t len) {
    static char buf[8192];
    struct fuse_out_header *h = (void *)buf;
    h->len = sizeof *h + len;
    h->error = error;
    h->unique = unique;
    if (len) memcpy(buf + sizeof *h, body, len);
    if (write(dev, buf, h->len) < 0) { /* the kernel forgot the request */ }
}

/* The attributes of the root (a directory) or of the file (`file_mode`). */
static void base_attr(struct fuse_attr *a, uint64_t node, mode_t file_mode) {
    memset(a, 0, sizeof *a);
    a->ino = node;
    a->mode = node == FUSE_ROOT_ID ? (S_IFDIR | 0755) : (S_IFREG | file_mode);
    a->nlink = 1;
    a->blksize = 4096;
}

/* Opens /dev/fuse and mounts it on `dir` as filesystem type "fuse.NAME",
 * with `extra` mount options (or ""); says "mounted" on stdout. Returns
 * 0, or 1 with the error on stderr. */
static int mount_fuse(const char *dir, const char *name, const char *extra) {
    dev = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (dev < 0) { perror("/dev/fuse"); return 1; }
    char opts[128], type[64];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0%s", dev, extra);
    snprintf(type, sizeof type, "fuse.%s", name);
    if (mount(name, dir, type, MS_NOSUID | MS_NODEV, opts)) {
        perror("mount"); return 1;
    }
    printf("mounted\n");
    fflush(stdout);
    return 0;
}

/* Reads the next request into `buf`: its header, or NULL once the
 * connection is gone. */
static struct fuse_in_header *next_request(char *buf, size_t size) {
    for (;;) {
        ssize_t n = read(dev, buf, size);
        if (n >= 0) return (void *)buf;
        if (errno != EINTR && errno != ENOENT) return NULL;
    }
}

/* INIT: with `max_readahead`, or the kernel's own when 0. */
static void reply_init(uint64_t unique, const struct fuse_init_in *ii, uint32_t max_readahead) {
    struct fuse_init_out o = {0};
    o.major = FUSE_KERNEL_VERSION;
    o.minor = ii->minor < 31 ? ii->minor : 31;
    o.max_readahead = max_readahead ? max_readahead : ii->max_readahead;
    o.max_write = 4096;
    o.max_background = 16;
    o.congestion_threshold = 12;
    reply(unique, 0, &o, sizeof o);
}

/* How a server fills in the attributes of a node. */
typedef void attr_fn(struct fuse_attr *a, uint64_t node);

/* GETATTR: `attr` of the node asked, valid for `valid` seconds. */
static void reply_getattr(const struct fuse_in_header *in, attr_fn *attr, uint64_t valid) {
    struct fuse_attr_out o = {0};
    o.attr_valid = valid;
    attr(&o.attr, in->nodeid);
    reply(in->unique, 0, &o, sizeof o);
}

/* LOOKUP of `asked` in the root: the file `name`, node 2 (entry and
 * attributes valid for `valid` seconds), or ENOENT. */
static void reply_lookup(const struct fuse_in_header *in, const char *asked, const char *name,
                         attr_fn *attr, uint64_t valid) {
    if (strcmp(asked, name)) { reply(in->unique, -ENOENT, 0, 0); return; }
    struct fuse_entry_out o = {0};
    o.nodeid = 2;
    o.entry_valid = valid;
    o.attr_valid = valid;
    attr(&o.attr, 2);
    reply(in->unique, 0, &o, sizeof o);
}

/* Answers the requests both servers answer alike: INIT (`max_readahead`,
 * or the kernel's when 0),
 * GETATTR and LOOKUP of the file `name` (valid for `valid` seconds),
 * FORGET (no answer), FLUSH and RELEASE. Returns 1 when `in` was one of
 * them, 0 for the server to answer. */
static int answer_common(const struct fuse_in_header *in, void *arg, const char *name,
                         attr_fn *attr, uint64_t valid, uint32_t max_readahead) {
    switch (in->opcode) {
    case FUSE_INIT: reply_init(in->unique, arg, max_readahead); return 1;
    case FUSE_GETATTR: reply_getattr(in, attr, valid); return 1;
    case FUSE_LOOKUP: reply_lookup(in, arg, name, attr, valid); return 1;
    case FUSE_FORGET: case FUSE_BATCH_FORGET: return 1;
    case FUSE_FLUSH: case FUSE_RELEASE: case FUSE_RELEASEDIR:
        reply(in->unique, 0, 0, 0);
        return 1;
    default: return 0;
    }
}
