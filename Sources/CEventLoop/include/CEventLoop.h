#ifndef ATTEST_CEVENTLOOP_H
#define ATTEST_CEVENTLOOP_H
/* What the EventLoops target needs from C: Swift's Glibc module exports neither epoll nor
 * eventfd, prctl is variadic, and a thread-local pointer is cheaper here than a pthread key. */
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

/* The event loop running on the calling thread (an unretained object pointer), or NULL. */
void *attest_event_loop_current(void);
void attest_event_loop_set_current(void *loop);

/* Names the calling thread (at most 15 bytes are kept). */
void attest_event_loop_name_thread(const char *name);

/* epoll_wait into a caller's buffer of descriptors and event masks: `struct epoll_event` is
 * packed on x86-64, so Swift never indexes an array of them. Returns the count, 0 on EINTR,
 * -1 on other errors. */
int attest_event_loop_wait(int epfd, int *fds, uint32_t *masks, int capacity, int timeout_ms);

/* epoll_ctl for a descriptor keyed by itself. */
int attest_event_loop_ctl(int epfd, int op, int fd, uint32_t events);

/* Takes one pending connection, non-blocking and close-on-exec (accept4, which glibc declares
 * only under _GNU_SOURCE: defined in the .c file, never in a module's header); -1 with errno. */
int attest_accept_nonblocking(int listen_fd, struct sockaddr_storage *address, socklen_t *length);
#endif
