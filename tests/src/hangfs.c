/* A FUSE filesystem with one file, "f", that stops answering once the
 * file named by argv[2] exists: a file whose fstat and close can block. */
#include "fuse_server.h"

static void attr(struct fuse_attr *a, uint64_t node) {
    base_attr(a, node, 0644);
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    if (mount_fuse(argv[1], "selfheal-hang", "")) return 1;
    static char buf[1 << 20];
    for (;;) {
        if (access(argv[2], F_OK) == 0) { pause(); continue; }
        struct fuse_in_header *in = next_request(buf, sizeof buf);
        if (!in) return 0;
        void *arg = buf + sizeof *in;
        if (access(argv[2], F_OK) == 0) { pause(); continue; }
        switch (in->opcode) {
        case FUSE_INIT:
            reply_init(in->unique, arg, ((struct fuse_init_in *)arg)->max_readahead);
            break;
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
