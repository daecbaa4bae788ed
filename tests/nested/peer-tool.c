/*
 * peer-tool: the few things tests/nested/scenarios/peers.sh needs in L1 that
 * busybox has not, for driving spore and Firecracker the same way, with the
 * same clock (CLOCK_MONOTONIC, nanoseconds; L1's /proc/timer_list "now at"
 * is the same clock).
 *
 *   peer-tool now
 *       prints the clock.
 *   peer-tool stamp
 *       copies stdin to stdout a line at a time, each prefixed with the clock
 *       at its arrival ("<ns> <line>", carriage returns dropped), unbuffered
 *       (a VMM's console).
 *   peer-tool api SOCK METHOD PATH [BODY]
 *       one HTTP/1.1 request on a Unix socket (what `curl --unix-socket`
 *       does). Prints the body; exits 1 on a status >= 400 (body and status
 *       on stderr). The response is read by its Content-Length: Firecracker's
 *       API server keeps the connection open after a response, so a client
 *       that reads until the server closes (`spore api`) waits forever.
 *   peer-tool until SOCK PATH TEXT TIMEOUT_S
 *       GET PATH every 10 ms until the body contains TEXT.
 *   peer-tool vsock UDS PORT COMMAND TIMEOUT_S
 *       Firecracker's hybrid vsock: connects to UDS, "CONNECT PORT\n", sends
 *       COMMAND, an `echo` of an end marker and `exit` to the guest's command
 *       server (a shell) and prints its reply up to the marker; retries
 *       (every 10 ms) until a complete reply or TIMEOUT_S. The marker, not the
 *       end of the stream, ends a reply: under Firecracker the end of the
 *       stream did not come (20 s) after a complete reply.
 *
 * PEER_V=1: says on stderr why each vsock attempt failed.
 * With PEER_T=FILE in the environment, api/until/vsock append one line to
 * FILE: "<start ns> <end ns> <status|polls|attempts>" (start: the request was
 * sent, or the first poll/attempt; end: the response, or the poll/reply that
 * ended the wait).
 *
 * Built static (musl-gcc -static) by tests/nested/peers.sh, so it runs in L1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("peer-tool: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void record(long long a, long long b, long long n)
{
    const char *f = getenv("PEER_T");
    if (!f || !*f)
        return;
    FILE *fp = fopen(f, "a");
    if (!fp)
        die("cannot open %s: %s", f, strerror(errno));
    fprintf(fp, "%lld %lld %lld\n", a, b, n);
    fclose(fp);
}

static int unix_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        die("socket path too long: %s", path);
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads into buf (growing) until EOF or timeout_ms of silence; returns the
 * length, or -1 on error/timeout. */
struct buf {
    char *p;
    size_t n, cap;
};

static void buf_reserve(struct buf *b, size_t more)
{
    if (b->n + more + 1 <= b->cap)
        return;
    while (b->n + more + 1 > b->cap)
        b->cap = b->cap ? b->cap * 2 : 4096;
    b->p = realloc(b->p, b->cap);
    if (!b->p)
        die("out of memory");
}

/* One read with a timeout: >0 bytes, 0 EOF, -1 error or timeout. */
static ssize_t read_some(int fd, struct buf *b, int timeout_ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    for (;;) {
        int r = poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        break;
    }
    buf_reserve(b, 4096);
    ssize_t r;
    do
        r = read(fd, b->p + b->n, 4096);
    while (r < 0 && errno == EINTR);
    if (r > 0) {
        b->n += (size_t)r;
        b->p[b->n] = 0;
    }
    return r;
}

