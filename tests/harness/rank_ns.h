/*
 * Two "hosts" on one machine for the harness: with HARNESS_RANK_NS=PID0,PID1,... rank r joins the
 * network and UTS (host name) namespaces of process PIDr before it loads the library, so each rank
 * has its own interfaces and host name and the transport takes the path it takes between hosts
 * (tests/twohost/netns.sh creates the namespaces and holds them with one process each). The
 * bootstrap socketpairs were made before the fork and keep working across namespaces. Included by
 * harness.c (no separate build step); needs CAP_SYS_ADMIN.
 */
#pragma once
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 0: joined (or HARNESS_RANK_NS unset); -1: failed, with the reason on stderr. */
static int rank_enter_ns(int rank) {
    const char *s = getenv("HARNESS_RANK_NS");
    if (!s || !*s) return 0;
    const char *p = s;
    for (int i = 0; i < rank && p; i++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    char *end = NULL;
    long pid = p ? strtol(p, &end, 10) : 0;
    if (!p || end == p || (*end && *end != ',') || pid <= 0) {
        fprintf(stderr, "harness: rank %d: HARNESS_RANK_NS='%s' has no process id for this rank\n", rank, s);
        return -1;
    }
    static const char *const kinds[] = {"net", "uts"};
    for (int k = 0; k < 2; k++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/ns/%s", pid, kinds[k]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, 0) != 0) {
            fprintf(stderr, "harness: rank %d: cannot join %s: %s\n", rank, path, strerror(errno));
            if (fd >= 0) close(fd);
            return -1;
        }
        close(fd);
    }
    return 0;
}
