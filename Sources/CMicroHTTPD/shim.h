#ifndef ATTEST_CMICROHTTPD_SHIM_H
#define ATTEST_CMICROHTTPD_SHIM_H
/* No _GNU_SOURCE here: a header that defines it gives glibc's fd_set another member name,
 * and two C modules that disagree on fd_set cannot be imported by one Swift module. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/ioctl.h>
#ifdef __linux__
#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#endif
#include <microhttpd.h>

/* Swift cannot call C variadic functions, so the few variadic libmicrohttpd
 * entry points the HTTPServer target needs get fixed-signature wrappers. */

/* Starts a daemon whose options all come from an MHD_OPTION_END-terminated
 * array (MHD_OPTION_ARRAY). The port argument is ignored by MHD when the
 * array carries MHD_OPTION_SOCK_ADDR. */
static inline struct MHD_Daemon *
attest_mhd_start_daemon(unsigned int flags,
                        MHD_AcceptPolicyCallback policy, void *policy_cls,
                        MHD_AccessHandlerCallback handler, void *handler_cls,
                        struct MHD_OptionItem *options)
{
  return MHD_start_daemon(flags, 0, policy, policy_cls, handler, handler_cls,
                          MHD_OPTION_ARRAY, options, MHD_OPTION_END);
}

/* The epoll descriptor of a daemon in external-polling epoll mode, or -1. */
static inline int
attest_mhd_epoll_fd(struct MHD_Daemon *daemon)
{
  const union MHD_DaemonInfo *info =
    MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_EPOLL_FD);
  return (NULL == info) ? -1 : info->epoll_fd;
}

/* Connections the daemon holds now, or -1. */
static inline int
attest_mhd_current_connections(struct MHD_Daemon *daemon)
{
  const union MHD_DaemonInfo *info =
    MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  return (NULL == info) ? -1 : (int) info->num_connections;
}

/* The peer address of a connection, or NULL. */
static inline const struct sockaddr *
attest_mhd_client_address(struct MHD_Connection *connection)
{
  const union MHD_ConnectionInfo *info =
    MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  return (NULL == info) ? NULL : info->client_addr;
}

/* The socket of a connection, or -1. Call on the connection's own thread. */
static inline int
attest_mhd_connection_fd(struct MHD_Connection *connection)
{
  const union MHD_ConnectionInfo *info =
    MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  return (NULL == info) ? -1 : info->connect_fd;
}

/* The size of the request head once it is complete, 0 before (or after the connection closed).
 * Connection's own thread only. */
static inline size_t
attest_mhd_request_header_size(struct MHD_Connection *connection)
{
  const union MHD_ConnectionInfo *info =
    MHD_get_connection_info(connection, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
  return (NULL == info) ? 0 : info->header_size;
}

/* The socket context set by the connection-notification callback, or NULL. */
static inline void *
attest_mhd_socket_context(struct MHD_Connection *connection)
{
  const union MHD_ConnectionInfo *info =
    MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return (NULL == info) ? NULL : info->socket_context;
}

/* Formats an MHD log message (MHD_LogCallback hands over a va_list). */
static inline int
attest_mhd_format_log(char *buffer, size_t size, const char *format, va_list ap)
{
  return vsnprintf(buffer, size, format, ap);
}

#ifdef __linux__
/* A tiny epoll wrapper for the server's connection monitor. `struct epoll_event` is packed on
 * x86-64, so Swift never touches it: registrations carry a 64-bit key and waits return keys. */

/* Watches `fd` for the peer closing or resetting (EPOLLRDHUP; EPOLLHUP and EPOLLERR are
 * always reported). Not EPOLLIN: a pipelined request must not look like a disconnect. */
static inline int
attest_watch_add(int epfd, int fd, uint64_t key)
{
  struct epoll_event event;
  memset(&event, 0, sizeof event);
  event.events = EPOLLRDHUP;
  event.data.u64 = key;
  return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event);
}

/* Watches `fd` for readability (the monitor's own wake-up eventfd). */
static inline int
attest_watch_add_readable(int epfd, int fd, uint64_t key)
{
  struct epoll_event event;
  memset(&event, 0, sizeof event);
  event.events = EPOLLIN;
  event.data.u64 = key;
  return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event);
}

static inline int
attest_watch_remove(int epfd, int fd)
{
  struct epoll_event unused;
  memset(&unused, 0, sizeof unused);
  return epoll_ctl(epfd, EPOLL_CTL_DEL, fd, &unused);
}

/* Waits up to `timeout_ms` and stores the keys of ready registrations; returns how many
 * (0 on timeout or EINTR, -1 on other errors). */
static inline int
attest_watch_wait(int epfd, uint64_t *keys, int capacity, int timeout_ms)
{
  struct epoll_event events[64];
  if (capacity > 64) capacity = 64;
  int count = epoll_wait(epfd, events, capacity, timeout_ms);
  if (count < 0) return (errno == EINTR) ? 0 : -1;
  for (int i = 0; i < count; i++) keys[i] = events[i].data.u64;
  return count;
}
#endif

/* Bytes of earlier answers the client has not taken yet: queued in the socket, unsent or
 * unacknowledged (SIOCOUTQ); -1 on error. */
static inline int
attest_unread_bytes(int fd)
{
  int count = 0;
#ifdef __linux__
  if (ioctl(fd, SIOCOUTQ, &count) != 0) return -1;
#endif
  return count;
}

/* Bytes received and not read yet (FIONREAD); -1 on error. */
static inline int
attest_pending_bytes(int fd)
{
  int count = 0;
  if (ioctl(fd, FIONREAD, &count) != 0) return -1;
  return count;
}

#endif