/* One HTTP request; returns the status, body in *body (NUL-terminated). */
static int http(const char *sock, const char *method, const char *path, const char *body,
                struct buf *out, long long *t_send, long long *t_recv)
{
    int fd = unix_connect(sock);
    if (fd < 0)
        die("connecting to %s: %s", sock, strerror(errno));
    size_t blen = body ? strlen(body) : 0;
    char head[1024];
    int hl;
    if (body)
        hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, blen);
    else
        hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\r\n",
                      method, path);
    if (hl < 0 || (size_t)hl >= sizeof head)
        die("request line too long");
    *t_send = now_ns();
    if (write_all(fd, head, (size_t)hl) < 0 || (blen && write_all(fd, body, blen) < 0))
        die("writing the request to %s: %s", sock, strerror(errno));
    struct buf b = {0};
    char *eoh = NULL;
    while (!(eoh = b.p ? strstr(b.p, "\r\n\r\n") : NULL)) {
        ssize_t r = read_some(fd, &b, 600000);
        if (r <= 0)
            die("%s %s: no complete response header (%zu bytes)", method, path, b.n);
    }
    int status = 0;
    if (sscanf(b.p, "HTTP/%*s %d", &status) != 1)
        die("%s %s: malformed status line", method, path);
    long clen = -1;
    for (char *l = strstr(b.p, "\r\n"); l && l < eoh; l = strstr(l + 2, "\r\n")) {
        if (strncasecmp(l + 2, "Content-Length:", 15) == 0)
            clen = strtol(l + 17, NULL, 10);
    }
    size_t hdr = (size_t)(eoh - b.p) + 4;
    if (clen < 0 && (status == 204 || status == 304 || status < 200))
        clen = 0;
    while (clen < 0 ? 1 : b.n < hdr + (size_t)clen) {
        ssize_t r = read_some(fd, &b, 600000);
        if (r == 0 && clen < 0)
            break;
        if (r <= 0)
            die("%s %s: short response body", method, path);
    }
    *t_recv = now_ns();
    close(fd);
    size_t n = clen < 0 ? b.n - hdr : (size_t)clen;
    out->n = 0;
    buf_reserve(out, n);
    memcpy(out->p, b.p + hdr, n);
    out->n = n;
    out->p[n] = 0;
    free(b.p);
    return status;
}

