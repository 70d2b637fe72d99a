#ifndef ATTEST_CSQLITE_SHIM_H
#define ATTEST_CSQLITE_SHIM_H
#include <sqlite3.h>
/* SQLITE_TRANSIENT is a cast macro Swift cannot import. */
static inline sqlite3_destructor_type attest_sqlite_transient(void) { return SQLITE_TRANSIENT; }
/* sqlite3_config is variadic, which Swift cannot call. Without memory statistics, SQLite's
   allocator takes no process-wide mutex on every allocation. Only before sqlite3_initialize. */
static inline int attest_sqlite_disable_memstatus(void) { return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); }
#endif
