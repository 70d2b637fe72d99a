#define _GNU_SOURCE
#include "CEventLoop.h"
#include <errno.h>
#include <string.h>
#include <sys/prctl.h>

static __thread void *current_loop;

void *attest_event_loop_current(void) { return current_loop; }
void attest_event_loop_set_current(void *loop) { current_loop = loop; }

void attest_event_loop_name_thread(const char *name) { prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0); }

int attest_event_loop_wait(int epfd, int *fds, uint32_t *masks, int capacity, int timeout_ms) {
  struct epoll_event events[256];
  if (capacity > 256) capacity = 256;
  int count = epoll_wait(epfd, events, capacity, timeout_ms);
  if (count < 0) return (errno == EINTR) ? 0 : -1;
  for (int i = 0; i < count; i++) {
    fds[i] = events[i].data.fd;
    masks[i] = events[i].events;
  }
  return count;
}

int attest_event_loop_ctl(int epfd, int op, int fd, uint32_t events) {
  struct epoll_event event;
  memset(&event, 0, sizeof event);
  event.events = events;
  event.data.fd = fd;
  return epoll_ctl(epfd, op, fd, &event);
}

int attest_accept_nonblocking(int listen_fd, struct sockaddr_storage *address, socklen_t *length) {
  *length = sizeof(*address);
  return accept4(listen_fd, (struct sockaddr *)address, length, SOCK_NONBLOCK | SOCK_CLOEXEC);
}