static int cmd_api(int argc, char **argv)
{
    if (argc < 4 || argc > 5)
        die("usage: peer-tool api SOCK METHOD PATH [BODY]");
    struct buf out = {0};
    long long a, b;
    int st = http(argv[1], argv[2], argv[3], argc == 5 ? argv[4] : NULL, &out, &a, &b);
    record(a, b, st);
    if (st >= 400) {
        fprintf(stderr, "%s %s -> HTTP %d: %s\n", argv[2], argv[3], st, out.p ? out.p : "");
        return 1;
    }
    if (out.n)
        printf("%s\n", out.p);
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int cmd_until(int argc, char **argv)
{
    if (argc != 5)
        die("usage: peer-tool until SOCK PATH TEXT TIMEOUT_S");
    long long start = now_ns(), deadline = start + atoll(argv[4]) * 1000000000LL;
    struct buf out = {0};
    long long polls = 0, a, b;
    for (;;) {
        int st = http(argv[1], "GET", argv[2], NULL, &out, &a, &b);
        polls++;
        if (st < 400 && out.p && strstr(out.p, argv[3])) {
            record(start, b, polls);
            printf("%s\n", out.p);
            return 0;
        }
        if (now_ns() > deadline) {
            fprintf(stderr, "GET %s: no \"%s\" within %s s (HTTP %d): %s\n", argv[2], argv[3],
                    argv[4], st, out.p ? out.p : "");
            return 1;
        }
        sleep_ms(10);
    }
}

static int verbose;
#define WHY(...) (verbose ? fprintf(stderr, __VA_ARGS__) : 0)

/* One vsock attempt: 1 and the reply in out, or 0. */
static int vsock_once(const char *uds, const char *port, const char *cmd, struct buf *out)
{
    int fd = unix_connect(uds);
    if (fd < 0) {
        WHY("connect %s: %s\n", uds, strerror(errno));
        return 0;
    }
    char line[64];
    int n = snprintf(line, sizeof line, "CONNECT %s\n", port);
    out->n = 0;
    if (write_all(fd, line, (size_t)n) < 0)
        goto fail;
    /* The handshake answer: "OK <port>\n". */
    struct buf h = {0};
    while (!(h.p && strchr(h.p, '\n'))) {
        if (read_some(fd, &h, 20000) <= 0) {
            WHY("no handshake answer (%zu bytes: %.*s)\n", h.n, (int)h.n, h.p ? h.p : "");
            free(h.p);
            goto fail;
        }
    }
    if (strncmp(h.p, "OK ", 3) != 0) {
        WHY("handshake answer %s", h.p);
        free(h.p);
        goto fail;
    }
    /* Anything after the handshake line is already the reply. */
    char *rest = strchr(h.p, '\n') + 1;
    size_t rl = h.n - (size_t)(rest - h.p);
    buf_reserve(out, rl);
    memcpy(out->p, rest, rl);
    out->n = rl;
    out->p[rl] = 0;
    free(h.p);
    static const char eor[] = "@@PEER-END-OF-REPLY@@\n";
    static const char tail[] = "\necho @@PEER-END-OF-REPLY@@\nexit\n";
    if (write_all(fd, cmd, strlen(cmd)) < 0 || write_all(fd, tail, sizeof tail - 1) < 0)
        goto fail;
    /* No shutdown(SHUT_WR) here: Firecracker then ended the connection
     * before the guest's reply (EOF, 0 bytes). */
    for (;;) {
        char *end = out->n >= sizeof eor - 1 ? out->p + out->n - (sizeof eor - 1) : NULL;
        if (end && strcmp(end, eor) == 0) {
            out->n = (size_t)(end - out->p);
            *end = 0;
            break;
        }
        ssize_t r = read_some(fd, out, 20000);
        if (r == 0) {
            WHY("EOF before the end of the reply (%zu bytes)\n", out->n);
            goto fail;
        }
        if (r < 0) {
            WHY("reading the reply: nothing for 20 s (%zu bytes)\n", out->n);
            goto fail;
        }
    }
    close(fd);
    return 1;
fail:
    close(fd);
    return 0;
}

static int cmd_vsock(int argc, char **argv)
{
    if (argc != 5)
        die("usage: peer-tool vsock UDS PORT COMMAND TIMEOUT_S");
    long long start = now_ns(), deadline = start + atoll(argv[4]) * 1000000000LL;
    struct buf out = {0};
    long long attempts = 0;
    for (;;) {
        attempts++;
        if (vsock_once(argv[1], argv[2], argv[3], &out)) {
            record(start, now_ns(), attempts);
            fwrite(out.p, 1, out.n, stdout);
            return 0;
        }
        if (now_ns() > deadline) {
            fprintf(stderr, "vsock %s port %s: no reply within %s s (%lld attempts)\n", argv[1],
                    argv[2], argv[4], attempts);
            return 1;
        }
        sleep_ms(10);
    }
}

static int cmd_stamp(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    setvbuf(stdout, NULL, _IONBF, 0);
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        long long t = now_ns();
        char pre[32];
        int pl = snprintf(pre, sizeof pre, "%lld ", t);
        /* A serial console ends its lines with "\r\n": only "\n" is kept. */
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        line[n++] = '\n';
        if (write_all(1, pre, (size_t)pl) < 0 || write_all(1, line, (size_t)n) < 0)
            return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: peer-tool now|stamp|api|until|vsock ...");
    const char *c = argv[1];
    verbose = getenv("PEER_V") && *getenv("PEER_V");
    if (!strcmp(c, "now")) {
        printf("%lld\n", now_ns());
        return 0;
    }
    if (!strcmp(c, "stamp"))
        return cmd_stamp();
    if (!strcmp(c, "api"))
        return cmd_api(argc - 1, argv + 1);
    if (!strcmp(c, "until"))
        return cmd_until(argc - 1, argv + 1);
    if (!strcmp(c, "vsock"))
        return cmd_vsock(argc - 1, argv + 1);
    die("unknown command %s", c);
    return 2;
}
