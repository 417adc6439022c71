/* A FUSE filesystem with one file, "f", that stops answering once the
 * file named by argv[2] exists: a file whose fstat and close can block. */
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
    char buf[4096];
    struct fuse_out_header *h = (void *)buf;
    h->len = sizeof *h + len;
    h->error = error;
    h->unique = unique;
    if (len) memcpy(buf + sizeof *h, body, len);
    if (write(dev, buf, h->len) < 0) { /* the kernel forgot the request */ }
}

static void attr(struct fuse_attr *a, uint64_t node) {
    memset(a, 0, sizeof *a);
    a->ino = node;
    a->mode = node == FUSE_ROOT_ID ? (S_IFDIR | 0755) : (S_IFREG | 0644);
    a->nlink = 1;
    a->blksize = 4096;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    dev = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (dev < 0) { perror("/dev/fuse"); return 1; }
    char opts[128];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0", dev);
    if (mount("selfheal-hang", argv[1], "fuse.selfheal-hang", MS_NOSUID | MS_NODEV, opts)) {
        perror("mount"); return 1;
    }
    printf("mounted\n");
    fflush(stdout);
    static char buf[1 << 20];
    for (;;) {
        if (access(argv[2], F_OK) == 0) { pause(); continue; }
        ssize_t n = read(dev, buf, sizeof buf);
        if (n < 0) { if (errno == EINTR || errno == ENOENT) continue; return 0; }
        struct fuse_in_header *in = (void *)buf;
        void *arg = buf + sizeof *in;
        if (access(argv[2], F_OK) == 0) { pause(); continue; }
        switch (in->opcode) {
        case FUSE_INIT: {
            struct fuse_init_in *ii = arg;
            struct fuse_init_out o = {0};
            o.major = FUSE_KERNEL_VERSION;
            o.minor = ii->minor < 31 ? ii->minor : 31;
            o.max_readahead = ii->max_readahead;
            o.max_write = 4096;
            o.max_background = 16;
            o.congestion_threshold = 12;
            reply(in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_GETATTR: {
            struct fuse_attr_out o = {0};
            attr(&o.attr, in->nodeid);
            reply(in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_LOOKUP: {
            if (strcmp(arg, "f")) { reply(in->unique, -ENOENT, 0, 0); break; }
            struct fuse_entry_out o = {0};
            o.nodeid = 2;
            attr(&o.attr, 2);
            reply(in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_OPEN: case FUSE_OPENDIR: {
            struct fuse_open_out o = {0};
            reply(in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_FORGET: case FUSE_BATCH_FORGET: break;
        case FUSE_FLUSH: case FUSE_RELEASE: case FUSE_RELEASEDIR: case FUSE_ACCESS:
            reply(in->unique, 0, 0, 0);
            break;
        default:
            reply(in->unique, -ENOSYS, 0, 0);
        }
    }
}
