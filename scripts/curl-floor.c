// The least a relay built on libcurl's multi interface can cost: a benchmark floor, not a
// product. relay-bench.sh and relay-cost.sh run it beside nginx and attestd so that the gap
// between attestd and nginx can be split into what libcurl itself costs and what attestd adds.
//
// It does only what any relay must: read an HTTP/1.1 request with a Content-Length body, send it
// upstream through curl (a kept easy handle per client connection, the multi handle's connection
// pool, epoll driven by curl's socket and timer callbacks), and write the reply back with one
// write. No token check, no logging, no limits, no streaming, no chunked bodies, replies up to
// 60 KiB, one request in flight per connection (pipelined ones wait their turn): everything
// attestd does beyond this is on top of the figure it gives.
//
// usage: curl-floor PORT UPSTREAM_URL THREADS API_KEY
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { HEAD_ROOM = 256, MAX_FD = 65536 };
enum kind { UNUSED, LISTENER, CLIENT, UPSTREAM };

typedef struct client {
    int fd;
    int busy;  // a transfer is in flight: a pipelined request waits in `in` until it ends
    CURL *easy;
    size_t in_len, out_len;
    char in[16384], body[16384], out[HEAD_ROOM + 61440];
} client;

typedef struct loop {
    int epoll, listener;
    CURLM *multi;
    long long deadline_ms;  // curl's timer: -1 none
    struct curl_slist *headers;
} loop;

// Each descriptor belongs to one thread; the tables are indexed by descriptor number.
static unsigned char kinds[MAX_FD];
static client *clients[MAX_FD];
static const char *upstream_url;
static int listen_port;

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

static int on_socket(CURL *easy, curl_socket_t fd, int what, void *context, void *assigned) {
    (void)easy;
    loop *l = context;
    if (what == CURL_POLL_REMOVE) {
        if (assigned) epoll_ctl(l->epoll, EPOLL_CTL_DEL, fd, NULL);
        curl_multi_assign(l->multi, fd, NULL);
        kinds[fd] = UNUSED;
        return 0;
    }
    struct epoll_event event = {
        .events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0),
        .data.fd = fd,
    };
    if (assigned) {
        epoll_ctl(l->epoll, EPOLL_CTL_MOD, fd, &event);
    } else {
        kinds[fd] = UPSTREAM;
        epoll_ctl(l->epoll, EPOLL_CTL_ADD, fd, &event);
        curl_multi_assign(l->multi, fd, (void *)1);
    }
    return 0;
}

static int on_timer(CURLM *multi, long timeout_ms, void *context) {
    (void)multi;
    loop *l = context;
    l->deadline_ms = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    return 0;
}

static size_t on_body(char *bytes, size_t size, size_t count, void *context) {
    client *c = context;
    size_t length = size * count;
    if (c->out_len + length > sizeof c->out) return 0;  // too big for the floor: curl fails the transfer
    memcpy(c->out + c->out_len, bytes, length);
    c->out_len += length;
    return length;
}

static void write_all(int fd, const char *bytes, size_t length) {
    while (length > 0) {
        ssize_t n = write(fd, bytes, length);
        if (n > 0) { bytes += n; length -= (size_t)n; continue; }
        if (n < 0 && errno == EAGAIN) { poll(&(struct pollfd){ .fd = fd, .events = POLLOUT }, 1, 1000); continue; }
        return;
    }
}

static void start_request(loop *l, client *c);

static void finish_transfers(loop *l) {
    CURLMsg *message;
    int left;
    while ((message = curl_multi_info_read(l->multi, &left))) {
        if (message->msg != CURLMSG_DONE) continue;
        client *c;
        long status = 502;
        curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, (char **)&c);
        if (message->data.result == CURLE_OK) curl_easy_getinfo(message->easy_handle, CURLINFO_RESPONSE_CODE, &status);
        curl_multi_remove_handle(l->multi, message->easy_handle);
        size_t body = c->out_len - HEAD_ROOM;
        char head[HEAD_ROOM];
        int head_len = snprintf(head, sizeof head,
                                "HTTP/1.1 %ld x\r\ncontent-type: application/json\r\ncontent-length: %zu\r\n\r\n", status, body);
        memcpy(c->out + HEAD_ROOM - head_len, head, (size_t)head_len);
        write_all(c->fd, c->out + HEAD_ROOM - head_len, (size_t)head_len + body);
        c->busy = 0;
        start_request(l, c);  // the next request, if it came pipelined
    }
}

