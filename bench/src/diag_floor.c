/* The C floor of check-bench (tests/src/bin/check_bench.rs): the least a
 * program must do to see what `selfheal check` sees of a set of agents, with
 * nothing else. For every pid given: each thread's /proc/PID/task/TID/stat
 * and wchan (one open/read/close each). Then one NETLINK_SOCK_DIAG dump of
 * the namespace's TCP sockets with INET_DIAG_INFO (tcp_info), IPv4 then
 * IPv6, in the states selfheal asks for (all but LISTEN, TIME_WAIT and
 * CLOSE). Prints what it read (threads, sockets, a sum of their unacked
 * counts) so nothing can be optimised away.
 *
 * Usage: diag-floor PID... */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static long read_small(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    long n = read(fd, buf, len - 1);
    close(fd);
    if (n >= 0)
        buf[n] = 0;
    return n;
}

static unsigned long long threads, stat_bytes, sockets, unacked;

static void read_threads(const char *pid)
{
    char dir[64], path[512], buf[1024];
    snprintf(dir, sizeof dir, "/proc/%s/task", pid);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        long n = read_small(path, buf, sizeof buf);
        if (n > 0)
            stat_bytes += n;
        snprintf(path, sizeof path, "%s/%s/wchan", dir, e->d_name);
        n = read_small(path, buf, sizeof buf);
        if (n >= 0)
            stat_bytes += n;
        threads++;
    }
    closedir(d);
}

static int dump(int fd, int family)
{
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 req;
    } msg;
    memset(&msg, 0, sizeof msg);
    msg.nlh.nlmsg_len = sizeof msg;
    msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    msg.nlh.nlmsg_seq = (unsigned)family;
    msg.req.sdiag_family = family;
    msg.req.sdiag_protocol = IPPROTO_TCP;
    msg.req.idiag_ext = 1 << (INET_DIAG_INFO - 1);
    /* All but LISTEN (10), TIME_WAIT (6) and CLOSE (7). */
    msg.req.idiag_states = 0xfff & ~((1 << 10) | (1 << 6) | (1 << 7));
    if (send(fd, &msg, sizeof msg, 0) < 0)
        return -1;
    static char buf[1 << 16];
    for (;;) {
        long n = recv(fd, buf, sizeof buf, 0);
        if (n < 0)
            return -1;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == NLMSG_DONE)
                return 0;
            if (h->nlmsg_type == NLMSG_ERROR)
                return -1;
            struct inet_diag_msg *m = NLMSG_DATA(h);
            int len = h->nlmsg_len - NLMSG_LENGTH(sizeof *m);
            for (struct rtattr *a = (struct rtattr *)(m + 1); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
                if (a->rta_type == INET_DIAG_INFO) {
                    struct tcp_info *i = RTA_DATA(a);
                    unacked += i->tcpi_unacked;
                }
            }
            sockets++;
        }
    }
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        read_threads(argv[i]);
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0 || dump(fd, AF_INET) < 0 || dump(fd, AF_INET6) < 0) {
        perror("sock_diag");
        return 1;
    }
    close(fd);
    printf("%llu threads (%llu bytes), %llu sockets, %llu unacked\n", threads, stat_bytes, sockets,
           unacked);
    return 0;
}
