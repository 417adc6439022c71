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
        if (answer_common(in, arg, "f", attr, 0, 0)) continue;
        switch (in->opcode) {
        case FUSE_OPEN: case FUSE_OPENDIR: {
            struct fuse_open_out o = {0};
            reply(in->unique, 0, &o, sizeof o);
            break;
        }
        case FUSE_ACCESS:
            reply(in->unique, 0, 0, 0);
            break;
        default:
            reply(in->unique, -ENOSYS, 0, 0);
        }
    }
}
