#ifndef ATTEST_CMICROHTTPD_SHIM_H
#define ATTEST_CMICROHTTPD_SHIM_H
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <microhttpd.h>

/* Swift cannot call C variadic functions, so the few variadic libmicrohttpd
 * entry points the HTTPServer target needs get fixed-signature wrappers. */

/* Starts a daemon whose options all come from an MHD_OPTION_END-terminated
 * array (MHD_OPTION_ARRAY). The port argument is ignored by MHD when the
 * array carries MHD_OPTION_SOCK_ADDR. */
static inline struct MHD_Daemon *
attest_mhd_start_daemon(unsigned int flags,
                        MHD_AccessHandlerCallback handler, void *handler_cls,
                        struct MHD_OptionItem *options)
{
  return MHD_start_daemon(flags, 0, NULL, NULL, handler, handler_cls,
                          MHD_OPTION_ARRAY, options, MHD_OPTION_END);
}

/* The port the daemon is listening on (resolves port 0); 0 if unknown. */
static inline uint16_t
attest_mhd_bind_port(struct MHD_Daemon *daemon)
{
  const union MHD_DaemonInfo *info =
    MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
  return (NULL == info) ? 0 : info->port;
}

/* The peer address of a connection, or NULL. */
static inline const struct sockaddr *
attest_mhd_client_address(struct MHD_Connection *connection)
{
  const union MHD_ConnectionInfo *info =
    MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  return (NULL == info) ? NULL : info->client_addr;
}

/* Formats an MHD log message (MHD_LogCallback hands over a va_list). */
static inline int
attest_mhd_format_log(char *buffer, size_t size, const char *format, va_list ap)
{
  return vsnprintf(buffer, size, format, ap);
}

#endif