// Starts the transfer for the first complete request in the buffer (one in flight per connection).
static void start_request(loop *l, client *c) {
    if (c->busy) return;
    char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
    if (!end) return;
    size_t head_len = (size_t)(end + 4 - c->in), body_len = 0;
    for (char *line = memchr(c->in, '\n', head_len); line && line < end; line = memchr(line + 1, '\n', (size_t)(end - line))) {
        if (strncasecmp(line + 1, "content-length:", 15) == 0) body_len = strtoul(line + 16, NULL, 10);
    }
    if (body_len > sizeof c->body || c->in_len < head_len + body_len) return;
    if (!c->easy) {
        if (!(c->easy = curl_easy_init())) return;
        curl_easy_setopt(c->easy, CURLOPT_URL, upstream_url);
        curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, l->headers);
        curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, c);
        curl_easy_setopt(c->easy, CURLOPT_PRIVATE, c);
        curl_easy_setopt(c->easy, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c->easy, CURLOPT_POSTFIELDS, c->body);
    }
    memcpy(c->body, c->in + head_len, body_len);
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE, (long)body_len);
    c->in_len -= head_len + body_len;
    memmove(c->in, c->in + head_len + body_len, c->in_len);
    c->out_len = HEAD_ROOM;
    c->busy = curl_multi_add_handle(l->multi, c->easy) == CURLM_OK;
}

static void close_client(loop *l, client *c) {
    if (c->easy) { curl_multi_remove_handle(l->multi, c->easy); curl_easy_cleanup(c->easy); }
    kinds[c->fd] = UNUSED;
    clients[c->fd] = NULL;
    close(c->fd);
    free(c);
}

static void *run_loop(void *api_key_header) {
    loop l = { .epoll = epoll_create1(0), .multi = curl_multi_init(), .deadline_ms = -1 };
    l.headers = curl_slist_append(NULL, api_key_header);
    l.headers = curl_slist_append(l.headers, "content-type: application/json");
    l.headers = curl_slist_append(l.headers, "anthropic-version: 2023-06-01");
    l.headers = curl_slist_append(l.headers, "Expect:");
    curl_multi_setopt(l.multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(l.multi, CURLMOPT_SOCKETDATA, &l);
    curl_multi_setopt(l.multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(l.multi, CURLMOPT_TIMERDATA, &l);

    int one = 1;
    l.listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(l.listener, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    struct sockaddr_in address = { .sin_family = AF_INET, .sin_port = htons((uint16_t)listen_port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (bind(l.listener, (struct sockaddr *)&address, sizeof address) != 0 || listen(l.listener, 4096) != 0) {
        perror("curl-floor: listen");
        exit(1);
    }
    kinds[l.listener] = LISTENER;
    epoll_ctl(l.epoll, EPOLL_CTL_ADD, l.listener, &(struct epoll_event){ .events = EPOLLIN, .data.fd = l.listener });

    struct epoll_event events[256];
    int running;
    for (;;) {
        int wait_ms = l.deadline_ms < 0 ? 1000 : (int)(l.deadline_ms > now_ms() ? l.deadline_ms - now_ms() : 0);
        int count = epoll_wait(l.epoll, events, 256, wait_ms);
        for (int i = 0; i < count; i++) {
            int fd = events[i].data.fd;
            if (kinds[fd] == LISTENER) {
                int accepted;
                while ((accepted = accept4(l.listener, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    client *c = accepted < MAX_FD ? calloc(1, sizeof *c) : NULL;
                    if (!c) { close(accepted); continue; }
                    setsockopt(accepted, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    c->fd = accepted;
                    clients[accepted] = c;
                    kinds[accepted] = CLIENT;
                    epoll_ctl(l.epoll, EPOLL_CTL_ADD, accepted, &(struct epoll_event){ .events = EPOLLIN, .data.fd = accepted });
                }
            } else if (kinds[fd] == CLIENT) {
                client *c = clients[fd];
                ssize_t n = read(fd, c->in + c->in_len, sizeof c->in - c->in_len);
                if (n < 0 && errno == EAGAIN) continue;
                if (n <= 0) { close_client(&l, c); continue; }
                c->in_len += (size_t)n;
                start_request(&l, c);
            } else if (kinds[fd] == UPSTREAM) {
                uint32_t e = events[i].events;
                int flags = (e & EPOLLIN ? CURL_CSELECT_IN : 0) | (e & EPOLLOUT ? CURL_CSELECT_OUT : 0)
                          | (e & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
                curl_multi_socket_action(l.multi, fd, flags, &running);
            }
        }
        if (l.deadline_ms >= 0 && l.deadline_ms <= now_ms()) {
            l.deadline_ms = -1;
            curl_multi_socket_action(l.multi, CURL_SOCKET_TIMEOUT, 0, &running);
        }
        finish_transfers(&l);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: curl-floor PORT UPSTREAM_URL THREADS API_KEY\n");
        return 2;
    }
    listen_port = atoi(argv[1]);
    upstream_url = argv[2];
    int threads = atoi(argv[3]);
    static char api_key_header[512];
    snprintf(api_key_header, sizeof api_key_header, "x-api-key: %s", argv[4]);
    if (threads < 1 || threads > 64) return 2;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    pthread_t thread;
    for (int i = 1; i < threads; i++) pthread_create(&thread, NULL, run_loop, api_key_header);
    run_loop(api_key_header);
    return 0;
}
