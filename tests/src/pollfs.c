/* A FUSE filesystem with one read-only file, "p", one page long, whose
 * bytes are a poll set: struct pollfd {fd 100, POLLIN} four times. It
 * answers the first `argv[2]` READs and holds every later one for good
 * (until the connection is aborted). Each READ is announced on stdout as
 * "read N" (then "held N" when it is held). With a third argument
 * "direct", every OPEN after the first is answered FOPEN_DIRECT_IO |
 * FOPEN_KEEP_CACHE: an mmap of such an open invalidates the file's pages
 * first, and waits, holding its process's mmap_lock for writing, on a page
 * whose READ is held. */
#include <poll.h>

#include "fuse_server.h"

static void attr(struct fuse_attr *a, uint64_t node) {
    base_attr(a, node, 0444);
    a->size = node == FUSE_ROOT_ID ? 0 : 4096;
    a->blocks = 8;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) return 2;
    int answer = atoi(argv[2]);
    int direct = argc == 4 && !strcmp(argv[3], "direct");
    int opens = 0;
    if (mount_fuse(argv[1], "selfheal-pollfs", ",allow_other")) return 1;
    static char page[4096];
    for (int i = 0; i < 4; i++) {
        struct pollfd p = { .fd = 100, .events = POLLIN };
        memcpy(page + i * sizeof p, &p, sizeof p);
    }
    static char buf[1 << 20];
    int reads = 0;
    for (;;) {
        struct fuse_in_header *in = next_request(buf, sizeof buf);
        if (!in) return 0;
        void *arg = buf + sizeof *in;
        if (answer_common(in, arg, "p", attr, 3600, 4096)) continue;
        switch (in->opcode) {
        case FUSE_OPEN: case FUSE_OPENDIR: {
            struct fuse_open_out o = {0};
            if (in->opcode == FUSE_OPEN && direct && opens++ > 0) {
                o.open_flags = FOPEN_DIRECT_IO | FOPEN_KEEP_CACHE;
                printf("open direct\n");
                fflush(stdout);
            }
            reply(in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_READ: {
            struct fuse_read_in *r = arg;
            reads++;
            printf("read %d\n", reads);
            fflush(stdout);
            if (reads > answer) {
                printf("held %d\n", reads);
                fflush(stdout);
                break;
            }
            size_t off = r->offset < sizeof page ? r->offset : sizeof page;
            size_t len = r->size < sizeof page - off ? r->size : sizeof page - off;
            reply(in->unique, 0, page + off, len);
            break;
        }
        case FUSE_INTERRUPT: break;
        default:
            reply(in->unique, -ENOSYS, 0, 0);
        }
    }
}
