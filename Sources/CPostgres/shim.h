#ifndef ATTEST_CPOSTGRES_SHIM_H
#define ATTEST_CPOSTGRES_SHIM_H
#include <libpq-fe.h>
#include <poll.h>
/* The PG_DIAG_* field codes are character-literal macros Swift cannot import. */
static inline int attest_pg_diag_sqlstate(void) { return PG_DIAG_SQLSTATE; }
static inline int attest_pg_diag_message_primary(void) { return PG_DIAG_MESSAGE_PRIMARY; }
static inline int attest_pg_diag_message_detail(void) { return PG_DIAG_MESSAGE_DETAIL; }
static inline int attest_pg_diag_constraint_name(void) { return PG_DIAG_CONSTRAINT_NAME; }
#endif
